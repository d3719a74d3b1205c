package capabilities

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"marina.dev/marina/provider"
)

// FieldOwner is the field manager of the published ConfigMap.
const FieldOwner = "marina-controller"

// DefaultInterval is how often the publisher looks again at what its
// providers can run (make setup may build a release while it runs).
const DefaultInterval = 30 * time.Second

// The controller writes its one ConfigMap in marina's namespace
// (config/rbac); users read it through marina-capabilities-reader.
// +kubebuilder:rbac:groups="",namespace=marina-system,resources=configmaps,verbs=create
// +kubebuilder:rbac:groups="",namespace=marina-system,resources=configmaps,resourceNames=marina-capabilities,verbs=get;patch

// Publisher keeps the ConfigMap current: it writes it when it starts and
// then every interval, with server-side apply, so that a change (a release
// built or removed, a deleted ConfigMap) shows within an interval and an
// unchanged one costs the API server no write. As a manager Runnable it
// runs on the leader only: the controller that acts is the one that says
// what it can run.
type Publisher struct {
	client   client.Client
	registry *provider.Registry
	interval time.Duration
	log      logr.Logger
}

// NewPublisher publishes what the providers of registry can run, every
// interval (DefaultInterval when zero).
func NewPublisher(c client.Client, registry *provider.Registry, interval time.Duration, log logr.Logger) *Publisher {
	if interval == 0 {
		interval = DefaultInterval
	}
	return &Publisher{client: c, registry: registry, interval: interval, log: log}
}

// Start publishes until ctx ends. A failure is logged and retried at the
// next interval: it must not stop the controllers (a cluster installed by
// an older marina init lacks the Role until marina init runs again).
func (p *Publisher) Start(ctx context.Context) error {
	ticker := time.NewTicker(p.interval)
	defer ticker.Stop()
	var failed string // the last failure logged: a lasting one is logged once
	for {
		if err := p.Publish(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if err.Error() != failed {
				p.log.Error(err, "Cannot publish what the providers can run", "configMap", Namespace+"/"+Name)
				failed = err.Error()
			}
		} else if failed != "" {
			p.log.Info("Published what the providers can run", "configMap", Namespace+"/"+Name)
			failed = ""
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// Publish writes the ConfigMap once.
func (p *Publisher) Publish(ctx context.Context) error {
	caps, err := Of(p.registry)
	if err != nil {
		return err
	}
	data, err := encode(caps)
	if err != nil {
		return fmt.Errorf("encoding the capabilities: %w", err)
	}
	cm := corev1ac.ConfigMap(Name, Namespace).
		WithLabels(map[string]string{"app.kubernetes.io/part-of": "marina"}).
		WithData(data)
	if err := p.client.Apply(ctx, cm, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying ConfigMap %s/%s: %w", Namespace, Name, err)
	}
	return nil
}

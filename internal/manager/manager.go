// Package manager assembles marina's controllers into one controller-runtime
// manager. `marina up` runs it in-process against the embedded management
// plane; `marina controller` runs it against any cluster with leader election.
package manager

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"marina.dev/marina/internal/capabilities"
	"marina.dev/marina/internal/controller/cluster"
	"marina.dev/marina/internal/controller/machine"
	"marina.dev/marina/internal/controller/machinedeployment"
	"marina.dev/marina/internal/controller/machinehealthcheck"
	"marina.dev/marina/internal/controller/machineset"
	"marina.dev/marina/internal/controller/safety"
	"marina.dev/marina/internal/metrics"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/internal/webhook"
	"marina.dev/marina/provider"
)

// Options configure the manager.
type Options struct {
	// LeaderElection makes replicas of the manager take turns; off for the
	// single in-process manager of `marina up`.
	LeaderElection          bool
	LeaderElectionNamespace string
	// MetricsAddr serves Prometheus metrics; "0" disables them.
	MetricsAddr string
	// SecureMetrics serves them over HTTPS to callers the API server
	// authenticates and allows to get /metrics (controller-runtime's
	// filter: a TokenReview and a SubjectAccessReview per new caller).
	SecureMetrics bool
	// HealthAddr serves /healthz and /readyz; "0" disables them.
	HealthAddr string
	// PprofAddr serves Go's /debug/pprof (profiles, goroutine dumps);
	// "" or "0" disables it. It has no authentication: loopback only.
	PprofAddr string
	// Providers make the real machines; the machine controller acts only on
	// the providerSpec kinds they own.
	Providers []provider.Provider
	// ReportUnowned makes this manager report machines whose kind no
	// provider owns; ExternalKinds are owned by provider processes elsewhere.
	ReportUnowned bool
	ExternalKinds []schema.GroupVersionKind
	// Webhook serves marina's admission webhook (internal/webhook) from
	// this manager; nil serves none.
	Webhook *WebhookOptions
	// OrphanGrace is how long a provider machine or endpoint no object
	// names is left before the safety controller removes it (0: its
	// default, 2 minutes).
	OrphanGrace time.Duration
	// WrapClient, for tests only, wraps the client every controller
	// reads and writes through: the crash-point harness (test/crashpoint)
	// counts the writes with it and stops the manager after the k-th.
	WrapClient func(client.Client) client.Client
	// Restartable, for tests only, lets one process build the manager
	// again after the last one stopped (controller names are unique per
	// process otherwise).
	Restartable bool
}

// WebhookOptions say where the admission webhook listens and which serving
// certificate it presents.
type WebhookOptions struct {
	// Host and Port to listen on; "127.0.0.1" keeps it on loopback.
	Host string
	Port int
	// CertDir holds the serving certificate and key, named CertName and
	// KeyName (tls.crt and tls.key when empty). The files are re-read when
	// they change, so a renewed certificate needs no restart.
	CertDir, CertName, KeyName string
}

// managerUser is implemented by a provider that needs the manager: its
// clients, its event recorder.
type managerUser interface {
	SetupWithManager(mgr ctrl.Manager) error
}

// LeaderElectionID names the Lease the replicas compete for.
const LeaderElectionID = "marina-controller-manager"

// Controllers record events in the management plane (config/rbac).
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// The metrics endpoint asks the API server who calls it and whether they
// may (SecureMetrics).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// New builds a manager with every marina controller registered.
func New(ctx context.Context, cfg *rest.Config, opts Options) (ctrl.Manager, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		// client-go's default (5 requests/s, bursts of 10) makes a fleet of
		// hundreds of machines queue behind the client, not the API server:
		// measured with bench/, it capped provisioning at ~1.5 machines/s.
		cfg.QPS, cfg.Burst = 100, 200
	}
	registry, err := provider.NewRegistry(opts.Providers...)
	if err != nil {
		return nil, err
	}
	var webhookServer crwebhook.Server
	if w := opts.Webhook; w != nil {
		webhookServer = crwebhook.NewServer(crwebhook.Options{
			Host: w.Host, Port: w.Port, CertDir: w.CertDir, CertName: w.CertName, KeyName: w.KeyName,
		})
	}
	metricsOpts := metricsserver.Options{BindAddress: opts.MetricsAddr}
	if opts.SecureMetrics {
		metricsOpts.SecureServing = true
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	cacheOpts, err := CacheOptions()
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme.New(),
		Cache:                   cacheOpts,
		LeaderElection:          opts.LeaderElection,
		LeaderElectionID:        LeaderElectionID,
		LeaderElectionNamespace: opts.LeaderElectionNamespace,
		// Stepping down quickly lets a new leader take over without waiting
		// out the lease on a clean shutdown.
		LeaderElectionReleaseOnCancel: true,
		Metrics:                       metricsOpts,
		HealthProbeBindAddress:        opts.HealthAddr,
		PprofBindAddress:              opts.PprofAddr,
		WebhookServer:                 webhookServer,
		NewClient:                     newClient(opts.WrapClient),
		Controller:                    config.Controller{SkipNameValidation: &opts.Restartable},
	})
	if err != nil {
		return nil, fmt.Errorf("creating controller manager: %w", err)
	}
	// A provider that reads the management plane (the SSH provider reads
	// the Secrets and ConfigMaps its machines name) or records events gets
	// the manager first.
	for _, p := range opts.Providers {
		if s, ok := p.(managerUser); ok {
			if err := s.SetupWithManager(mgr); err != nil {
				return nil, fmt.Errorf("setting provider %s up: %w", p.Name(), err)
			}
		}
	}
	if err := setupControllers(ctx, mgr, registry, opts); err != nil {
		return nil, err
	}
	// The CLI asks the controller, not its own host, what it can run.
	if err := mgr.Add(capabilities.NewPublisher(mgr.GetClient(), registry, 0, mgr.GetLogger().WithName("capabilities"))); err != nil {
		return nil, fmt.Errorf("adding the capabilities publisher: %w", err)
	}
	if err := metrics.RegisterMachines(mgr.GetCache()); err != nil {
		return nil, fmt.Errorf("registering the machine metrics: %w", err)
	}
	if opts.Webhook != nil {
		if err := webhook.Setup(mgr, webhook.Options{Providers: registry, ExternalKinds: opts.ExternalKinds}); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// newClient is controller-runtime's client, wrapped when wrap is set.
func newClient(wrap func(client.Client) client.Client) client.NewClientFunc {
	return func(cfg *rest.Config, opts client.Options) (client.Client, error) {
		c, err := client.New(cfg, opts)
		if err != nil || wrap == nil {
			return c, err
		}
		return wrap(c), nil
	}
}

// setupControllers registers each controller with the manager. Controllers
// arrive with their issues; this list is the one place they are wired in.
// CacheOptions are what the manager's cache holds.
//
// Secrets: only those labelled clusterv1.ClusterNameLabel (every Secret
// marina makes for a cluster, and the kubeconfig Secret a user makes for a
// cluster someone else runs), not every Secret of the management plane
// (issue 24, finding 6): a cluster-wide watch would put each tenant's
// Secrets in marina's memory. Secrets a user names in a spec (a CA, an
// external etcd's client certificate) are read uncached when needed.
//
// No controller reads managedFields, and they are a large part of every
// cached Machine: a fleet of 1,010 held them all.
func CacheOptions() (cache.Options, error) {
	secrets, err := remote.CachedSecrets()
	if err != nil {
		return cache.Options{}, err
	}
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject:         map[client.Object]cache.ByObject{&corev1.Secret{}: {Label: secrets}},
	}, nil
}

func setupControllers(ctx context.Context, mgr ctrl.Manager, registry *provider.Registry, opts Options) error {
	clusters, err := cluster.SetupWithManager(mgr, cluster.Options{
		Providers:               registry,
		Etcd:                    etcdDialer,
		MaxConcurrentReconciles: 4,
	})
	if err != nil {
		return err
	}
	if _, err := machine.SetupWithManager(ctx, mgr, machine.Options{
		Providers:     registry,
		ReportUnowned: opts.ReportUnowned,
		ExternalKinds: opts.ExternalKinds,
		// Machine passes wait on providers, workload API servers and the
		// management API server, not on this process: a fleet of 1,010
		// machines queued behind 10 workers, and with 32 a goroutine dump
		// found 15 waiting on machine status writes, 7 on workload API
		// servers.
		MaxConcurrentReconciles: 64,
		ControlPlaneBootstrap:   clusters.ControlPlaneBootstrap,
	}); err != nil {
		return err
	}
	if _, err := machineset.SetupWithManager(mgr, machineset.Options{MaxConcurrentReconciles: 4}); err != nil {
		return err
	}
	if _, err := machinedeployment.SetupWithManager(mgr, machinedeployment.Options{MaxConcurrentReconciles: 4}); err != nil {
		return err
	}
	if _, err := machinehealthcheck.SetupWithManager(ctx, mgr, machinehealthcheck.Options{MaxConcurrentReconciles: 2}); err != nil {
		return err
	}
	if err := safety.SetupWithManager(mgr, safety.Options{Providers: registry, Grace: opts.OrphanGrace}); err != nil {
		return err
	}
	return nil
}

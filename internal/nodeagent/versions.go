package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/manifest"
	"marina.dev/marina/internal/nodeagent/sandbox"
)

// kubelet is the kubelet version the agent reports; an in-place upgrade
// (its Node's desired versions) changes it while the agent runs.
type kubelet struct {
	mu      sync.Mutex
	version string
}

func (k *kubelet) get() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.version
}

// set reports whether the version changed.
func (k *kubelet) set(v string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	changed := v != k.version
	k.version = v
	return changed
}

// EncodeDesiredVersions is the value of the annotation
// cluster.marina.dev/desired-versions that asks a machine's agent to run v.
func EncodeDesiredVersions(v sandbox.Versions) (string, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encoding the desired versions: %w", err)
	}
	return string(data), nil
}

// decodeDesiredVersions reads the annotation's value.
func decodeDesiredVersions(raw string) (sandbox.Versions, error) {
	var v sandbox.Versions
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return v, fmt.Errorf("annotation %s is not the JSON of the desired versions: %w", clusterv1.DesiredVersionsAnnotation, err)
	}
	return v, nil
}

// desiredRetry is how long after a failed attempt to apply the desired
// versions the agent tries again, while its Node does not change.
const desiredRetry = time.Second

// watchDesiredVersions applies the desired versions the machine controller
// writes on the agent's own Node (M12) whenever they change, until ctx
// ends. It watches that one Node (a field selector on its name: all the
// Node authorizer lets a node list or watch), so the change arrives as
// soon as it is written, with no polling. Each new value is first recorded
// in the sandbox (sandbox.DesiredVersionsFile), then applied: a
// control-plane component whose version changed gets a new manifest, which
// the supervisor sees within a second and restarts that component alone
// with the other binary; a new kubelet version is reported in the Node's
// status at once. A Node without the annotation (one not yet annotated, or
// re-created) changes nothing: what runs keeps running.
func (a *agent) watchDesiredVersions(ctx context.Context) {
	factory := informers.NewSharedInformerFactoryWithOptions(a.cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", a.boot.NodeName).String()
	}))
	nodes := factory.Core().V1().Nodes().Informer()
	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(_, _ any) { notify() },
	}); err != nil {
		a.log.Error(err, "Watching the node's desired versions failed")
		return
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()

	applied := "" // the annotation last applied in full
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-retry:
		}
		retry = nil
		obj, ok, err := nodes.GetStore().GetByKey(a.boot.NodeName)
		if err != nil || !ok {
			continue
		}
		raw, ok := obj.(*corev1.Node).Annotations[clusterv1.DesiredVersionsAnnotation]
		if !ok || raw == applied {
			continue
		}
		v, err := decodeDesiredVersions(raw)
		if err != nil {
			// Not marina's writing: nothing to retry until it changes.
			a.log.Error(err, "Ignoring the node's desired versions")
			applied = raw
			continue
		}
		if err := a.applyDesired(ctx, v); err != nil {
			a.log.Error(err, "Applying the node's desired versions failed, retrying", "after", desiredRetry)
			retry = time.After(desiredRetry)
			continue
		}
		applied = raw
	}
}

// applyDesired records the desired versions v in the sandbox, then
// applies them. The record comes first: an agent killed after it, before
// the component restarted, starts the components at the new versions; one
// killed before it reads the annotation again.
func (a *agent) applyDesired(ctx context.Context, v sandbox.Versions) error {
	if err := sandbox.WriteVersions(a.dir, v); err != nil {
		return fmt.Errorf("recording the desired versions: %w", err)
	}
	if a.cp != nil {
		if err := a.cp.setVersions(v); err != nil {
			return fmt.Errorf("applying the control-plane versions: %w", err)
		}
	}
	if v.Kubelet != "" && a.kubelet.set(v.Kubelet) {
		a.log.Info("Kubelet version changed", "version", v.Kubelet)
		if _, err := a.postStatus(ctx); err != nil && ctx.Err() == nil {
			// keepStatus posts it on its next pass.
			a.log.Error(err, "Posting node status failed")
		}
	}
	return nil
}

// setVersions writes the manifest of each component whose version or
// settings differ from what it was last given, and no other.
func (cp *controlPlane) setVersions(v sandbox.Versions) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if v.ControlPlane == cp.machine.Overrides && reflect.DeepEqual(v.Settings, cp.machine.SettingsByVersion) {
		return nil
	}
	m := *cp.machine
	m.Overrides, m.SettingsByVersion = v.ControlPlane, v.Settings
	bundle, err := bootstrap.ControlPlane(&m, time.Now())
	if err != nil {
		return fmt.Errorf("making the manifests for %+v: %w", v.ControlPlane, err)
	}
	old, err := bootstrap.ControlPlane(cp.machine, time.Now())
	if err != nil {
		return err
	}
	for name, man := range bundle.Manifests {
		if reflect.DeepEqual(old.Manifests[name], man) {
			continue
		}
		if err := manifest.Write(m.Dir, name, man); err != nil {
			return err
		}
		cp.log.Info("Component moves to another version", "component", name, "version", man.Version)
	}
	cp.machine = &m
	return nil
}

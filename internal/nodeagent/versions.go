package nodeagent

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/desiredversions"
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
//
// A control-plane machine watches through its own API server and through
// the cluster's endpoint: its own one is down while it restarts, and stays
// down when its new version cannot start, which only a rollback read
// through the others cures. The newer of the two views (by
// resourceVersion: one etcd serves both) is the one applied.
func (a *agent) watchDesiredVersions(ctx context.Context) {
	clients := []kubernetes.Interface{a.cs}
	if a.cp != nil && a.cp.viaEndpoint != nil {
		clients = append(clients, a.cp.viaEndpoint)
	}
	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	var stores []cache.Store
	for _, cs := range clients {
		factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", a.boot.NodeName).String()
		}))
		nodes := factory.Core().V1().Nodes().Informer()
		if _, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { notify() },
			UpdateFunc: func(_, _ any) { notify() },
		}); err != nil {
			a.log.Error(err, "Watching the node's desired versions failed")
			return
		}
		factory.Start(ctx.Done())
		defer factory.Shutdown()
		stores = append(stores, nodes.GetStore())
	}

	var applied *corev1.Node // the Node whose annotation was last applied in full
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-retry:
		}
		retry = nil
		node := newest(stores, a.boot.NodeName)
		if node == nil || (applied != nil && newerRV(applied.ResourceVersion, node.ResourceVersion)) {
			continue // nothing yet, or a view older than what was applied
		}
		raw, ok := node.Annotations[clusterv1.DesiredVersionsAnnotation]
		if !ok || (applied != nil && raw == applied.Annotations[clusterv1.DesiredVersionsAnnotation]) {
			if applied != nil {
				applied = node
			}
			continue
		}
		v, err := desiredversions.Decode(raw)
		if err != nil {
			// Not marina's writing: nothing to retry until it changes.
			a.log.Error(err, "Ignoring the node's desired versions")
			applied = node
			continue
		}
		if err := a.applyDesired(ctx, v); err != nil {
			a.log.Error(err, "Applying the node's desired versions failed, retrying", "after", desiredRetry)
			retry = time.After(desiredRetry)
			continue
		}
		applied = node
	}
}

// newest is the node name as the most recent of the stores sees it; nil
// when none has it yet.
func newest(stores []cache.Store, name string) *corev1.Node {
	var out *corev1.Node
	for _, s := range stores {
		obj, ok, err := s.GetByKey(name)
		if err != nil || !ok {
			continue
		}
		n := obj.(*corev1.Node)
		if out == nil || newerRV(n.ResourceVersion, out.ResourceVersion) {
			out = n
		}
	}
	return out
}

// newerRV: resourceVersion a is later than b. They are etcd revisions,
// comparable here because every API server of the cluster reads the same
// etcd; one that is not a number is never newer.
func newerRV(a, b string) bool {
	x, errA := strconv.ParseUint(a, 10, 64)
	y, errB := strconv.ParseUint(b, 10, 64)
	return errA == nil && errB == nil && x > y
}

// applyDesired records the desired versions v in the sandbox, then
// applies them. The record comes first: an agent killed after it, before
// the component restarted, starts the components at the new versions; one
// killed before it reads the annotation again.
func (a *agent) applyDesired(ctx context.Context, v desiredversions.Versions) error {
	if err := sandbox.WriteVersions(a.dir, v); err != nil {
		return fmt.Errorf("recording the desired versions: %w", err)
	}
	if a.cp != nil {
		if err := a.cp.setVersions(v); err != nil {
			return fmt.Errorf("applying the control-plane versions: %w", err)
		}
	}
	if a.real != nil && v.Kubelet != "" {
		if err := a.real.setKubelet(v.Kubelet); err != nil {
			return fmt.Errorf("moving the kubelet to %s: %w", v.Kubelet, err)
		}
		a.kubelet.set(v.Kubelet)
		return nil
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
func (cp *controlPlane) setVersions(v desiredversions.Versions) error {
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

package nodeagent

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"time"

	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/manifest"
	"marina.dev/marina/internal/nodeagent/sandbox"
)

// kubelet is the kubelet version the agent reports; an in-place upgrade
// (the sandbox's versions file) changes it while the agent runs.
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

// watchVersions applies the sandbox's versions file whenever it changes
// (M12): a control-plane component whose version changed gets a new
// manifest, which the supervisor sees within a second and restarts that
// component alone with the other binary; a new kubelet version is reported
// in the Node's status at once. It looks at the file every second.
func (a *agent) watchVersions(ctx context.Context) {
	file := modWatch{path: filepath.Join(a.dir, sandbox.VersionsFile)}
	apply := func(ctx context.Context) {
		if !file.changed() {
			return
		}
		v, err := sandbox.ReadVersions(a.dir)
		if err != nil {
			a.log.Error(err, "Reading the versions file failed")
			file.retry()
			return
		}
		if a.cp != nil {
			if err := a.cp.setVersions(v); err != nil {
				a.log.Error(err, "Applying the control-plane versions failed")
				file.retry()
			}
		}
		if v.Kubelet != "" && a.kubelet.set(v.Kubelet) {
			a.log.Info("Kubelet version changed", "version", v.Kubelet)
			if _, err := a.postStatus(ctx); err != nil && ctx.Err() == nil {
				a.log.Error(err, "Posting node status failed")
			}
		}
	}
	apply(ctx)
	every(ctx, time.Second, 0, apply)
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

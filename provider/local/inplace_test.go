package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/desiredversions"
	"marina.dev/marina/internal/manifest"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/provider"
	"marina.dev/marina/tools"
)

// The chicken and egg of issue 26: the API server of a cluster's only
// control-plane machine moves to another version because its agent read
// the new version through that very API server, from its own Node. Staging
// writes nothing into the sandbox; only the API server restarts; and after
// a power cut the agent starts the API server at the new version at once,
// from its own record, before any API server could tell it.
func TestLoneControlPlaneUpgradesItsAPIServerThroughItself(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a control plane")
	}
	binDir := controlPlaneBinaries(t)
	pins := tools.Pinned()
	if len(pins.Kube) < 2 {
		t.Skip("one Kubernetes release is pinned: nothing to upgrade to")
	}
	from, to, etcdVersion := pins.Kube[0], pins.NewestKube(), pins.Etcd
	if _, err := os.Stat(filepath.Join(binDir, "kube-apiserver-"+from)); err != nil {
		t.Skipf("%s is not built: run make setup", from)
	}
	ctx := t.Context()
	set := newClusterPKI(t)
	p := newControlPlaneProvider(t, binDir)
	req := controlPlaneRequest(t, "cp-0", set, from, nil)
	inst, err := p.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	dir := p.sandboxDir(req.UID)
	dumpOnFailure(t, dir)
	admin := adminClientFor(t, set, inst.Addresses[0].Address)
	old := clusterv1.ComponentVersions{APIServer: from, ControllerManager: from, Scheduler: from, Etcd: etcdVersion}
	eventually(t, 90*time.Second, "the API server ready and the Node reporting "+from, func() error {
		if err := ready(ctx, admin); err != nil {
			return err
		}
		return checkControlPlaneNode(ctx, admin, req, inst, old)
	})
	others := map[string][]byte{}
	for _, name := range []string{bootstrap.Etcd, bootstrap.ControllerManager, bootstrap.Scheduler} {
		if others[name], err = os.ReadFile(manifest.Path(dir, name)); err != nil {
			t.Fatal(err)
		}
	}

	want := old
	want.APIServer = to
	if err := p.StageVersions(ctx, req.UID, provider.Versions{ControlPlane: clusterv1.ComponentVersions{APIServer: "v1.99.0"}}); !provider.IsInvalidSpec(err) ||
		!strings.Contains(err.Error(), "kube-apiserver-v1.99.0") {
		t.Errorf("staging a version that was not built: %v, want an invalid spec naming kube-apiserver-v1.99.0", err)
	}
	if err := p.StageVersions(ctx, req.UID, provider.Versions{Kubelet: from, ControlPlane: want}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"versions.json", sandbox.DesiredVersionsFile} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("staging wrote %s into the sandbox (%v): the machine learns its versions from its Node", name, err)
		}
	}

	raw, err := desiredversions.Encode(desiredversions.Versions{Kubelet: from, ControlPlane: want})
	if err != nil {
		t.Fatal(err)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{clusterv1.DesiredVersionsAnnotation: raw}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Nodes().Patch(ctx, req.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, "the API server back at "+to+" and reported", func() error {
		if err := ready(ctx, admin); err != nil {
			return err
		}
		return checkControlPlaneNode(ctx, admin, req, inst, want)
	})
	// The others keep their manifests, so the supervisor leaves them be
	// (a lone controller manager may still restart on its own: it loses
	// its leader lease while the only API server restarts).
	for name, before := range others {
		if after, err := os.ReadFile(manifest.Path(dir, name)); err != nil || string(after) != string(before) {
			t.Errorf("the manifest of %s changed with an upgrade of the API server alone (%v)", name, err)
		}
	}

	// A power cut: every process of the machine dies at once. The agent
	// starts again with no API server to read: the first API server it
	// starts runs the version it recorded.
	for _, pid := range processesMentioning(dir) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	eventually(t, 30*time.Second, "the machine stopped, nothing of it running", func() error {
		if inst, err := p.Get(ctx, req.UID); err != nil || inst.State != provider.InstanceStopped {
			return fmt.Errorf("%v, %v", inst, err)
		}
		if pids := processesMentioning(dir); len(pids) > 0 {
			return fmt.Errorf("processes %v still run", pids)
		}
		return nil
	})
	if inst, err := p.Start(ctx, req.UID, nil); err != nil || inst.State != provider.InstanceRunning {
		t.Fatalf("Start = %v, %v", inst, err)
	}
	first := ""
	for deadline := time.Now().Add(60 * time.Second); first == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, pid := range processesMentioning(dir) {
			args, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if bin, _, _ := strings.Cut(string(args), "\x00"); strings.HasPrefix(filepath.Base(bin), "kube-apiserver-") {
				first = filepath.Base(bin)
			}
		}
	}
	if first != "kube-apiserver-"+to {
		t.Errorf("the first API server after the power cut runs %q, want kube-apiserver-%s", first, to)
	}
	eventually(t, 90*time.Second, "the machine back at "+to+" after the power cut", func() error {
		if err := ready(ctx, admin); err != nil {
			return err
		}
		return checkControlPlaneNode(ctx, admin, req, inst, want)
	})
}

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/loadbalancer"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/internal/prober"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider/local"
)

// marina move (issue 27): examples/minimal and examples/workers on one
// marina up are handed to a second marina up on the same host, over the
// same machine directory. A prober through the workload cluster's
// endpoint sees no failed request; no sandbox, agent or balancer is made
// again; the target's controller takes every machine over (it records
// itself as their manager), shows the cluster Ready and scales the
// workers; nothing of marina's is left on the source, and neither plane's
// orphan sweep removes the machines (the source's removes canaries of its
// own meanwhile). Killed halfway (the test-only stop after k writes), the
// move run again finishes the same.
func TestMoveHandsTheClustersToAnotherPlane(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		stopAfter int // writes before the first run stops; 0: it does not
	}{
		{name: "killed halfway", stopAfter: 20},
		{name: "in one go"},
	} {
		t.Run(tc.name, func(t *testing.T) { testMove(t, tc.stopAfter) })
	}
}

// orphanGrace is both planes' --orphan-grace.
const orphanGrace = 30 * time.Second

func testMove(t *testing.T, stopAfter int) {
	ctx := context.Background()
	// A short orphan grace, so that the sweeps below judge the moved
	// machines within the test.
	srcDir := t.TempDir()
	src := startUp(t, srcDir, "--orphan-grace", orphanGrace.String())
	root := filepath.Join(srcDir, "machines")
	t.Cleanup(func() { stopAgents(t, root) })
	sc := mgmtClient(t, srcDir)
	src.applyExample(t, "minimal")
	src.applyExample(t, "workers")
	key := types.NamespacedName{Namespace: "default", Name: "minimal"}
	testenv.Eventually(t, 6*time.Minute, "cluster minimal Ready with its 6 machines Running", func() error { return clusterReady(ctx, sc, key, 6) })

	tgtDir := t.TempDir()
	tgt := startUp(t, tgtDir, "--machines-dir", root, "--orphan-grace", orphanGrace.String())
	tc := mgmtClient(t, tgtDir)

	before := fleet(t, root)
	cfg := workloadConfig(t, ctx, sc, key)
	cfg.QPS, cfg.Burst = 200, 400
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	probe, err := prober.Start(ctx, cs, "default", 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			probe.Stop()
		}
	}()

	args := []string{"move", "--kubeconfig", filepath.Join(src.stateDir, "admin.kubeconfig"),
		"--to-kubeconfig", filepath.Join(tgtDir, "admin.kubeconfig"), "-n", "default", "--timeout", "4m"}
	start := time.Now()
	if stopAfter > 0 {
		cmd := exec.Command(marinaBin, args...)
		cmd.Env = append(os.Environ(), fmt.Sprintf("MARINA_MOVE_STOP_AFTER_WRITES=%d", stopAfter))
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "stopped after") {
			t.Fatalf("marina move with a stop after %d writes: %v\n%s", stopAfter, err, out)
		}
		t.Logf("first run, stopped:\n%s", out)
	}
	out, err := exec.Command(marinaBin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("marina move: %v\n%s", err, out)
	}
	t.Logf("marina move took %s:\n%s", time.Since(start).Round(time.Second), out)
	// Canaries: a sandbox and an endpoint the source manages and no object
	// names, which the source's orphan sweep removes after its grace
	// (orphanGrace). Their names sort last, and a sweep removes in name order,
	// machines before endpoints: once both are gone, the sweep has judged
	// the moved machines and endpoint too, unknown to it for longer.
	srcNS := &corev1.Namespace{}
	if err := sc.Get(ctx, client.ObjectKey{Name: "kube-system"}, srcNS); err != nil {
		t.Fatal(err)
	}
	name := "ffffffff-ffff-4fff-bfff-" + string(uuid.NewUUID())[24:]
	canaries := []string{filepath.Join(root, name), filepath.Join(root, ".endpoints", name)}
	for _, dir := range canaries {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, local.ManagerFile), []byte(srcNS.UID), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	canaryAt := time.Now()

	// Nothing of marina's is left on the source.
	for _, l := range []client.ObjectList{&clusterv1.ClusterList{}, &clusterv1.MachineDeploymentList{}, &clusterv1.MachineSetList{}, &clusterv1.MachineList{}} {
		if err := sc.List(ctx, l, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		if n := meta.LenList(l); n != 0 {
			t.Errorf("%d %T left on the source", n, l)
		}
	}
	var secrets corev1.SecretList
	if err := sc.List(ctx, &secrets, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets.Items {
		if strings.HasPrefix(s.Name, "minimal-") {
			t.Errorf("Secret %s left on the source", s.Name)
		}
	}

	// The target took every machine over: the same sandboxes, agents and
	// balancer, now managed by the target plane.
	ns := &corev1.Namespace{}
	if err := tc.Get(ctx, client.ObjectKey{Name: "kube-system"}, ns); err != nil {
		t.Fatal(err)
	}
	after := fleet(t, root)
	if !equalFleet(before, after) {
		t.Errorf("sandboxes or processes changed during the move:\nbefore %v\nafter  %v", before, after)
	}
	for dir := range after {
		if m := manager(root, dir); m != string(ns.UID) {
			t.Errorf("%s is managed by %q, want the target plane %q", dir, m, ns.UID)
		}
	}
	var machines clusterv1.MachineList
	if err := tc.List(ctx, &machines, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	for _, m := range machines.Items {
		if m.Annotations[clusterv1.MovedFromAnnotation] == "" || m.Status.ObservedGeneration != m.Generation || !slices.Contains(m.Finalizers, clusterv1.MachineFinalizer) {
			t.Errorf("machine %s is not the target's: annotations %v, observedGeneration %d/%d, finalizers %v",
				m.Name, m.Annotations, m.Status.ObservedGeneration, m.Generation, m.Finalizers)
		}
	}

	// marina describe on the target shows the cluster Ready.
	desc, err := tgt.marinaErr("describe", "cluster", "minimal", "-o", "json")
	if err != nil {
		t.Fatalf("marina describe on the target: %v\n%s", err, desc)
	}
	var tree struct {
		Ready string `json:"ready"`
	}
	if err := json.Unmarshal([]byte(desc), &tree); err != nil || tree.Ready != "True" {
		t.Errorf("marina describe on the target: ready %q (%v)\n%s", tree.Ready, err, desc)
	}

	// The target scales the workers.
	if out, err := tgt.kubectl(t, "scale", "md/minimal-workers", "--replicas=4"); err != nil {
		t.Fatalf("kubectl scale on the target: %v\n%s", err, out)
	}
	testenv.Eventually(t, 4*time.Minute, "7 machines Running on the target", func() error { return machinesRunning(ctx, tc, 7) })
	if now := fleet(t, root); len(now) != len(before)+1 {
		t.Errorf("%d sandboxes and endpoints after the scale, want %d", len(now), len(before)+1)
	}

	// Neither plane's orphan sweep takes the other's machines.
	testenv.Eventually(t, 5*time.Minute, "the source's sweep to remove its canaries", func() error {
		for _, dir := range canaries {
			if _, err := os.Stat(dir); err == nil {
				return fmt.Errorf("%s still there", dir)
			}
		}
		return nil
	})
	t.Logf("the source's sweep removed its canaries %s after they were made", time.Since(canaryAt).Round(time.Second))
	now := fleet(t, root)
	for dir, pid := range before {
		if now[dir] != pid {
			t.Errorf("%s: pid %d after the sweeps, was %d", dir, now[dir], pid)
		}
	}

	res := probe.Stop()
	stopped = true
	t.Logf("prober through the endpoint: %d requests (%.0f/s), %d failed", res.Requests, res.Rate(), res.Failures)
	for _, e := range res.Errors {
		t.Log(e)
	}
	if res.Failures != 0 {
		t.Errorf("%d of %d requests through the endpoint failed during the move, want 0", res.Failures, res.Requests)
	}
}

// fleet maps each machine's sandbox and each endpoint directory under
// root to the PID running it.
func fleet(t *testing.T, root string) map[string]int {
	t.Helper()
	p, err := local.New(local.Options{Root: root, AgentCommand: []string{marinaBin, "node-agent"}})
	if err != nil {
		t.Fatal(err)
	}
	uids, err := p.UIDs()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, uid := range uids {
		if _, err := os.Stat(filepath.Join(root, string(uid), sandbox.BootstrapFile)); err != nil {
			continue // not a machine: the canary
		}
		pid, err := p.AgentPID(uid)
		if err != nil {
			t.Fatalf("machine %s: %v", uid, err)
		}
		out[string(uid)] = pid
	}
	endpoints, err := p.EndpointUIDs()
	if err != nil {
		t.Fatal(err)
	}
	for _, uid := range endpoints {
		pid, err := readPID(filepath.Join(root, ".endpoints", string(uid), loadbalancer.PIDFile))
		if errors.Is(err, fs.ErrNotExist) {
			continue // no balancer ever ran: the canary
		}
		if err != nil {
			t.Fatalf("endpoint %s: %v", uid, err)
		}
		out[".endpoints/"+string(uid)] = pid
	}
	return out
}

func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var pid int
	_, err = fmt.Sscan(string(b), &pid)
	return pid, err
}

func equalFleet(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v || v == 0 {
			return false
		}
	}
	return true
}

func manager(root, dir string) string {
	b, _ := os.ReadFile(filepath.Join(root, dir, local.ManagerFile))
	return strings.TrimSpace(string(b))
}

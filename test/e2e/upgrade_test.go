package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/prober"
	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/internal/testenv"
)

const (
	upgradeFrom = "v1.36.3"
	upgradeTo   = "v1.37.2"
)

// examples/upgrade (issue: the canonical upgrade flow, M11, M12, M13): three
// control-plane machines with stacked etcd and three workers move from the
// older release make setup builds to the newer one InPlace, while a prober
// sends 30 requests a second through the endpoint, and marina up is killed
// and restarted mid-way. Every API server moves before any controller
// manager, every controller manager before any scheduler, as the machines'
// status reports; no request fails. The workers run a real kubelet, and
// the first app of examples/workload answers at their NodePort throughout
// (asked as a load balancer would: only at Nodes that are Ready, not
// cordoned and whose kube-proxy says healthy): no request fails either,
// and every Node ends with a v1.37.2 kubelet, as the Nodes and the running
// processes say (issue 32).
func TestUpUpgradesInPlaceWithoutAFailedRequest(t *testing.T) {
	t.Parallel()
	takeTurnUpgrading(t)
	requireRealWorkers(t)
	u, root, c := startUpWithClient(t)
	ctx := context.Background()
	u.applyExample(t, "upgrade")
	key := types.NamespacedName{Namespace: "default", Name: "upgrade"}
	waitControlPlane(t, ctx, c, key, 3, 8*time.Minute)
	waitWorkers(t, ctx, c, key, 3, upgradeFrom, 4*time.Minute)

	cfg := workloadConfig(t, ctx, c, key)
	cfg.QPS, cfg.Burst = 200, 400
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	testenv.Eventually(t, time.Minute, "every control-plane machine reporting "+upgradeFrom, func() error {
		for _, m := range controlPlaneMachines(t, ctx, c, key) {
			if v := m.Status.Versions.ControlPlane; v == nil || v.APIServer != upgradeFrom {
				return fmt.Errorf("machine %s reports %+v", m.Name, v)
			}
		}
		return nil
	})

	t.Run("marina upgrade plan lists the steps and changes nothing", func(t *testing.T) {
		out := u.marina(t, "upgrade", "plan", key.Name, "--to", upgradeTo)
		for _, want := range []string{"from v1.36.3 to v1.37.2 (InPlace): 13 steps", "  1  kube-apiserver on upgrade-cp-0: v1.36.3 → v1.37.2",
			"  4  kube-controller-manager on upgrade-cp-0", " 13  roll the workers to v1.37.2"} {
			if !strings.Contains(out, want) {
				t.Errorf("marina upgrade plan does not say %q:\n%s", want, out)
			}
		}
		if out, err := u.marinaErr("upgrade", "plan", key.Name, "--to", "v1.38.0"); err == nil || !strings.Contains(out, "skips a minor version") {
			t.Errorf("a plan skipping a minor version was not refused: %v\n%s", err, out)
		}
		cluster := &clusterv1.Cluster{}
		if err := c.Get(ctx, key, cluster); err != nil || cluster.Spec.ControlPlane.Version != upgradeFrom || cluster.Status.Upgrade != nil {
			t.Errorf("the plan changed the cluster: %v %+v", err, cluster.Spec.ControlPlane.Version)
		}
	})

	// A new API server that cannot start (a flag it does not know, given
	// with the new version) halts the upgrade after the first machine;
	// the other two keep serving; rollback restores the first.
	t.Run("a failing step halts, the cluster stays writable, rollback restores it", func(t *testing.T) {
		bad := fmt.Sprintf(`{"spec":{"controlPlane":{"version":%q,"upgradeStrategy":{"stepTimeout":"20s"},"components":{"apiServer":{"extraArgs":{"no-such-flag":"1"}}}}}}`, upgradeTo)
		if out, err := u.kubectl(t, "patch", "cluster", key.Name, "--type=merge", "-p", bad); err != nil {
			t.Fatalf("kubectl patch: %v\n%s", err, out)
		}
		cond := waitUpgradeReason(t, ctx, c, key, clusterv1.ClusterUpgradeStepTimeoutReason, 3*time.Minute)
		if !strings.Contains(cond.Message, "kube-apiserver on machine upgrade-cp-0") {
			t.Errorf("the halt does not name the machine and component: %s", cond.Message)
		}
		for _, m := range controlPlaneMachines(t, ctx, c, key)[1:] {
			if v := m.Status.Versions.ControlPlane; v == nil || v.APIServer != upgradeFrom || !meta.IsStatusConditionTrue(m.Status.Conditions, clusterv1.MachineNodeReadyCondition) {
				t.Errorf("machine %s was touched or is not ready after the halt: %+v", m.Name, m.Status.Versions)
			}
		}
		for i := range 5 {
			if err := writeOnce(ctx, cs, i); err != nil {
				t.Errorf("the halted cluster is not writable through its endpoint: %v", err)
			}
		}
		out := u.marina(t, "upgrade", "rollback", key.Name)
		if !strings.Contains(out, "kube-apiserver on upgrade-cp-0 to v1.36.3") {
			t.Errorf("marina upgrade rollback says: %s", out)
		}
		waitUpgradeReason(t, ctx, c, key, clusterv1.ClusterUpgradeRolledBackReason, time.Minute)
		testenv.Eventually(t, 2*time.Minute, "upgrade-cp-0 back at v1.36.3, in the endpoint", func() error {
			m := &clusterv1.Machine{}
			if err := c.Get(ctx, types.NamespacedName{Namespace: key.Namespace, Name: "upgrade-cp-0"}, m); err != nil {
				return err
			}
			if v := m.Status.Versions.ControlPlane; v == nil || v.APIServer != upgradeFrom {
				return fmt.Errorf("reports %+v", v)
			}
			if _, drained := m.Annotations[clusterv1.EndpointDrainAnnotation]; drained {
				return fmt.Errorf("still out of the endpoint")
			}
			return nil
		})
	})

	applyHello(t, writeWorkloadKubeconfig(t, ctx, u, key), u.repoRoot(t), "upgrade-workers")
	testenv.Eventually(t, 2*time.Minute, "3 hello pods Ready", func() error { return helloReady(ctx, cs, 3) })
	app := startNodePortProber(ctx, cs, 30080, 100*time.Millisecond)
	probe, err := prober.Start(ctx, cs, "default", 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	rec := recordVersions(ctx, u.stateDir, key)

	// Fixing the spec (the flag removed) lets the upgrade go on.
	start := time.Now()
	fix := `{"spec":{"controlPlane":{"upgradeStrategy":{"stepTimeout":"3m"},"components":{"apiServer":{"extraArgs":null}}}}}`
	if out, err := u.kubectl(t, "patch", "cluster", key.Name, "--type=merge", "-p", fix); err != nil {
		t.Fatalf("kubectl patch: %v\n%s", err, out)
	}
	// Crash safety: marina up killed outright once the first API server
	// has moved, and started again, resumes at the step the machines show.
	testenv.Eventually(t, 4*time.Minute, "the first API server at "+upgradeTo, func() error {
		if rec.count("kube-apiserver") == 0 {
			return fmt.Errorf("no API server moved yet")
		}
		return nil
	})
	t.Logf("%s: killing marina up mid-upgrade", time.Since(start).Round(100*time.Millisecond))
	u = restartKilled(t, u, u.stateDir)
	c = mgmtClient(t, u.stateDir)
	waitUpgraded(t, ctx, c, key, 12*time.Minute)
	took := time.Since(start)
	// The last worker's replacement is Running before the app has its
	// third pod on it again: wait for that, asking all along.
	testenv.Eventually(t, 2*time.Minute, "3 hello pods Ready after the roll", func() error { return helloReady(ctx, cs, 3) })
	res := probe.Stop()
	appRes := app.Stop()
	changes := rec.stop()

	t.Logf("InPlace %s → %s of 3 control-plane machines and 3 workers: %s; prober: %d requests (%.1f/s), %d failed",
		upgradeFrom, upgradeTo, took.Round(time.Second), res.Requests, res.Rate(), res.Failures)
	for _, ch := range changes {
		t.Logf("  %s  %-24s %s", ch.at.Sub(start).Round(100*time.Millisecond), ch.component, ch.machine)
	}
	lbLogs, _ := filepath.Glob(filepath.Join(root, ".endpoints", "*", "lb.log"))
	checkProbe(t, res, lbLogs...)
	checkOrder(t, changes, 3)
	t.Logf("the app's NodePort prober: %d requests (%.1f/s), %d failed", appRes.Requests, appRes.Rate(), appRes.Failures)
	for _, ch := range app.Changes() {
		t.Logf("  Node target %s", ch)
	}
	if appRes.Failures != 0 {
		logPodEvents(t, ctx, cs, "default")
		for _, e := range appRes.Errors {
			t.Logf("  failed: %s", e)
		}
		t.Errorf("%d of %d requests to the app's NodePort failed while the workers rolled, want 0; the first: %s", appRes.Failures, appRes.Requests, appRes.Errors[0])
	}
	if appRes.Rate() < 5 {
		t.Errorf("the NodePort prober sent %.1f requests a second, want at least 5", appRes.Rate())
	}
	checkKubeletsAt(t, ctx, cs, upgradeTo, 6)

	cluster := &clusterv1.Cluster{}
	if err := c.Get(ctx, key, cluster); err != nil {
		t.Fatal(err)
	}
	if st := cluster.Status.Upgrade; st == nil || st.From != upgradeFrom || st.To != upgradeTo || st.CompletedAt == nil {
		t.Errorf("status.upgrade = %+v, want a completed upgrade from %s to %s", st, upgradeFrom, upgradeTo)
	}
	for _, m := range controlPlaneMachines(t, ctx, c, key) {
		if m.Spec.Versions.ControlPlane != upgradeTo || m.Spec.Versions.Components != nil || m.Spec.Versions.Kubelet != upgradeTo {
			t.Errorf("machine %s: spec.versions = %+v, want %s throughout and no per-component versions left", m.Name, m.Spec.Versions, upgradeTo)
		}
		if _, ok := m.Annotations[clusterv1.EndpointDrainAnnotation]; ok {
			t.Errorf("machine %s is still out of the endpoint", m.Name)
		}
	}

	t.Run("marina describe and marina kubeconfig show the upgraded cluster", func(t *testing.T) {
		out := u.marina(t, "describe", "cluster", key.Name)
		for _, want := range []string{"Cluster/upgrade", "├─ControlPlane", "Machine/upgrade-cp-", "kube-apiserver v1.37.2, kube-controller-manager v1.37.2",
			"MachineDeployment/upgrade-workers", "3/3 ready"} {
			if !strings.Contains(out, want) {
				t.Errorf("marina describe cluster does not show %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "\x1b[") {
			t.Errorf("colour codes in piped output")
		}
		path := filepath.Join(t.TempDir(), "upgrade.kubeconfig")
		u.marina(t, "kubeconfig", key.Name, "--output-file", path)
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("the kubeconfig file: %v, mode %v; want 0600", err, fi.Mode())
		}
		if out, err := u.kubectl(t, "--kubeconfig", path, "get", "nodes"); err != nil || strings.Count(out, " Ready ") != 6 {
			t.Errorf("kubectl get nodes with the written kubeconfig: %v\n%s", err, out)
		}
	})

	if out, err := u.kubectl(t, "delete", "cluster", key.Name, "--wait=false"); err != nil {
		t.Fatalf("kubectl delete cluster: %v\n%s", err, out)
	}
	testenv.Eventually(t, 3*time.Minute, "the cluster and everything of it gone", func() error {
		if err := c.Get(ctx, key, &clusterv1.Cluster{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster still there (%v)", err)
		}
		if left := leftovers(t, root); len(left) > 0 {
			return fmt.Errorf("left on disk: %v", left)
		}
		return realLeftovers(root)
	})
	u.stopAndCheckNoLeftovers(t, syscall.SIGTERM)
}

// checkProbe: no request through the endpoint failed, and the prober
// kept its pace (a stalled prober would fail nothing). On a failure it
// shows what the balancers whose logs are at lbLogs did with their
// backends, to be set beside the failures' times.
func checkProbe(t *testing.T, res prober.Result, lbLogs ...string) {
	t.Helper()
	if res.Failures != 0 {
		// The failures last: a CI report shows a failed test's tail.
		testenv.Explain(t)
		for _, path := range lbLogs {
			logBackendEvents(t, path)
		}
		for _, e := range res.Errors {
			t.Logf("  failed: %s", e)
		}
		t.Errorf("%d of %d requests through the endpoint failed during the InPlace upgrade, want 0; the first: %s", res.Failures, res.Requests, res.Errors[0])
	}
	// Its three loops send one request each every 100ms when answers are
	// quick; three planes on two cores slow the answers (18.9/s in one CI
	// run). A third of the pace is still a prober that ran throughout.
	if res.Rate() < 10 {
		t.Errorf("the prober sent %.1f requests a second, want at least 10", res.Rate())
	}
}

// logBackendEvents logs the lines of a balancer's log where a backend
// went in or out of service, or had its connections closed.
func logBackendEvents(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Logf("the balancer's log: %v", err)
		return
	}
	t.Logf("what the balancer did (%s):", path)
	for line := range strings.Lines(string(data)) {
		if strings.Contains(line, "Backend") || strings.Contains(line, "Closing") {
			t.Logf("  %s", strings.TrimSpace(line))
		}
	}
}

// waitUpgradeReason waits for the UpgradeProgressing condition to have reason.
func waitUpgradeReason(t *testing.T, ctx context.Context, c client.Client, key types.NamespacedName, reason string, timeout time.Duration) *metav1.Condition {
	t.Helper()
	var cond *metav1.Condition
	testenv.Eventually(t, timeout, "UpgradeProgressing reason "+reason, func() error {
		cluster := &clusterv1.Cluster{}
		if err := c.Get(ctx, key, cluster); err != nil {
			return err
		}
		cond = meta.FindStatusCondition(cluster.Status.Conditions, clusterv1.ClusterUpgradeProgressingCondition)
		if cond == nil || cond.Reason != reason {
			return fmt.Errorf("%+v", cond)
		}
		return nil
	})
	return cond
}

func writeOnce(ctx context.Context, cs kubernetes.Interface, i int) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return write(ctx, cs, i)
}

// marina runs the marina CLI against the management plane.
func (u *upProcess) marina(t *testing.T, args ...string) string {
	t.Helper()
	out, err := u.marinaErr(args...)
	if err != nil {
		t.Fatalf("marina %v: %v\n%s", args, err, out)
	}
	return out
}

func (u *upProcess) marinaErr(args ...string) (string, error) {
	cmd := exec.Command(marinaBin, append(args, "--kubeconfig", filepath.Join(u.stateDir, "admin.kubeconfig"))...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// waitWorkers waits until the cluster has want Running workers, all at
// kubelet.
func waitWorkers(t *testing.T, ctx context.Context, c client.Client, key types.NamespacedName, want int, kubelet string, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, timeout, fmt.Sprintf("%d workers Running at %s", want, kubelet), func() error {
		var list clusterv1.MachineList
		if err := c.List(ctx, &list, client.InNamespace(key.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: key.Name}); err != nil {
			return err
		}
		n := 0
		for _, m := range list.Items {
			if _, cp := m.Labels[clusterv1.ControlPlaneLabel]; cp || !m.DeletionTimestamp.IsZero() {
				continue
			}
			if m.Status.Phase != clusterv1.MachinePhaseRunning || m.Status.Versions.Kubelet != kubelet {
				return fmt.Errorf("worker %s: %s at %q", m.Name, m.Status.Phase, m.Status.Versions.Kubelet)
			}
			n++
		}
		if n != want {
			return fmt.Errorf("%d workers", n)
		}
		return nil
	})
}

// waitUpgraded waits for UpgradeProgressing=False, UpgradeComplete, and
// stops at once when the upgrade halts.
func waitUpgraded(t *testing.T, ctx context.Context, c client.Client, key types.NamespacedName, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, timeout, "the upgrade complete", func() error {
		cluster := &clusterv1.Cluster{}
		if err := c.Get(ctx, key, cluster); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(cluster.Status.Conditions, clusterv1.ClusterUpgradeProgressingCondition)
		switch st := cluster.Status.Upgrade; {
		case st == nil || st.To != upgradeTo:
			return fmt.Errorf("status.upgrade = %+v: not begun", st)
		case cond == nil:
			return fmt.Errorf("no %s condition", clusterv1.ClusterUpgradeProgressingCondition)
		case cond.Reason == clusterv1.ClusterUpgradeStepTimeoutReason:
			testenv.Fatalf(t, "the upgrade halted: %s", cond.Message)
		case cond.Reason != clusterv1.ClusterUpgradeCompleteReason || st.CompletedAt == nil:
			return fmt.Errorf("%s: %s", cond.Reason, cond.Message)
		}
		return nil
	})
}

// change is one component of one machine first seen at the new version;
// seq orders the changes as the management API server wrote them.
type change struct {
	at                 time.Time
	seq                int
	machine, component string
}

type versionRecorder struct {
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	changes []change
	seen    map[string]bool
}

// count is how many machines' component moved so far.
func (r *versionRecorder) count(component string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, ch := range r.changes {
		if ch.component == component {
			n++
		}
	}
	return n
}

// recordVersions watches the control-plane machines' status.versions and
// records when each component of each machine first reports upgradeTo, in
// the order of the writes. A watch, not a poll: since issue 26 a kubelet
// step can be taken and reported within one 200 ms poll of the scheduler
// step before it, and a poll cannot order two changes it sees at once. It
// follows the management plane across a restart (the same state
// directory, a new connection).
func recordVersions(ctx context.Context, stateDir string, key types.NamespacedName) *versionRecorder {
	ctx, cancel := context.WithCancel(ctx)
	r := &versionRecorder{cancel: cancel, done: make(chan struct{}), seen: map[string]bool{}}
	go func() {
		defer close(r.done)
		for ctx.Err() == nil {
			r.follow(ctx, stateDir, key)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return r
}

// follow lists the machines, then watches them from that list until the
// watch ends (the management plane stopped) or ctx does.
func (r *versionRecorder) follow(ctx context.Context, stateDir string, key types.NamespacedName) {
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(stateDir, "admin.kubeconfig"))
	if err != nil {
		return
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return
	}
	opts := []client.ListOption{client.InNamespace(key.Namespace), client.HasLabels{clusterv1.ControlPlaneLabel}}
	var list clusterv1.MachineList
	if err := c.List(ctx, &list, opts...); err != nil {
		return
	}
	for i := range list.Items {
		r.observe(&list.Items[i])
	}
	w, err := c.Watch(ctx, &clusterv1.MachineList{}, append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})...)
	if err != nil {
		return
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if m, ok := ev.Object.(*clusterv1.Machine); ok {
			r.observe(m)
		}
	}
}

func (r *versionRecorder) observe(m *clusterv1.Machine) {
	v := m.Status.Versions.ControlPlane
	if v == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, component := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"} {
		got := map[string]string{"kube-apiserver": v.APIServer, "kube-controller-manager": v.ControllerManager,
			"kube-scheduler": v.Scheduler, "kubelet": m.Status.Versions.Kubelet}[component]
		if id := m.Name + "/" + component; got == upgradeTo && !r.seen[id] {
			r.seen[id] = true
			r.changes = append(r.changes, change{at: time.Now(), seq: len(r.changes), machine: m.Name, component: component})
		}
	}
}

func (r *versionRecorder) stop() []change {
	r.cancel()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.changes)
}

// checkOrder asserts M12's order: every API server before any controller
// manager, every controller manager before any scheduler, every scheduler
// before any control-plane kubelet; each on all machines.
func checkOrder(t *testing.T, changes []change, machines int) {
	t.Helper()
	order := []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"}
	last := map[string]change{}
	first := map[string]change{}
	count := map[string]int{}
	for _, ch := range changes {
		count[ch.component]++
		if f, ok := first[ch.component]; !ok || ch.seq < f.seq {
			first[ch.component] = ch
		}
		if l, ok := last[ch.component]; !ok || ch.seq > l.seq {
			last[ch.component] = ch
		}
	}
	for _, c := range order {
		if count[c] != machines {
			t.Errorf("%s moved to %s on %d machines, want %d", c, upgradeTo, count[c], machines)
		}
	}
	for i := 1; i < len(order); i++ {
		before, after := order[i-1], order[i]
		if count[before] > 0 && count[after] > 0 && last[before].seq > first[after].seq {
			t.Errorf("a %s moved (on %s at %s) before the last %s (on %s at %s)", after, first[after].machine, first[after].at.Format("15:04:05.000"),
				before, last[before].machine, last[before].at.Format("15:04:05.000"))
		}
	}
}

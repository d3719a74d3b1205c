package crashpoint

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/etcdadmin"
	"marina.dev/marina/internal/manager"
	"marina.dev/marina/internal/pki"
	"marina.dev/marina/internal/prober"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider"
	"marina.dev/marina/provider/local"
)

// The harness runs two chains of scenarios, each on one cluster of real
// local machines (etcd, kube-apiserver and the rest as processes):
//
//	A: create 1 → scale to 3 → remediate a dead machine → InPlace upgrade
//	   → scale 3 → 1 → delete
//	B: create 1 → Replace upgrade → delete
//
// In each scenario the manager is stopped after its k-th write to the
// cluster's namespace (the write landing, or not: the before variant),
// and a fresh manager with a fresh provider takes over the same API
// server and sandboxes. The scenario then has to converge, and the
// invariants hold: etcd's members are the control-plane machines, by the
// member ID recorded on each, all voting and healthy; a prober through
// the endpoint never failed for longer than maxOutage; one set of CAs,
// the same as at the cluster's creation; no sandbox without its Machine;
// no Machine left behind.
//
// -crash-points=sample (the default, for CI) tries one k per scenario;
// -crash-points=all tries every k of every scenario, both variants, one
// round (a whole chain) per k, until no scenario has a k-th write left:
//
//	go test -timeout 24h -run TestCrashPoints ./test/crashpoint/ -crash-points=all
var (
	crashPoints = flag.String("crash-points", "sample", "sample: one crash point per scenario; all: every k of every scenario, after and before the write")
	logPath     = flag.String("crash-log", "", "write the managers' log to this file (default: a temporary one, removed)")
	runFor      = flag.Duration("crash-for", 0, "with -crash-points=all, start no round after this long (0: no bound); the rounds run finish and clean up")
	firstRound  = flag.Int("crash-from", 1, "with -crash-points=all, the first k tried (to resume or shard a long run)")
)

// maxOutage bounds a run of failed requests through the endpoint: about
// one step (a balancer failover is ~3 s, a controller's restart a few
// more).
const maxOutage = 20 * time.Second

// converge bounds each scenario after a takeover.
const converge = 6 * time.Minute

var suite struct {
	env    *testenv.Env
	marina string
	binDir string
	tmp    string
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		tmp, err := os.MkdirTemp("", "marina-crashpoint-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(tmp)
		suite.tmp = tmp
		if suite.marina, err = testenv.BuildMarina(tmp); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if suite.binDir, err = testenv.BinDir(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if suite.env, err = testenv.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer func() { _ = suite.env.Stop() }()
		path := *logPath
		if path == "" {
			path = filepath.Join(tmp, "manager.log")
		}
		logFile, err := os.Create(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer logFile.Close()
		// The managers' log, for a violation's post-mortem (-crash-log).
		ctrl.SetLogger(textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(2), textlogger.Output(logFile))))
		return m.Run()
	}()
	os.Exit(code)
}

// scenario is one change to a cluster; act makes it (as a user would),
// done says when the manager has carried it out.
type scenario struct {
	name string
	act  func(h *harness) error
	done func(h *harness) error
	// probe: the workload cluster serves throughout (not while it is
	// being made or deleted).
	probe bool
}

func chainA() []scenario {
	return []scenario{
		{name: "create 1", act: func(h *harness) error { return h.createCluster(clusterv1.InPlaceUpgrade) },
			done: func(h *harness) error { return h.controlPlane(1, "v1.36.3") }},
		{name: "scale 1 → 3", probe: true, act: func(h *harness) error { return h.scale(3) },
			done: func(h *harness) error { return h.controlPlane(3, "v1.36.3") }},
		{name: "remediate a dead control-plane machine", probe: true, act: func(h *harness) error { return h.killMachine() },
			done: func(h *harness) error {
				if err := h.gone(h.victim); err != nil {
					return err
				}
				return h.controlPlane(3, "v1.36.3")
			}},
		{name: "InPlace upgrade", probe: true, act: func(h *harness) error { return h.upgrade("v1.37.2") },
			done: func(h *harness) error { return h.upgraded(3, "v1.37.2") }},
		{name: "scale 3 → 1", probe: true, act: func(h *harness) error { return h.scale(1) },
			done: func(h *harness) error { return h.controlPlane(1, "v1.37.2") }},
		{name: "delete", act: func(h *harness) error { return h.deleteCluster() },
			done: func(h *harness) error { return h.nothingLeft() }},
	}
}

func chainB() []scenario {
	return []scenario{
		{name: "create 1 (Replace strategy)", act: func(h *harness) error { return h.createCluster(clusterv1.ReplaceUpgrade) },
			done: func(h *harness) error { return h.controlPlane(1, "v1.36.3") }},
		{name: "Replace upgrade", probe: true, act: func(h *harness) error { return h.upgrade("v1.37.2") },
			done: func(h *harness) error { return h.upgraded(1, "v1.37.2") }},
		{name: "delete (Replace strategy)", act: func(h *harness) error { return h.deleteCluster() },
			done: func(h *harness) error { return h.nothingLeft() }},
	}
}

// sample is the crash point CI tries in each scenario, by name, and
// whether the write lands: spread over early and late writes and both
// variants. Chain B's create and delete repeat chain A's and are not
// tried in the sample.
var sample = map[string]point{
	"create 1":                               {k: 7},
	"scale 1 → 3":                            {k: 4, before: true},
	"remediate a dead control-plane machine": {k: 3},
	"InPlace upgrade":                        {k: 5, before: true},
	"scale 3 → 1":                            {k: 2},
	"delete":                                 {k: 3, before: true},
	"Replace upgrade":                        {k: 4},
}

type point struct {
	k      int
	before bool
}

func (p point) String() string {
	if p.before {
		return fmt.Sprintf("k=%d before", p.k)
	}
	return fmt.Sprintf("k=%d after", p.k)
}

func TestCrashPoints(t *testing.T) {
	start := time.Now()
	tried := map[string]int{}
	writes := map[string]int{}
	run := func(round string, pick func(sc scenario) point) (anyLeft bool) {
		for _, chain := range [][]scenario{chainA(), chainB()} {
			h := newHarness(t)
			for _, sc := range chain {
				p := pick(sc)
				w, crashed := h.run(sc, p)
				writes[sc.name] = max(writes[sc.name], w)
				if crashed {
					tried[sc.name]++
					anyLeft = true
				}
				t.Logf("%s: %s: %s: %d writes, stopped: %t", round, sc.name, p, w, crashed)
			}
			h.stop()
		}
		return anyLeft
	}
	switch *crashPoints {
	case "sample":
		run("sample", func(sc scenario) point { return sample[sc.name] })
		for name, p := range sample {
			if tried[name] == 0 {
				t.Errorf("scenario %s made fewer than %d writes (%d): the sample's crash point is never reached", name, p.k, writes[name])
			}
		}
	case "all":
		for k := *firstRound; ; k++ {
			if *runFor > 0 && time.Since(start) > *runFor {
				t.Logf("-crash-for %s passed: stopped before k=%d", *runFor, k)
				break
			}
			left := false
			for _, before := range []bool{false, true} {
				if run(fmt.Sprintf("round k=%d before=%t", k, before), func(scenario) point { return point{k: k, before: before} }) {
					left = true
				}
			}
			if !left {
				break
			}
		}
	default:
		t.Fatalf("-crash-points=%s: want sample or all", *crashPoints)
	}
	total := 0
	var names []string
	for name, n := range tried {
		total += n
		names = append(names, fmt.Sprintf("%s: %d", name, n))
	}
	slices.Sort(names)
	violations := 0
	if t.Failed() {
		violations = 1
	}
	fmt.Printf("crash points tried: %d (%s); violations: %d; wall time %s\n", total, strings.Join(names, "; "), violations, time.Since(start).Round(time.Second))
}

// harness is one chain's world: a namespace with one Cluster, the
// sandboxes of its machines, and the manager that runs now.
type harness struct {
	t       *testing.T
	ctx     context.Context
	c       client.Client
	ns      string
	root    string
	cluster types.NamespacedName
	mgr     *running
	// ca is the cluster CA at creation; victim the machine killed.
	ca     []byte
	victim *clusterv1.Machine
}

type running struct {
	k      *killSwitch
	cancel context.CancelFunc
	done   chan error
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, ctx: context.Background(), c: suite.env.Client, ns: suite.env.Namespace(t)}
	h.root = filepath.Join(suite.tmp, "machines-"+h.ns)
	h.cluster = types.NamespacedName{Namespace: h.ns, Name: "crash"}
	t.Cleanup(func() {
		h.stop()
		if p, err := h.provider(); err == nil {
			if err := p.DeleteAll(context.Background()); err != nil {
				t.Errorf("cleaning up the sandboxes: %v", err)
			}
		}
	})
	return h
}

func (h *harness) provider() (*local.Provider, error) {
	return local.New(local.Options{Root: h.root, BinDir: suite.binDir,
		AgentCommand: []string{suite.marina, "node-agent"}, LoadBalancerCommand: []string{suite.marina, "load-balancer"}})
}

// start runs a fresh manager, knowing nothing, stopped at p (k 0: never).
func (h *harness) start(p point) {
	h.t.Helper()
	prov, err := h.provider()
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	k := &killSwitch{ns: h.ns, limit: p.k, before: p.before, stop: cancel}
	mgr, err := manager.New(ctx, suite.env.Config, manager.Options{MetricsAddr: "0", HealthAddr: "0",
		Providers: []provider.Provider{prov}, Restartable: true,
		WrapClient: func(c client.Client) client.Client { return &crashClient{Client: c, k: k} }})
	if err != nil {
		cancel()
		h.t.Fatal(err)
	}
	r := &running{k: k, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- mgr.Start(ctx) }()
	h.mgr = r
}

// stop stops the running manager and waits for it.
func (h *harness) stop() {
	if h.mgr == nil {
		return
	}
	h.mgr.cancel()
	if err := <-h.mgr.done; err != nil {
		h.t.Errorf("manager: %v", err)
	}
	h.mgr = nil
}

// run plays one scenario: a manager stopped at p, a fresh one after it,
// until the scenario is done and the invariants hold. It returns the
// writes the first manager made and whether it was stopped.
func (h *harness) run(sc scenario, p point) (writes int, crashed bool) {
	h.t.Helper()
	h.stop()
	h.start(p)
	var probe *prober.Prober
	if sc.probe {
		probe = h.startProber()
	}
	if err := sc.act(h); err != nil {
		h.t.Fatalf("%s: %v", sc.name, err)
	}
	first := h.mgr
	deadline := time.Now().Add(converge)
	var last error
	for time.Now().Before(deadline) {
		if w, killed := first.k.count(); killed && h.mgr == first {
			<-first.done // the manager ends as its context is cancelled
			h.mgr = nil
			writes, crashed = w, true
			h.start(point{})
		}
		if last = sc.done(h); last == nil {
			if h.mgr == first {
				writes, _ = first.k.count()
			}
			break
		}
		time.Sleep(time.Second)
	}
	if last != nil {
		h.t.Fatalf("VIOLATION: %s (%s, stopped %t): not done %s after the takeover: %v\n%s", sc.name, p, crashed, converge, last, h.describe())
	}
	if err := h.invariants(); err != nil {
		h.t.Fatalf("VIOLATION: %s (%s, stopped %t): %v", sc.name, p, crashed, err)
	}
	if probe != nil {
		res := probe.Stop()
		if res.LongestOutage > maxOutage {
			h.t.Fatalf("VIOLATION: %s (%s, stopped %t): requests through the endpoint failed for %s in a row (%d of %d failed): %v",
				sc.name, p, crashed, res.LongestOutage, res.Failures, res.Requests, res.Errors)
		}
		h.t.Logf("%s: prober %d requests, %d failed, longest outage %s", sc.name, res.Requests, res.Failures, res.LongestOutage.Round(time.Millisecond))
	}
	return writes, crashed
}

func (h *harness) createCluster(strategy clusterv1.ControlPlaneUpgradeStrategyType) error {
	cl := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: h.cluster.Name, Namespace: h.ns},
		Spec: clusterv1.ClusterSpec{
			ControlPlane: clusterv1.ControlPlaneSpec{
				Version:         "v1.36.3",
				Replicas:        1,
				UpgradeStrategy: clusterv1.ControlPlaneUpgradeStrategy{Type: strategy},
				ProviderSpec:    &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"2Gi"}}`)},
			},
		},
	}
	h.ca, h.victim = nil, nil
	return h.c.Create(h.ctx, cl)
}

func (h *harness) patchCluster(mutate func(*clusterv1.Cluster)) error {
	cl := &clusterv1.Cluster{}
	if err := h.c.Get(h.ctx, h.cluster, cl); err != nil {
		return err
	}
	patch := client.MergeFrom(cl.DeepCopy())
	mutate(cl)
	return h.c.Patch(h.ctx, cl, patch)
}

func (h *harness) scale(n int32) error {
	return h.patchCluster(func(cl *clusterv1.Cluster) { cl.Spec.ControlPlane.Replicas = n })
}

func (h *harness) upgrade(v string) error {
	return h.patchCluster(func(cl *clusterv1.Cluster) { cl.Spec.ControlPlane.Version = clusterv1.KubernetesVersion(v) })
}

func (h *harness) deleteCluster() error {
	return h.c.Delete(h.ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: h.cluster.Name}})
}

// killMachine kills every process of one control-plane machine (stopped
// on purpose, or the machine controller would start it again) under a
// health check that remediates it.
func (h *harness) killMachine() error {
	one := intstr.FromInt32(1)
	mhc := &clusterv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: "control-plane"},
		Spec: clusterv1.MachineHealthCheckSpec{
			ClusterName: h.cluster.Name,
			Selector:    metav1.LabelSelector{MatchLabels: map[string]string{clusterv1.ControlPlaneLabel: ""}},
			UnhealthyConditions: []clusterv1.UnhealthyCondition{
				{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Timeout: metav1.Duration{Duration: 5 * time.Second}},
				{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Timeout: metav1.Duration{Duration: 5 * time.Second}},
			},
			MaxUnhealthy: &one,
		},
	}
	if err := h.c.Create(h.ctx, mhc); client.IgnoreAlreadyExists(err) != nil {
		return err
	}
	machines, err := h.machines()
	if err != nil {
		return err
	}
	victim := machines[len(machines)-1]
	h.victim = &victim
	patch := client.MergeFrom(victim.DeepCopy())
	victim.Annotations[clusterv1.StoppedOnPurposeAnnotation] = "true"
	if err := h.c.Patch(h.ctx, &victim, patch); err != nil {
		return err
	}
	for _, pid := range processesUnder(filepath.Join(h.root, string(victim.UID))) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return nil
}

// machines are the cluster's control-plane machines.
func (h *harness) machines() ([]clusterv1.Machine, error) {
	var list clusterv1.MachineList
	if err := h.c.List(h.ctx, &list, client.InNamespace(h.ns), client.HasLabels{clusterv1.ControlPlaneLabel}); err != nil {
		return nil, err
	}
	return list.Items, nil
}

func (h *harness) gone(m *clusterv1.Machine) error {
	got := &clusterv1.Machine{}
	err := h.c.Get(h.ctx, client.ObjectKeyFromObject(m), got)
	if err == nil && got.UID == m.UID {
		return fmt.Errorf("machine %s is still there", m.Name)
	}
	return client.IgnoreNotFound(err)
}

// describe is what a post-mortem needs first when a scenario does not
// converge: the conditions that are not True on the Cluster, its
// machines and its health checks (their messages say what the
// controllers wait for).
func (h *harness) describe() string {
	var b strings.Builder
	cl := &clusterv1.Cluster{}
	if err := h.c.Get(h.ctx, h.cluster, cl); err != nil {
		fmt.Fprintf(&b, "cluster: %v\n", err)
	} else {
		fmt.Fprintf(&b, "cluster %s: %s\n", cl.Name, conditions(cl.Status.Conditions))
	}
	var machines clusterv1.MachineList
	if err := h.c.List(h.ctx, &machines, client.InNamespace(h.ns)); err != nil {
		fmt.Fprintf(&b, "machines: %v\n", err)
	}
	for _, m := range machines.Items {
		fmt.Fprintf(&b, "machine %s: phase %s, deleting %t, annotations %v: %s\n", m.Name, m.Status.Phase, !m.DeletionTimestamp.IsZero(), m.Annotations, conditions(m.Status.Conditions))
	}
	var checks clusterv1.MachineHealthCheckList
	if err := h.c.List(h.ctx, &checks, client.InNamespace(h.ns)); err != nil {
		fmt.Fprintf(&b, "health checks: %v\n", err)
	}
	for _, c := range checks.Items {
		fmt.Fprintf(&b, "health check %s: %+v: %s\n", c.Name, c.Status, conditions(c.Status.Conditions))
	}
	return b.String()
}

// controlPlane: the cluster is Ready with n control-plane machines, all
// Running at version, n healthy etcd members.
func (h *harness) controlPlane(n int, version string) error {
	cl := &clusterv1.Cluster{}
	if err := h.c.Get(h.ctx, h.cluster, cl); err != nil {
		return err
	}
	if !meta.IsStatusConditionTrue(cl.Status.Conditions, clusterv1.ReadyCondition) {
		return fmt.Errorf("cluster not Ready: %v", conditions(cl.Status.Conditions))
	}
	etcd := meta.FindStatusCondition(cl.Status.Conditions, clusterv1.ClusterEtcdHealthyCondition)
	if want := fmt.Sprintf("%d of %d etcd members are healthy", n, n); etcd == nil || etcd.Message != want {
		return fmt.Errorf("etcd: %+v, want %q", etcd, want)
	}
	if cl.Status.ControlPlane.Version != version {
		return fmt.Errorf("the control plane runs %q, want %s", cl.Status.ControlPlane.Version, version)
	}
	machines, err := h.machines()
	if err != nil {
		return err
	}
	running := 0
	for _, m := range machines {
		if m.Status.Phase == clusterv1.MachinePhaseRunning && m.DeletionTimestamp.IsZero() {
			running++
		}
	}
	if len(machines) != n || running != n {
		return fmt.Errorf("%d control-plane machines, %d Running, want %d", len(machines), running, n)
	}
	if h.ca == nil {
		secret := &corev1.Secret{}
		if err := h.c.Get(h.ctx, types.NamespacedName{Namespace: h.ns, Name: clusterpki.SecretName(h.cluster.Name, clusterpki.ClusterCA)}, secret); err != nil {
			return err
		}
		h.ca = secret.Data[corev1.TLSCertKey]
	}
	return nil
}

// upgraded: the upgrade to version is complete on n machines.
func (h *harness) upgraded(n int, version string) error {
	cl := &clusterv1.Cluster{}
	if err := h.c.Get(h.ctx, h.cluster, cl); err != nil {
		return err
	}
	c := meta.FindStatusCondition(cl.Status.Conditions, clusterv1.ClusterUpgradeProgressingCondition)
	if st := cl.Status.Upgrade; st == nil || st.To != version || st.CompletedAt == nil || c == nil || c.Reason != clusterv1.ClusterUpgradeCompleteReason {
		return fmt.Errorf("upgrade not complete: %+v", c)
	}
	return h.controlPlane(n, version)
}

// nothingLeft: the cluster, its machines, sandboxes and processes are gone.
func (h *harness) nothingLeft() error {
	if err := h.c.Get(h.ctx, h.cluster, &clusterv1.Cluster{}); !apierrors.IsNotFound(err) {
		return fmt.Errorf("cluster still there (%v)", err)
	}
	if machines, err := h.machines(); err != nil || len(machines) > 0 {
		return fmt.Errorf("%d machines left (%v)", len(machines), err)
	}
	if dirs := sandboxes(h.root); len(dirs) > 0 {
		return fmt.Errorf("sandboxes left: %v", dirs)
	}
	if pids := processesUnder(h.root); len(pids) > 0 {
		return fmt.Errorf("processes still run from the sandboxes: %v", pids)
	}
	return nil
}

// invariants are checked once a scenario is done after a takeover.
func (h *harness) invariants() error {
	machines, err := h.machines()
	if err != nil {
		return err
	}
	// No sandbox without its Machine, no Machine without its sandbox.
	uids := map[string]bool{}
	for _, m := range machines {
		uids[string(m.UID)] = true
	}
	dirs := sandboxes(h.root)
	for _, d := range dirs {
		if !uids[d] {
			return fmt.Errorf("sandbox %s belongs to no Machine", d)
		}
	}
	if len(dirs) != len(machines) {
		return fmt.Errorf("%d sandboxes for %d machines", len(dirs), len(machines))
	}
	if len(machines) == 0 {
		return nil
	}
	// One set of key material, the CA the cluster was made with.
	var secrets corev1.SecretList
	if err := h.c.List(h.ctx, &secrets, client.InNamespace(h.ns)); err != nil {
		return err
	}
	n := 0
	for _, s := range secrets.Items {
		if s.Type == clusterpki.SecretType {
			n++
			if s.Name == clusterpki.SecretName(h.cluster.Name, clusterpki.ClusterCA) && !bytes.Equal(s.Data[corev1.TLSCertKey], h.ca) {
				return fmt.Errorf("the cluster CA changed")
			}
		}
	}
	if n != 4 {
		return fmt.Errorf("%d key-material Secrets, want the cluster, etcd and front-proxy CAs and the service-account key once each", n)
	}
	// etcd's members are the machines', by the IDs recorded on them.
	members, err := h.etcdMembers(machines)
	if err != nil {
		return err
	}
	var recorded, listed []string
	for _, m := range machines {
		recorded = append(recorded, m.Annotations[clusterv1.EtcdMemberIDAnnotation])
	}
	for _, m := range members {
		listed = append(listed, strconv.FormatUint(m.ID, 16))
		if m.Learner || !m.Healthy {
			return fmt.Errorf("etcd member %x (%s) is a learner or does not answer", m.ID, m.Name)
		}
	}
	slices.Sort(recorded)
	slices.Sort(listed)
	if !slices.Equal(recorded, listed) {
		return fmt.Errorf("etcd members %v, but the machines record %v", listed, recorded)
	}
	return nil
}

func (h *harness) etcdMembers(machines []clusterv1.Machine) ([]etcdadmin.Member, error) {
	cl := &clusterv1.Cluster{}
	if err := h.c.Get(h.ctx, h.cluster, cl); err != nil {
		return nil, err
	}
	set, err := clusterpki.Load(h.ctx, h.c, h.c, cl, time.Now())
	if err != nil {
		return nil, err
	}
	pair, err := set.Etcd.Issue(pki.CertSpec{CommonName: "crashpoint-harness", Usage: pki.ClientAuth})
	if err != nil {
		return nil, err
	}
	key, err := pair.KeyPEM()
	if err != nil {
		return nil, err
	}
	var endpoints []string
	for _, m := range machines {
		for _, a := range m.Status.Addresses {
			if a.Type == clusterv1.MachineInternalIP {
				endpoints = append(endpoints, fmt.Sprintf("https://%s:%d", a.Address, bootstrap.DefaultEtcdClientPort))
			}
		}
	}
	e, err := etcdadmin.New(h.ctx, etcdadmin.Config{Endpoints: endpoints, CA: set.Etcd.CertPEM(), Cert: pair.CertPEM(), Key: key})
	if err != nil {
		return nil, err
	}
	defer e.Close()
	ctx, cancel := context.WithTimeout(h.ctx, 10*time.Second)
	defer cancel()
	return e.Members(ctx)
}

// startProber sends requests through the cluster's endpoint.
func (h *harness) startProber() *prober.Prober {
	h.t.Helper()
	secret := &corev1.Secret{}
	if err := h.c.Get(h.ctx, types.NamespacedName{Namespace: h.ns, Name: remote.KubeconfigSecretName(h.cluster.Name)}, secret); err != nil {
		h.t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data[remote.KubeconfigSecretKey])
	if err != nil {
		h.t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	p, err := prober.Start(h.ctx, cs, "default", 200*time.Millisecond)
	if err != nil {
		h.t.Fatal(err)
	}
	return p
}

// sandboxes are the machine directories under root (named by UID).
func sandboxes(root string) []string {
	entries, _ := os.ReadDir(root)
	var dirs []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			dirs = append(dirs, e.Name())
		}
	}
	return dirs
}

// processesUnder are the live processes whose command line names dir.
func processesUnder(dir string) []int {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []int
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(data, []byte(dir)) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err == nil && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

func conditions(cs []metav1.Condition) string {
	var out []string
	for _, c := range cs {
		if c.Status != metav1.ConditionTrue {
			out = append(out, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
		}
	}
	return strings.Join(out, "; ")
}

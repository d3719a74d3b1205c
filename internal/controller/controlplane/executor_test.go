package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/pki"
	"marina.dev/marina/internal/testenv"
)

// The executor's tests run the control plane against the real API server
// (envtest) and a fake etcd: the member API is the edge no test reaches
// without running etcd on machines. The API server is started by the first
// test that needs it, so that the planner's pure tests run without it.
var (
	envOnce sync.Once
	env     *testenv.Env
	envErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if env != nil {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the test API server:", err)
		}
	}
	os.Exit(code)
}

func apiServer(t *testing.T) *testenv.Env {
	t.Helper()
	if testing.Short() {
		t.Skip("runs an API server")
	}
	envOnce.Do(func() { env, envErr = testenv.Start() })
	if envErr != nil {
		t.Fatal(envErr)
	}
	return env
}

// fakeEtcd is an etcd cluster's member API. Members answers what members
// holds, or listErr; errs[n] fails the n-th list alone (a leader change);
// views[n], when set, is what the n-th list sees instead (a member that
// stops answering between two looks).
type fakeEtcd struct {
	mu      sync.Mutex
	members []EtcdMember
	listErr error
	errs    map[int]error
	views   map[int][]EtcdMember
	lists   int
	removed []uint64
}

func (f *fakeEtcd) dial(context.Context, []string, []byte, []byte, []byte) (Etcd, error) {
	return f, nil
}

func (f *fakeEtcd) Members(context.Context) ([]EtcdMember, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	if f.listErr != nil {
		return nil, f.listErr
	}
	if err := f.errs[f.lists]; err != nil {
		return nil, err
	}
	if v, ok := f.views[f.lists]; ok {
		return slices.Clone(v), nil
	}
	return slices.Clone(f.members), nil
}

func (f *fakeEtcd) RemoveMember(_ context.Context, id uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, id)
	f.members = slices.DeleteFunc(f.members, func(m EtcdMember) bool { return m.ID == id })
	return nil
}

func (f *fakeEtcd) Close() error { return nil }

func (f *fakeEtcd) removedIDs() []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.removed)
}

func voter(id uint64, name, ip string) EtcdMember {
	return EtcdMember{ID: id, Name: name, PeerURLs: []string{"https://" + ip + ":2380"}, Healthy: true}
}

// world is one cluster's control plane under test.
type world struct {
	t       *testing.T
	c       client.Client
	ns      string
	cluster *clusterv1.Cluster
	set     *clusterpki.Set
	etcd    *fakeEtcd
	cp      *ControlPlane
	now     time.Time
	// unhealthy names the machines the component probes find unhealthy.
	unhealthy map[string]string
}

func newWorld(t *testing.T, replicas int32) *world {
	t.Helper()
	e := apiServer(t)
	ns := e.Namespace(t)
	etcdCA, err := pki.NewCA("etcd-ca")
	if err != nil {
		t.Fatal(err)
	}
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c"},
		Spec: clusterv1.ClusterSpec{ControlPlane: clusterv1.ControlPlaneSpec{
			Version: "v1.37.2", Replicas: 1,
			ProviderSpec: newWorldProviderSpec(),
		}},
	}
	if err := e.Client.Create(t.Context(), cluster); err != nil {
		t.Fatal(err)
	}
	// Admission asks for an odd count with stacked etcd; the planner takes
	// what it is given (a scale 1 → 3 passes through 2 machines).
	cluster.Spec.ControlPlane.Replicas = replicas
	setCondition(cluster, clusterv1.ClusterControlPlaneInitializedCondition, metav1.ConditionTrue, clusterv1.ClusterControlPlaneInitializedReason, "")
	w := &world{t: t, c: e.Client, ns: ns, cluster: cluster, set: &clusterpki.Set{Etcd: etcdCA}, etcd: &fakeEtcd{},
		now: time.Now(), unhealthy: map[string]string{}}
	w.cp = &ControlPlane{Client: e.Client, Live: e.Client, Etcd: w.etcd.dial, Now: func() time.Time { return w.now },
		Probe: func(_ context.Context, _ *clusterpki.Set, machines []clusterv1.Machine) map[string]string {
			out := map[string]string{}
			for _, m := range machines {
				out[m.Name] = w.unhealthy[m.Name]
				if !machineReady(&m) && out[m.Name] == "" {
					out[m.Name] = "its Node is not Ready"
				}
			}
			return out
		}}
	return w
}

func newWorldProviderSpec() *runtime.RawExtension {
	return &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine"}`)}
}

// machine makes a control-plane machine as the control plane would,
// holding a finalizer as the machine controller does; ip "" leaves it
// without the provider's answer (a status not written yet).
func (w *world) machine(name, ip string, version string) *clusterv1.Machine {
	w.t.Helper()
	ctx := w.t.Context()
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name,
			Labels:      map[string]string{clusterv1.ClusterNameLabel: w.cluster.Name, clusterv1.ControlPlaneLabel: ""},
			Annotations: map[string]string{clusterv1.EtcdMemberHook: ""},
			Finalizers:  []string{clusterv1.MachineFinalizer},
		},
		Spec: clusterv1.MachineSpec{ClusterName: w.cluster.Name, Roles: []clusterv1.MachineRole{clusterv1.ControlPlaneRole},
			ProviderSpec: w.cluster.Spec.ControlPlane.ProviderSpec.DeepCopy(),
			Versions:     clusterv1.MachineVersions{Kubelet: clusterv1.KubernetesVersion(version), ControlPlane: clusterv1.KubernetesVersion(version)}},
	}
	if err := controllerutil.SetControllerReference(w.cluster, m, w.c.Scheme()); err != nil {
		w.t.Fatal(err)
	}
	if err := w.c.Create(ctx, m); err != nil {
		w.t.Fatal(err)
	}
	if ip != "" {
		w.made(m, ip, version)
	}
	// Creation timestamps have seconds: the machines' order is their
	// names' when they share one.
	return m
}

// made records the provider's answer and a running Node on m, as the
// machine controller does.
func (w *world) made(m *clusterv1.Machine, ip, version string) {
	w.t.Helper()
	m.Status.ProviderID = "local://" + m.Name
	m.Status.Addresses = []clusterv1.MachineAddress{{Type: clusterv1.MachineInternalIP, Address: ip}}
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: clusterv1.MachineNodeReadyCondition, Status: metav1.ConditionTrue, Reason: "NodeReady"})
	m.Status.Versions.Kubelet = version
	m.Status.Versions.ControlPlane = &clusterv1.ComponentVersions{APIServer: version, ControllerManager: version, Scheduler: version}
	if err := w.c.Status().Update(w.t.Context(), m); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) get(name string) *clusterv1.Machine {
	w.t.Helper()
	m := &clusterv1.Machine{}
	if err := w.c.Get(w.t.Context(), client.ObjectKey{Namespace: w.ns, Name: name}, m); err != nil {
		w.t.Fatalf("reading machine %s: %v", name, err)
	}
	return m
}

func (w *world) delete(name string) {
	w.t.Helper()
	if err := w.c.Delete(w.t.Context(), w.get(name)); err != nil {
		w.t.Fatal(err)
	}
}

// reconcile runs one pass over the cluster in memory (the cluster
// controller would write its status afterwards).
func (w *world) reconcile() (*Result, error) {
	w.t.Helper()
	return w.cp.Reconcile(w.t.Context(), w.cluster, w.set)
}

func (w *world) readyReason() string {
	c := meta.FindStatusCondition(w.cluster.Status.Conditions, clusterv1.ClusterControlPlaneReadyCondition)
	if c == nil {
		return ""
	}
	return c.Reason
}

// Finding 1 of issue 22: a control-plane machine deleted after the
// provider made it, before its status said so, ran a voting member. Its
// hook is kept until the machine controller records the provider's
// answer; then the member is removed (the quorum projected), and only then
// the hook. Before, the hook went at once and the member stayed: scale 1 →
// 3 losing the second machine that way leaves 1 of 2 voters.
func TestMachineDeletedBeforeItsAddressLandedLosesItsMemberFirst(t *testing.T) {
	w := newWorld(t, 3)
	w.machine("c-cp-0", "127.0.9.1", "v1.37.2")
	w.machine("c-cp-1", "", "v1.37.2")
	w.etcd.members = []EtcdMember{voter(0xa, "c-cp-0", "127.0.9.1"), voter(0xb, "c-cp-1", "127.0.9.2")}
	w.delete("c-cp-1")

	if _, err := w.reconcile(); err != nil {
		t.Fatal(err)
	}
	if !hasHook(w.get("c-cp-1")) {
		t.Fatalf("the hook of c-cp-1, deleted before its provider's answer was recorded, was removed while its voting member %x remains (removed: %x)",
			0xb, w.etcd.removedIDs())
	}
	if r := w.readyReason(); r != clusterv1.ClusterWaitingForProviderReason {
		t.Errorf("ControlPlaneReady reason %q, want %s", r, clusterv1.ClusterWaitingForProviderReason)
	}

	// The machine controller learns from the provider that it was made.
	w.made(w.get("c-cp-1"), "127.0.9.2", "v1.37.2")
	w.now = w.now.Add(time.Minute) // the endpoint has stopped sending to it
	if _, err := w.reconcile(); err != nil {
		t.Fatal(err)
	}
	if got := w.etcd.removedIDs(); !slices.Equal(got, []uint64{0xb}) {
		t.Errorf("members removed: %x, want c-cp-1's b", got)
	}
	if hasHook(w.get("c-cp-1")) {
		t.Errorf("c-cp-1's member is removed, but its hook is still there")
	}
}

// Finding 2: when the members cannot be listed (a leader change, a
// status timeout), a made machine being deleted keeps its hook and its
// member (it may have one), and the condition says why; the next pass
// that sees etcd goes through the drain wait and the quorum projection.
// Before, every machine read "no member", and the member was removed at
// once, by a removal that had no check of its own.
func TestNothingChangesMembershipWhileEtcdCannotBeListed(t *testing.T) {
	w := newWorld(t, 3)
	for i := range 3 {
		w.machine("c-cp-"+strconv.Itoa(i), "127.0.9."+strconv.Itoa(i+1), "v1.37.2")
	}
	w.etcd.members = []EtcdMember{voter(0xa, "c-cp-0", "127.0.9.1"), voter(0xb, "c-cp-1", "127.0.9.2"), voter(0xc, "c-cp-2", "127.0.9.3")}
	w.etcd.errs = map[int]error{1: errors.New("etcdserver: leader changed")}
	w.delete("c-cp-2")

	if _, err := w.reconcile(); err != nil {
		t.Fatal(err)
	}
	if got := w.etcd.removedIDs(); len(got) > 0 {
		t.Fatalf("etcd could not be listed, yet members were removed: %x", got)
	}
	if !hasHook(w.get("c-cp-2")) {
		t.Fatalf("etcd could not be listed, yet the hook of c-cp-2 was removed")
	}
	if r := w.readyReason(); r != clusterv1.ClusterEtcdMembershipUnknownReason {
		t.Errorf("ControlPlaneReady reason %q, want %s", r, clusterv1.ClusterEtcdMembershipUnknownReason)
	}

	// etcd answers again; the endpoint has stopped sending to c-cp-2.
	w.now = w.now.Add(time.Minute)
	if _, err := w.reconcile(); err != nil {
		t.Fatal(err)
	}
	if got := w.etcd.removedIDs(); !slices.Equal(got, []uint64{0xc}) {
		t.Errorf("members removed: %x, want c-cp-2's c", got)
	}
	if hasHook(w.get("c-cp-2")) {
		t.Errorf("c-cp-2's member is removed, but its hook is still there")
	}
}

// Finding 2, the executor's side: the members are listed again before a
// removal, and a member that stopped answering since the planner looked
// is not counted on. Before, removeMember removed whatever it found.
func TestMemberRemovalProjectsTheQuorumAgain(t *testing.T) {
	w := newWorld(t, 3)
	for i := range 3 {
		w.machine("c-cp-"+strconv.Itoa(i), "127.0.9."+strconv.Itoa(i+1), "v1.37.2")
	}
	healthy := []EtcdMember{voter(0xa, "c-cp-0", "127.0.9.1"), voter(0xb, "c-cp-1", "127.0.9.2"), voter(0xc, "c-cp-2", "127.0.9.3")}
	w.etcd.members = healthy
	w.delete("c-cp-0")
	w.now = w.now.Add(time.Minute)
	// The planner's look sees three healthy voters; the executor's, a
	// moment later, sees c-cp-1's stopped: removing c-cp-0's would leave
	// one healthy of two.
	sick := slices.Clone(healthy)
	sick[1].Healthy = false
	w.etcd.views = map[int][]EtcdMember{2: sick}

	_, err := w.reconcile()
	if got := w.etcd.removedIDs(); len(got) > 0 {
		t.Fatalf("members removed: %x; want none, the removal would lose the quorum", got)
	}
	if err == nil {
		t.Errorf("no error from a removal refused for the quorum")
	}
	if !hasHook(w.get("c-cp-0")) {
		t.Errorf("c-cp-0's member stays, but its hook was removed")
	}
}

// A member of no machine (its machine went without it) is removed when
// the members left keep a quorum, as upstream KubeadmControlPlane does;
// never when they would not. Before, nothing removed it, and a learner
// left that way blocked every scale-up for good.
func TestMemberOfNoMachineIsRemovedWhenQuorumHolds(t *testing.T) {
	t.Run("a learner left by a deleted machine, blocking scale-up", func(t *testing.T) {
		w := newWorld(t, 2)
		w.machine("c-cp-0", "127.0.9.1", "v1.37.2")
		w.etcd.members = []EtcdMember{voter(0xa, "c-cp-0", "127.0.9.1"), {ID: 0xb, PeerURLs: []string{"https://127.0.9.2:2380"}, Learner: true}}
		if _, err := w.reconcile(); err != nil {
			t.Fatal(err)
		}
		if got := w.etcd.removedIDs(); !slices.Equal(got, []uint64{0xb}) {
			t.Fatalf("members removed: %x, want the learner b of no machine", got)
		}
		res, err := w.reconcile()
		if err != nil {
			t.Fatal(err)
		}
		if res.Step.Action != Create {
			t.Errorf("after the learner's removal: step %+v, want Create", res.Step)
		}
	})
	t.Run("a voter that does not answer", func(t *testing.T) {
		w := newWorld(t, 3)
		w.machine("c-cp-0", "127.0.9.1", "v1.37.2")
		w.machine("c-cp-2", "127.0.9.3", "v1.37.2")
		stale := voter(0xb, "c-cp-1", "127.0.9.2")
		stale.Healthy = false
		w.etcd.members = []EtcdMember{voter(0xa, "c-cp-0", "127.0.9.1"), stale, voter(0xc, "c-cp-2", "127.0.9.3")}
		if _, err := w.reconcile(); err != nil {
			t.Fatal(err)
		}
		if got := w.etcd.removedIDs(); !slices.Equal(got, []uint64{0xb}) {
			t.Fatalf("members removed: %x, want b, of no machine", got)
		}
	})
	t.Run("not when the quorum would be lost", func(t *testing.T) {
		w := newWorld(t, 3)
		w.machine("c-cp-0", "127.0.9.1", "v1.37.2")
		w.machine("c-cp-2", "127.0.9.3", "v1.37.2")
		down := voter(0xc, "c-cp-2", "127.0.9.3")
		down.Healthy = false
		w.etcd.members = []EtcdMember{voter(0xa, "c-cp-0", "127.0.9.1"), voter(0xb, "old", "127.0.9.2"), down}
		if _, err := w.reconcile(); err != nil {
			t.Fatal(err)
		}
		if got := w.etcd.removedIDs(); len(got) > 0 {
			t.Fatalf("members removed: %x; want none: 1 healthy of 2 would be left", got)
		}
	})
	t.Run("not while a machine's address is unknown: the member may be its", func(t *testing.T) {
		w := newWorld(t, 2)
		w.machine("c-cp-0", "127.0.9.1", "v1.37.2")
		w.machine("c-cp-1", "", "v1.37.2")
		w.etcd.members = []EtcdMember{voter(0xa, "c-cp-0", "127.0.9.1"), {ID: 0xb, PeerURLs: []string{"https://127.0.9.2:2380"}, Learner: true}}
		if _, err := w.reconcile(); err != nil {
			t.Fatal(err)
		}
		if got := w.etcd.removedIDs(); len(got) > 0 {
			t.Fatalf("members removed: %x; want none while c-cp-1 is being made", got)
		}
	})
	t.Run("not while a made machine's address is not recorded yet", func(t *testing.T) {
		// A provider may answer with the machine's ID before its address
		// (a cloud assigns the IP later): the machine is made, its member
		// joining (a learner, named once it starts), and nothing on the
		// Machine ties the member to it yet.
		w := newWorld(t, 2)
		w.machine("c-cp-0", "127.0.9.1", "v1.37.2")
		m := w.machine("c-cp-1", "", "v1.37.2")
		m.Status.ProviderID = "local://c-cp-1"
		if err := w.c.Status().Update(t.Context(), m); err != nil {
			t.Fatal(err)
		}
		w.etcd.members = []EtcdMember{voter(0xa, "c-cp-0", "127.0.9.1"), {ID: 0xb, PeerURLs: []string{"https://127.0.9.2:2380"}, Learner: true}}
		for range 2 {
			if _, err := w.reconcile(); err != nil {
				t.Fatal(err)
			}
		}
		if got := w.etcd.removedIDs(); len(got) > 0 {
			t.Fatalf("members removed: %x; want none while c-cp-1's address is unknown", got)
		}
	})
}

// A machine's member is recorded on it by ID the first time it is seen;
// from then on a member with its name (a stale one) is not taken for it,
// and a machine whose recorded member is gone is replaced.
func TestMembersAreKnownByTheIDRecordedOnTheirMachine(t *testing.T) {
	w := newWorld(t, 3)
	for i := range 3 {
		w.machine("c-cp-"+strconv.Itoa(i), "127.0.9."+strconv.Itoa(i+1), "v1.37.2")
	}
	w.etcd.members = []EtcdMember{voter(0xa, "c-cp-0", "127.0.9.1"), voter(0xb, "c-cp-1", "127.0.9.2"), voter(0xc, "c-cp-2", "127.0.9.3")}
	if _, err := w.reconcile(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"a", "b", "c"} {
		name := "c-cp-" + strconv.Itoa(i)
		if got := w.get(name).Annotations[clusterv1.EtcdMemberIDAnnotation]; got != want {
			t.Errorf("machine %s records member %q, want %q", name, got, want)
		}
	}

	// c-cp-2's member is removed behind marina's back and another one,
	// named alike at another address, appears.
	w.etcd.members = []EtcdMember{voter(0xa, "c-cp-0", "127.0.9.1"), voter(0xb, "c-cp-1", "127.0.9.2"), voter(0xd, "c-cp-2", "127.0.9.9")}
	res, err := w.reconcile()
	if err != nil {
		t.Fatal(err)
	}
	if res.Step.Action != RemoveMember || res.Step.MemberID != 0xd {
		t.Fatalf("step %+v, want the removal of d, which is no machine's", res.Step)
	}
	res, err = w.reconcile()
	if err != nil {
		t.Fatal(err)
	}
	if res.Step.Action != Remediate || res.Step.Machine != "c-cp-2" {
		t.Fatalf("step %+v, want c-cp-2, whose member is gone, replaced", res.Step)
	}
}

// Control-plane machine names are never used twice: a machine made after
// another was deleted gets a name of its own. Before, the first free
// <cluster>-cp-<n> came back, and its member's name with it.
func TestControlPlaneMachineNamesAreNotReused(t *testing.T) {
	w := newWorld(t, 2)
	w.machine("c-cp-0", "127.0.9.1", "v1.37.2")
	w.etcd.members = []EtcdMember{voter(0xa, "c-cp-0", "127.0.9.1")}
	seen := map[string]bool{"c-cp-0": true}
	for range 3 {
		if _, err := w.reconcile(); err != nil {
			t.Fatal(err)
		}
		machines, err := w.cp.Machines(t.Context(), w.cluster)
		if err != nil {
			t.Fatal(err)
		}
		if len(machines) != 2 {
			t.Fatalf("%d machines, want 2", len(machines))
		}
		name := machines[1].Name
		if seen[name] {
			t.Fatalf("a new control-plane machine is named %s, a name used before", name)
		}
		seen[name] = true
		// It goes before it was made (it holds no finalizer here).
		w.delete(name)
	}
}

// upgradeWorld is a cluster of n control-plane machines at v1.36.3 whose
// spec asks for v1.37.2, its etcd healthy, every component healthy.
func upgradeWorld(t *testing.T, n int32, strategy clusterv1.ControlPlaneUpgradeStrategyType) *world {
	t.Helper()
	w := newWorld(t, n)
	w.cluster.Spec.ControlPlane.UpgradeStrategy.Type = strategy
	for i := range n {
		ip := "127.0.9." + strconv.Itoa(int(i)+1)
		name := "c-cp-" + strconv.Itoa(int(i))
		w.machine(name, ip, "v1.36.3")
		w.etcd.members = append(w.etcd.members, voter(uint64(0xa+i), name, ip))
	}
	return w
}

// report makes m's API server report version, as its agent does once
// the component restarted.
func (w *world) report(name, component, version string) {
	w.t.Helper()
	m := w.get(name)
	switch component {
	case "kube-apiserver":
		m.Status.Versions.ControlPlane.APIServer = version
	case "kube-controller-manager":
		m.Status.Versions.ControlPlane.ControllerManager = version
	default:
		w.t.Fatalf("report: component %s", component)
	}
	if err := w.c.Status().Update(w.t.Context(), m); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) upgradeCondition() *metav1.Condition {
	return meta.FindStatusCondition(w.cluster.Status.Conditions, clusterv1.ClusterUpgradeProgressingCondition)
}

// Finding 3: status.upgrade.current is written after the step's Machine
// patch. Killed in between, status names the step before, finished, on
// another machine; a rollback then must return the step the machines show
// taken, not that one. Before, the earlier machine was rolled back.
func TestRollbackReturnsTheStepTheMachinesShowTaken(t *testing.T) {
	w := upgradeWorld(t, 2, clusterv1.InPlaceUpgrade)
	// Every API server runs v1.37.2, and so does c-cp-0's controller
	// manager: the step status.upgrade records last, finished.
	for _, name := range []string{"c-cp-0", "c-cp-1"} {
		m := w.get(name)
		m.Spec.Versions.Components = &clusterv1.ComponentVersions{APIServer: "v1.37.2"}
		if name == "c-cp-0" {
			m.Spec.Versions.Components.ControllerManager = "v1.37.2"
		}
		if err := w.c.Update(t.Context(), m); err != nil {
			t.Fatal(err)
		}
		w.report(name, "kube-apiserver", "v1.37.2")
	}
	w.report("c-cp-0", "kube-controller-manager", "v1.37.2")
	started := metav1.NewTime(time.Now().Add(-time.Minute))
	last := &clusterv1.UpgradeStep{Action: "SetComponent", Machine: "c-cp-0", Component: "kube-controller-manager", From: "v1.36.3", To: "v1.37.2",
		State: clusterv1.UpgradeStepRunning, StartedAt: &started}
	w.cluster.Status.Upgrade = &clusterv1.UpgradeStatus{From: "v1.36.3", To: "v1.37.2", Strategy: clusterv1.InPlaceUpgrade, StartedAt: &started, Current: last}
	recorded := w.cluster.DeepCopy()

	// A pass takes the next step, c-cp-1's controller manager (no drain:
	// one write); the controller dies before the cluster's status is
	// written, and the component restarts at its new version.
	if _, err := w.reconcile(); err != nil {
		t.Fatal(err)
	}
	if got := w.get("c-cp-1").Spec.Versions.ControlPlaneComponents().ControllerManager; got != "v1.37.2" {
		t.Fatalf("the pass did not take the step on c-cp-1 (its controller manager is asked for %s): %+v", got, w.upgradeCondition())
	}
	w.cluster = recorded
	w.report("c-cp-1", "kube-controller-manager", "v1.37.2")

	// marina upgrade rollback.
	w.cluster.Annotations = map[string]string{clusterv1.UpgradeRollbackAnnotation: strconv.FormatInt(w.cluster.Generation, 10)}
	if _, err := w.reconcile(); err != nil {
		t.Fatal(err)
	}
	if got := w.get("c-cp-0").Spec.Versions.ControlPlaneComponents().ControllerManager; got != "v1.37.2" {
		t.Errorf("c-cp-0's finished step was rolled back: its controller manager is asked for %s, want v1.37.2", got)
	}
	if got := w.get("c-cp-1").Spec.Versions.ControlPlaneComponents().ControllerManager; got != "v1.36.3" {
		t.Errorf("c-cp-1's controller manager is asked for %s after the rollback, want v1.36.3", got)
	}
}

// Finding 4: an AddMachine step (Replace) whose machine never becomes
// healthy halts the upgrade after stepTimeout, also when the controller
// was killed before the step reached status.upgrade. Before, it waited
// with UpgradeProgressing=True for ever.
func TestReplaceStepTimesOut(t *testing.T) {
	w := upgradeWorld(t, 1, clusterv1.ReplaceUpgrade)
	w.cluster.Spec.ControlPlane.UpgradeStrategy.StepTimeout = &metav1.Duration{Duration: time.Second}
	before := w.cluster.DeepCopy()
	if _, err := w.reconcile(); err != nil {
		t.Fatal(err)
	}
	machines, err := w.cp.Machines(t.Context(), w.cluster)
	if err != nil {
		t.Fatal(err)
	}
	if len(machines) != 2 {
		t.Fatalf("%d machines after the first pass, want the new one beside c-cp-0: %+v", len(machines), w.upgradeCondition())
	}
	added := machines[1].Name
	for _, crashed := range []bool{false, true} {
		if crashed {
			w.cluster = before.DeepCopy() // the status of the pass that added it was never written
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := w.reconcile(); err != nil {
				t.Fatal(err)
			}
			c := w.upgradeCondition()
			if c != nil && c.Reason == clusterv1.ClusterUpgradeStepTimeoutReason {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("crashed %t: the added machine %s never became healthy, and UpgradeProgressing is %+v, want StepTimeout", crashed, added, c)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if _, err := w.cp.Machines(t.Context(), w.cluster); err != nil {
			t.Fatal(err)
		}
		// The halt keeps the machine it added: deleting it would only
		// have the next try add another.
		if m := w.get(added); !m.DeletionTimestamp.IsZero() {
			t.Fatalf("crashed %t: the halted upgrade's machine %s was deleted", crashed, added)
		}
	}
}

// Finding 5: a halted upgrade holds the control plane's shape no more:
// scaling down from 3 to 1 goes on, and ControlPlaneReady is not True
// while 3 machines run where 1 is asked for. Before, the scale-down was
// swallowed for good and ControlPlaneReady said True.
func TestHaltedUpgradeLetsTheControlPlaneScaleDown(t *testing.T) {
	w := upgradeWorld(t, 3, clusterv1.InPlaceUpgrade)
	w.cluster.Spec.ControlPlane.Replicas = 1
	// The first step, c-cp-0's API server, never took effect and halted.
	m0 := w.get("c-cp-0")
	m0.Spec.Versions.Components = &clusterv1.ComponentVersions{APIServer: "v1.37.2"}
	m0.Annotations[clusterv1.EndpointDrainAnnotation] = time.Now().Add(-time.Hour).UTC().Format(time.RFC3339Nano)
	if err := w.c.Update(t.Context(), m0); err != nil {
		t.Fatal(err)
	}
	started := metav1.NewTime(time.Now().Add(-time.Hour))
	step := &clusterv1.UpgradeStep{Action: "SetComponent", Machine: "c-cp-0", Component: "kube-apiserver", From: "v1.36.3", To: "v1.37.2",
		State: clusterv1.UpgradeStepFailed, StartedAt: &started}
	w.cluster.Status.Upgrade = &clusterv1.UpgradeStatus{From: "v1.36.3", To: "v1.37.2", Strategy: clusterv1.InPlaceUpgrade, StartedAt: &started, Current: step}
	setUpgrading(w.cluster, metav1.ConditionFalse, clusterv1.ClusterUpgradeStepTimeoutReason, "halted")

	res, err := w.reconcile()
	if err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(w.cluster.Status.Conditions, clusterv1.ClusterControlPlaneReadyCondition); c == nil || c.Status == metav1.ConditionTrue {
		t.Errorf("ControlPlaneReady %+v with 3 machines where 1 is asked for, want False", c)
	}
	if res.Step.Action != Delete {
		t.Fatalf("step %+v, want a scale-down Delete", res.Step)
	}
	if m := w.get(res.Step.Machine); m.DeletionTimestamp.IsZero() {
		t.Errorf("machine %s is not being deleted", m.Name)
	}
}

// intruder makes a machine labelled as the cluster's control plane that
// the Cluster does not own, as an administrator (or a hole in admission)
// could: the machine controller gave it the Cluster as a plain owner, as
// it does every machine without a controller. It runs and is Ready.
func (w *world) intruder(name, ip string) *clusterv1.Machine {
	w.t.Helper()
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name,
			Labels: map[string]string{clusterv1.ClusterNameLabel: w.cluster.Name, clusterv1.ControlPlaneLabel: ""}},
		Spec: clusterv1.MachineSpec{ClusterName: w.cluster.Name, Roles: []clusterv1.MachineRole{clusterv1.ControlPlaneRole},
			ProviderSpec: w.cluster.Spec.ControlPlane.ProviderSpec.DeepCopy(),
			Versions:     clusterv1.MachineVersions{Kubelet: "v1.37.2", ControlPlane: "v1.37.2"}},
	}
	if err := controllerutil.SetOwnerReference(w.cluster, m, w.c.Scheme()); err != nil {
		w.t.Fatal(err)
	}
	if err := w.c.Create(w.t.Context(), m); err != nil {
		w.t.Fatal(err)
	}
	w.made(m, ip, "v1.37.2")
	return m
}

// Issue 24, finding 3: control-plane membership is ownership, not a
// label. A labelled machine the Cluster does not control never counts:
// with two members of three wanted, the control plane still adds the
// third; with one wanted, it never scales down for it, nor deletes it; it
// is refused the control-plane bootstrap (the cluster's keys), and the
// Cluster names it. Before, the labels alone made a member: the intruder
// filled the third seat, and a surplus it made was scaled away.
func TestUnownedControlPlaneMachineNeverCounts(t *testing.T) {
	t.Run("it fills no seat", func(t *testing.T) {
		w := newWorld(t, 3)
		w.machine("c-cp-0", "127.0.9.1", "v1.37.2")
		w.machine("c-cp-1", "127.0.9.2", "v1.37.2")
		w.etcd.members = []EtcdMember{voter(0xa, "c-cp-0", "127.0.9.1"), voter(0xb, "c-cp-1", "127.0.9.2")}
		w.intruder("tenant-cp", "127.0.9.66")

		res, err := w.reconcile()
		if err != nil {
			t.Fatal(err)
		}
		if res.Step.Action != Create {
			t.Errorf("step %+v with 2 owned machines of 3 wanted; want Create (the unowned machine fills no seat)", res.Step)
		}
		for _, m := range res.Machines {
			if m.Name == "tenant-cp" {
				t.Errorf("the control plane's machines include tenant-cp, which the Cluster does not own")
			}
		}
		c := meta.FindStatusCondition(w.cluster.Status.Conditions, clusterv1.ClusterControlPlaneMachinesOwnedCondition)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != clusterv1.ClusterUnownedControlPlaneMachineReason || !strings.Contains(c.Message, "tenant-cp") {
			t.Errorf("ControlPlaneMachinesOwned = %+v; want False, %s, naming tenant-cp", c, clusterv1.ClusterUnownedControlPlaneMachineReason)
		}
		_, err = w.cp.Bootstrap(t.Context(), w.get("tenant-cp"))
		if err == nil || !strings.Contains(err.Error(), "machine tenant-cp is not a member of cluster c's control plane") {
			t.Errorf("bootstrap of tenant-cp: %v; want it refused as no member", err)
		}
	})
	t.Run("it is never scaled away, nor makes an owned one go", func(t *testing.T) {
		w := newWorld(t, 1)
		w.machine("c-cp-0", "127.0.9.1", "v1.37.2")
		w.etcd.members = []EtcdMember{voter(0xa, "c-cp-0", "127.0.9.1")}
		w.intruder("tenant-cp", "127.0.9.66")

		res, err := w.reconcile()
		if err != nil {
			t.Fatal(err)
		}
		if res.Step.Action != Done {
			t.Errorf("step %+v with 1 owned machine of 1 wanted; want Done", res.Step)
		}
		for _, name := range []string{"c-cp-0", "tenant-cp"} {
			if m := w.get(name); !m.DeletionTimestamp.IsZero() {
				t.Errorf("%s is being deleted", name)
			}
		}
		if n := w.cluster.Status.ControlPlane.Replicas; n != 1 {
			t.Errorf("status.controlPlane.replicas %d, want 1", n)
		}
	})
}

// A step record lives as long as its upgrade. Once an upgrade is done its
// records are taken off the machines; before, a component that fell
// behind later (the finished upgrade resumes) had the old record adopted
// as the step under way, its start an hour back, and the upgrade halted
// at once with StepTimeout.
func TestFinishedUpgradeLeavesNoStepRecordToAdopt(t *testing.T) {
	w := newWorld(t, 1)
	w.machine("c-cp-0", "127.0.9.1", "v1.37.2")
	w.etcd.members = []EtcdMember{voter(0xa, "c-cp-0", "127.0.9.1")}
	started := metav1.NewTime(time.Now().Add(-time.Hour))
	done := metav1.NewTime(time.Now().Add(-50 * time.Minute))
	old := &clusterv1.UpgradeStep{Action: "SetComponent", Machine: "c-cp-0", Component: "kube-apiserver", From: "v1.36.3", To: "v1.37.2",
		State: clusterv1.UpgradeStepRunning, StartedAt: &started}
	rec, err := encodeStep(old)
	if err != nil {
		t.Fatal(err)
	}
	m := w.get("c-cp-0")
	m.Annotations[clusterv1.UpgradeStepAnnotation] = rec
	if err := w.c.Update(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	w.cluster.Status.Upgrade = &clusterv1.UpgradeStatus{From: "v1.36.3", To: "v1.37.2", Strategy: clusterv1.InPlaceUpgrade, StartedAt: &started, CompletedAt: &done}

	// A settled pass.
	if _, err := w.reconcile(); err != nil {
		t.Fatal(err)
	}
	if v, ok := w.get("c-cp-0").Annotations[clusterv1.UpgradeStepAnnotation]; ok {
		t.Errorf("the finished upgrade's step record is still on c-cp-0: %s", v)
	}

	// Its API server falls behind (restored from an old spec, say).
	m = w.get("c-cp-0")
	m.Spec.Versions.Components = &clusterv1.ComponentVersions{APIServer: "v1.36.3"}
	if err := w.c.Update(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	w.report("c-cp-0", "kube-apiserver", "v1.36.3")
	if _, err := w.reconcile(); err != nil {
		t.Fatal(err)
	}
	if c := w.upgradeCondition(); c == nil || c.Reason == clusterv1.ClusterUpgradeStepTimeoutReason {
		t.Fatalf("UpgradeProgressing %+v: an old step record was taken for the step under way", c)
	}
	if got := w.get("c-cp-0").Spec.Versions.ControlPlaneComponents().APIServer; got != "v1.37.2" {
		t.Errorf("c-cp-0's API server is asked for %s, want v1.37.2 again", got)
	}
}

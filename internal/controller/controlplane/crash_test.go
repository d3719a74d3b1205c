package controlplane

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/pki"
)

// The crash-point harness (issue 22): the control plane runs a scenario
// against the API server, a simulated etcd and simulated machines (the
// machine controller, its provider and each machine's agent), and is
// killed after its k-th write (a Machine, or the Cluster's status as the
// cluster controller writes it after each pass); a fresh control plane,
// knowing nothing, takes over the same state. Every k from 1 to the
// number of writes an uninterrupted run makes is tried. After every pass
// the etcd keeps its quorum; at the end the control plane has its
// replicas, every member is a machine's (by the ID recorded on it) and
// votes, and no sandbox is left without its Machine.
//
// -crash-points=all tries every k; the default tries every third, which
// still crosses every kind of write of every scenario.
var crashPoints = flag.String("crash-points", "sample", "which crash points the harness tries: sample or all")

var debugHarness = flag.Bool("debug-harness", false, "log every pass of the crash-point harness")

func (s *sim) logPass(pass int, res *Result, err error) {
	var members []string
	for _, m := range s.etcd.members {
		members = append(members, fmt.Sprintf("%x:%s@%s learner=%t running=%t", m.id, m.name, m.ip, m.learner, m.running))
	}
	var machines []string
	for _, m := range s.machines() {
		machines = append(machines, fmt.Sprintf("%s made=%t ready=%t deleting=%t hook=%t", m.Name, made(&m), machineReady(&m), !m.DeletionTimestamp.IsZero(), preTerminateHook(&m)))
	}
	step := Step{}
	if res != nil {
		step = res.Step
	}
	s.t.Logf("pass %d: step %s %s %x %q err=%v\n  machines %v\n  members %v", pass, step.Action, step.Machine, step.MemberID, step.Reason, err, machines, members)
}

// errKilled is what a killed process's writes return.
var errKilled = errors.New("killed")

// crashClient is the control plane's client: reads go through; the k-th
// write is the last that does.
type crashClient struct {
	client.Client
	mu     sync.Mutex
	writes int
	limit  int // killed right after this write; 0: never
	killed bool
}

// write counts a write; the limit-th is made, and every later one fails:
// the process died right after it.
func (c *crashClient) write() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.killed {
		return errKilled
	}
	c.writes++
	c.killed = c.limit > 0 && c.writes == c.limit
	return nil
}

func (c *crashClient) isKilled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.killed
}

func (c *crashClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := c.write(); err != nil {
		return err
	}
	return c.Client.Create(ctx, obj, opts...)
}

func (c *crashClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := c.write(); err != nil {
		return err
	}
	return c.Client.Update(ctx, obj, opts...)
}

func (c *crashClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if err := c.write(); err != nil {
		return err
	}
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c *crashClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	if err := c.write(); err != nil {
		return err
	}
	return c.Client.Delete(ctx, obj, opts...)
}

func (c *crashClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	if err := c.write(); err != nil {
		return err
	}
	return c.Client.Apply(ctx, obj, opts...)
}

func (c *crashClient) Status() client.SubResourceWriter { return crashStatus{c} }

type crashStatus struct{ c *crashClient }

func (s crashStatus) Create(ctx context.Context, obj client.Object, sub client.Object, opts ...client.SubResourceCreateOption) error {
	if err := s.c.write(); err != nil {
		return err
	}
	return s.c.Client.Status().Create(ctx, obj, sub, opts...)
}

func (s crashStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if err := s.c.write(); err != nil {
		return err
	}
	return s.c.Client.Status().Update(ctx, obj, opts...)
}

func (s crashStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if err := s.c.write(); err != nil {
		return err
	}
	return s.c.Client.Status().Patch(ctx, obj, patch, opts...)
}

func (s crashStatus) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	if err := s.c.write(); err != nil {
		return err
	}
	return s.c.Client.Status().Apply(ctx, obj, opts...)
}

// simMember is one etcd member of the simulation.
type simMember struct {
	id      uint64
	name    string
	ip      string
	learner bool
	running bool // its process runs (its sandbox does, and started it)
}

// simEtcd is the etcd of the simulated machines: members are added as
// learners by the joining machines' agents, start, are promoted, and stop
// when their sandbox goes. Nothing that needs a quorum is done without one.
type simEtcd struct {
	mu      sync.Mutex
	members []*simMember
	nextID  uint64
}

func (e *simEtcd) quorum() bool {
	voters, running := 0, 0
	for _, m := range e.members {
		if !m.learner {
			voters++
			if m.running {
				running++
			}
		}
	}
	return voters == 0 || running >= voters/2+1
}

func (e *simEtcd) dial(context.Context, []string, []byte, []byte, []byte) (Etcd, error) {
	return e, nil
}

func (e *simEtcd) Members(context.Context) ([]EtcdMember, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.quorum() {
		return nil, errors.New("etcdserver: request timed out")
	}
	out := make([]EtcdMember, 0, len(e.members))
	for _, m := range e.members {
		out = append(out, EtcdMember{ID: m.id, Name: m.name, PeerURLs: []string{"https://" + m.ip + ":2380"},
			Learner: m.learner, Healthy: m.running && !m.learner})
	}
	return out, nil
}

func (e *simEtcd) RemoveMember(_ context.Context, id uint64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.quorum() {
		return errors.New("etcdserver: request timed out")
	}
	e.members = slices.DeleteFunc(e.members, func(m *simMember) bool { return m.id == id })
	return nil
}

func (e *simEtcd) Close() error { return nil }

func (e *simEtcd) byIP(ip string) *simMember {
	for _, m := range e.members {
		if m.ip == ip {
			return m
		}
	}
	return nil
}

// simSandbox is a machine the simulated provider made.
type simSandbox struct {
	ip    string
	ticks int  // passes since it was made
	dead  bool // killed: nothing of it runs
}

// scenario is what the harness drives: a cluster of start ready machines
// asked for replicas; kill names the machines that die at the start and
// are marked for remediation; deleteEarly deletes that many new machines
// the moment their member votes, before their address is recorded.
type scenario struct {
	name        string
	start       int
	replicas    int32
	kill        int
	deleteEarly int
}

// statusDelay: a new machine's status (its address) is recorded this many
// passes after the provider made it (a slow Create): its agent has added,
// started and promoted its member by then.
const statusDelay = 3

// sim is the world around the control plane.
type sim struct {
	t         *testing.T
	c         client.Client // the other controllers' and the user's
	ns        string
	cluster   string
	etcd      *simEtcd
	sandboxes map[types.UID]*simSandbox
	nextIP    int
	now       time.Time
	deleted   int // machines deleted early so far
	sc        scenario
	set       *clusterpki.Set
}

func newSim(t *testing.T, sc scenario) *sim {
	t.Helper()
	e := apiServer(t)
	etcdCA, err := pki.NewCA("etcd-ca")
	if err != nil {
		t.Fatal(err)
	}
	s := &sim{t: t, c: e.Client, ns: e.Namespace(t), cluster: "c", etcd: &simEtcd{}, sandboxes: map[types.UID]*simSandbox{}, now: time.Now(), sc: sc,
		set: &clusterpki.Set{Etcd: etcdCA}}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: s.cluster},
		Spec: clusterv1.ClusterSpec{ControlPlane: clusterv1.ControlPlaneSpec{Version: "v1.37.2", Replicas: 1}}}
	cluster.Spec.ControlPlane.ProviderSpec = newWorldProviderSpec()
	if err := s.c.Create(t.Context(), cluster); err != nil {
		t.Fatal(err)
	}
	// The starting machines run and vote.
	for i := range sc.start {
		m := &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "c-cp-" + strconv.Itoa(i),
				Labels:      map[string]string{clusterv1.ClusterNameLabel: s.cluster, clusterv1.ControlPlaneLabel: ""},
				Annotations: map[string]string{clusterv1.EtcdMemberHook: ""}, Finalizers: []string{clusterv1.MachineFinalizer}},
			Spec: clusterv1.MachineSpec{ClusterName: s.cluster, Roles: []clusterv1.MachineRole{clusterv1.ControlPlaneRole},
				ProviderSpec: newWorldProviderSpec(), Versions: clusterv1.MachineVersions{Kubelet: "v1.37.2", ControlPlane: "v1.37.2"}},
		}
		if err := controllerutil.SetControllerReference(cluster, m, s.c.Scheme()); err != nil {
			t.Fatal(err)
		}
		if err := s.c.Create(t.Context(), m); err != nil {
			t.Fatal(err)
		}
		sb := s.makeSandbox(m)
		s.etcd.members = append(s.etcd.members, &simMember{id: s.newID(), name: m.Name, ip: sb.ip, running: true})
		s.recordStatus(m, sb)
	}
	// Scaling (and the deaths) begin now.
	cluster = s.getCluster()
	cluster.Spec.ControlPlane.Replicas = sc.replicas
	if sc.replicas%2 == 0 {
		t.Fatalf("scenario %s: even replicas", sc.name)
	}
	if err := s.c.Update(t.Context(), cluster); err != nil {
		t.Fatal(err)
	}
	setCondition(cluster, clusterv1.ClusterControlPlaneInitializedCondition, metav1.ConditionTrue, clusterv1.ClusterControlPlaneInitializedReason, "")
	if err := s.c.Status().Update(t.Context(), cluster); err != nil {
		t.Fatal(err)
	}
	for _, m := range s.machines()[:sc.kill] {
		s.sandboxes[m.UID].dead = true
		for _, member := range s.etcd.members {
			if member.name == m.Name {
				member.running = false
			}
		}
		patch := client.MergeFrom(m.DeepCopy())
		m.Annotations[clusterv1.RemediationReasonAnnotation] = "NodeNotReady: the node is gone"
		if err := s.c.Patch(t.Context(), &m, patch); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func (s *sim) newID() uint64 { s.etcd.nextID++; return 0x100 + s.etcd.nextID }

func (s *sim) makeSandbox(m *clusterv1.Machine) *simSandbox {
	s.nextIP++
	sb := &simSandbox{ip: "127.0.8." + strconv.Itoa(s.nextIP)}
	s.sandboxes[m.UID] = sb
	return sb
}

func (s *sim) getCluster() *clusterv1.Cluster {
	s.t.Helper()
	cluster := &clusterv1.Cluster{}
	if err := s.c.Get(s.t.Context(), client.ObjectKey{Namespace: s.ns, Name: s.cluster}, cluster); err != nil {
		s.t.Fatal(err)
	}
	return cluster
}

func (s *sim) machines() []clusterv1.Machine {
	s.t.Helper()
	var list clusterv1.MachineList
	if err := s.c.List(s.t.Context(), &list, client.InNamespace(s.ns)); err != nil {
		s.t.Fatal(err)
	}
	slices.SortFunc(list.Items, func(a, b clusterv1.Machine) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return compareStrings(a.Name, b.Name)
	})
	return list.Items
}

// recordStatus is the machine controller recording the provider's answer,
// and the Node's readiness as its agent reports it.
func (s *sim) recordStatus(m *clusterv1.Machine, sb *simSandbox) {
	s.t.Helper()
	before := m.DeepCopy()
	m.Status.ProviderID = "sim://" + string(m.UID)
	m.Status.Addresses = []clusterv1.MachineAddress{{Type: clusterv1.MachineInternalIP, Address: sb.ip}}
	member := s.etcd.byIP(sb.ip)
	ready := !sb.dead && member != nil && member.running && !member.learner
	status := metav1.ConditionFalse
	if ready {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: clusterv1.MachineNodeReadyCondition, Status: status, Reason: "Sim"})
	m.Status.Versions.Kubelet = "v1.37.2"
	m.Status.Versions.ControlPlane = &clusterv1.ComponentVersions{APIServer: "v1.37.2", ControllerManager: "v1.37.2", Scheduler: "v1.37.2"}
	if err := s.c.Status().Patch(s.t.Context(), m, client.MergeFrom(before)); client.IgnoreNotFound(err) != nil {
		s.t.Fatal(err)
	}
}

func (s *sim) dropFinalizer(m *clusterv1.Machine) {
	s.t.Helper()
	patch := client.MergeFrom(m.DeepCopy())
	m.Finalizers = nil
	if err := s.c.Patch(s.t.Context(), m, patch); client.IgnoreNotFound(err) != nil {
		s.t.Fatal(err)
	}
}

// step moves every machine one step on, as the machine controller, the
// provider and the agents would between two passes of the control plane.
func (s *sim) step() {
	s.t.Helper()
	s.etcd.mu.Lock()
	defer s.etcd.mu.Unlock()
	for _, m := range s.machines() {
		sb := s.sandboxes[m.UID]
		if !m.DeletionTimestamp.IsZero() {
			switch {
			case sb == nil:
				s.dropFinalizer(&m) // never made
			case !made(&m):
				s.recordStatus(&m, sb) // the machine controller asks the provider
			case preTerminateHook(&m):
			default:
				// The provider deletes the machine: its member stops.
				if member := s.etcd.byIP(sb.ip); member != nil {
					member.running = false
				}
				delete(s.sandboxes, m.UID)
				s.dropFinalizer(&m)
			}
			continue
		}
		if len(m.Finalizers) == 0 {
			// The machine controller holds every machine it takes.
			patch := client.MergeFrom(m.DeepCopy())
			m.Finalizers = []string{clusterv1.MachineFinalizer}
			if err := s.c.Patch(s.t.Context(), &m, patch); err != nil {
				s.t.Fatal(err)
			}
		}
		if sb == nil {
			if !s.etcd.quorum() {
				continue // the agent cannot add its member: the machine is not made yet
			}
			sb = s.makeSandbox(&m)
			if m.Annotations[clusterv1.EtcdInitAnnotation] == "true" {
				s.etcd.members = append(s.etcd.members, &simMember{id: s.newID(), name: m.Name, ip: sb.ip, running: true})
			} else {
				s.etcd.members = append(s.etcd.members, &simMember{id: s.newID(), ip: sb.ip, learner: true})
			}
			continue
		}
		sb.ticks++
		member := s.etcd.byIP(sb.ip)
		switch {
		case sb.dead || member == nil:
		case !member.running:
			member.running, member.name = true, m.Name
		case member.learner && s.etcd.quorum():
			member.learner = false
		}
		if member != nil && !member.learner && s.deleted < s.sc.deleteEarly && !made(&m) {
			// The user deletes it the moment its member votes, before
			// its address is recorded.
			s.deleted++
			if err := s.c.Delete(s.t.Context(), &m); err != nil {
				s.t.Fatal(err)
			}
			continue
		}
		if made(&m) || sb.ticks >= statusDelay {
			s.recordStatus(&m, sb)
		}
	}
}

func preTerminateHook(m *clusterv1.Machine) bool {
	_, ok := m.Annotations[clusterv1.EtcdMemberHook]
	return ok
}

// quorumLost: the voters that run are no quorum of the voters.
func (s *sim) quorumLost() bool {
	s.etcd.mu.Lock()
	defer s.etcd.mu.Unlock()
	return !s.etcd.quorum()
}

// converged checks the end state, "" when it holds.
func (s *sim) converged() string {
	s.etcd.mu.Lock()
	defer s.etcd.mu.Unlock()
	machines := s.machines()
	if len(machines) != int(s.sc.replicas) {
		return fmt.Sprintf("%d machines, want %d", len(machines), s.sc.replicas)
	}
	ids := map[uint64]bool{}
	for _, m := range machines {
		if !m.DeletionTimestamp.IsZero() || !machineReady(&m) {
			return fmt.Sprintf("machine %s is not ready (or is being deleted)", m.Name)
		}
		id, ok := recordedMember(&m)
		if !ok {
			return fmt.Sprintf("machine %s records no member", m.Name)
		}
		ids[id] = true
		if s.sandboxes[m.UID] == nil {
			return fmt.Sprintf("machine %s has no sandbox", m.Name)
		}
	}
	if len(s.sandboxes) != len(machines) {
		return fmt.Sprintf("%d sandboxes for %d machines", len(s.sandboxes), len(machines))
	}
	if len(s.etcd.members) != len(machines) {
		return fmt.Sprintf("%d etcd members for %d machines", len(s.etcd.members), len(machines))
	}
	for _, member := range s.etcd.members {
		if !ids[member.id] || member.learner || !member.running {
			return fmt.Sprintf("etcd member %x (%s) is no machine's, or does not vote and run", member.id, member.name)
		}
	}
	return ""
}

// run drives the scenario with the control plane killed after its limit-th
// write (0: never) and returns how many writes the first control plane
// made, whether it was killed, and the violations seen.
func (s *sim) run(limit int) (writes int, killed bool, violations []string) {
	s.t.Helper()
	ctx := s.t.Context()
	cc := &crashClient{Client: s.c, limit: limit}
	first := cc
	cp := s.controlPlane(cc)
	const maxPasses = 80
	for pass := range maxPasses {
		cluster := s.getCluster()
		before := cluster.DeepCopy()
		res, err := cp.Reconcile(ctx, cluster, s.set)
		if *debugHarness {
			s.logPass(pass, res, err)
		}
		if !cc.isKilled() && !equality.Semantic.DeepEqual(before.Status, cluster.Status) {
			_ = cc.Status().Patch(ctx, cluster, client.MergeFrom(before)) // the cluster controller's deferred write
		}
		if cc.isKilled() {
			// A fresh process takes over the same state.
			cc = &crashClient{Client: s.c}
			cp = s.controlPlane(cc)
		}
		s.step()
		s.now = s.now.Add(10 * time.Second)
		if s.quorumLost() {
			violations = append(violations, fmt.Sprintf("pass %d: etcd lost its quorum", pass))
			break
		}
		if pass > 0 && s.converged() == "" {
			return first.writes, first.killed, violations
		}
	}
	return first.writes, first.killed, append(violations, "not converged after "+strconv.Itoa(maxPasses)+" passes: "+s.converged())
}

func (s *sim) controlPlane(c client.Client) *ControlPlane {
	return &ControlPlane{Client: c, Live: s.c, Etcd: s.etcd.dial, Now: func() time.Time { return s.now },
		Probe: func(_ context.Context, _ *clusterpki.Set, machines []clusterv1.Machine) map[string]string {
			out := map[string]string{}
			for _, m := range machines {
				if !machineReady(&m) {
					out[m.Name] = "its Node is not Ready"
				}
			}
			return out
		}}
}

// TestControlPlaneKilledAtEveryWriteConverges is the crash-point harness.
func TestControlPlaneKilledAtEveryWriteConverges(t *testing.T) {
	scenarios := []scenario{
		{name: "scale 1 to 3", start: 1, replicas: 3},
		{name: "scale 3 to 1", start: 3, replicas: 1},
		{name: "remediate a dead machine", start: 3, replicas: 3, kill: 1},
		{name: "scale 1 to 3, two new machines deleted before their address landed", start: 1, replicas: 3, deleteEarly: 2},
	}
	tried, violations := 0, 0
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			writes, _, v := newSim(t, sc).run(0)
			for _, msg := range v {
				t.Errorf("uninterrupted: %s", msg)
			}
			if t.Failed() {
				return
			}
			every := 3
			if *crashPoints == "all" {
				every = 1
			}
			for k := 1; k <= writes; k++ {
				if every > 1 && k%every != 1 && k != writes {
					continue
				}
				tried++
				_, killed, v := newSim(t, sc).run(k)
				if !killed {
					t.Errorf("killed after write %d: the run made fewer writes than the uninterrupted one", k)
				}
				for _, msg := range v {
					violations++
					t.Errorf("killed after write %d of %d: %s", k, writes, msg)
				}
			}
			t.Logf("%s: %d writes uninterrupted", sc.name, writes)
		})
	}
	t.Logf("crash points tried: %d, violations: %d", tried, violations)
}

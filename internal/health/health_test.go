package health

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// spec: Ready=Unknown or False for 5m, nodes must register within 10m.
func spec(maxUnhealthy *intstr.IntOrString) Spec {
	return Spec{
		Conditions: []Condition{
			{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Timeout: 5 * time.Minute},
			{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Timeout: 5 * time.Minute},
		},
		NodeStartupTimeout: 10 * time.Minute,
		MaxUnhealthy:       maxUnhealthy,
	}
}

func node(status corev1.ConditionStatus, since time.Time) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: status, LastTransitionTime: metav1.NewTime(since)},
		}},
	}
}

// worker is a machine of a set whose Node has been Ready since t0.
func worker(name string) Machine {
	return Machine{Name: name, OwnedBySet: true, HadNode: true, Node: node(corev1.ConditionTrue, t0), Started: t0}
}

func with(m Machine, change func(*Machine)) Machine { change(&m); return m }

func notReadyFor(d time.Duration, now time.Time) func(*Machine) {
	return func(m *Machine) { m.Node = node(corev1.ConditionUnknown, now.Add(-d)) }
}

func TestDecide(t *testing.T) {
	now := t0.Add(time.Hour)
	pct := func(s string) *intstr.IntOrString { v := intstr.FromString(s); return &v }
	num := func(i int) *intstr.IntOrString { v := intstr.FromInt32(int32(i)); return &v }
	dead := notReadyFor(6*time.Minute, now)

	type want struct {
		reason  string // "" for healthy
		action  Action
		message string // a part of the message
	}
	tests := []struct {
		name         string
		max          *intstr.IntOrString
		machines     []Machine
		want         []want
		healthy      int
		allowed      bool
		remAllowed   int
		requeueAfter time.Duration // from now; 0: no requeue
		resumedAgo   time.Duration // Spec.Resumed, before now; 0: never stopped
		records      []Remediation // Spec.Remediations
		pending      int           // Plan.Pending
		recent       int           // Plan.Recent
		kept         int           // len(Plan.Remediations)
		noStartup    bool          // NodeStartupTimeout 0
	}{
		{
			name:     "all healthy",
			machines: []Machine{worker("a"), worker("b")},
			want:     []want{{}, {}},
			healthy:  2, allowed: true, remAllowed: 2,
		},
		{
			name:     "condition held past its timeout",
			machines: []Machine{with(worker("a"), dead), worker("b")},
			want:     []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason, action: Remediate, message: "Ready=Unknown for 6m0s"}, {}},
			healthy:  1, allowed: true, remAllowed: 1,
		},
		{
			name:     "condition held exactly its timeout",
			machines: []Machine{with(worker("a"), notReadyFor(5*time.Minute, now))},
			want:     []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason, action: Remediate}},
			healthy:  0, allowed: true, remAllowed: 0,
		},
		{
			name: "condition not yet past its timeout: look again when it expires",
			machines: []Machine{
				with(worker("a"), notReadyFor(2*time.Minute, now)),
				with(worker("b"), func(m *Machine) { m.Node = node(corev1.ConditionFalse, now.Add(-4*time.Minute)) }),
			},
			// Both count toward maxUnhealthy (100%, 2) as what is coming.
			want:    []want{{}, {}},
			healthy: 2, allowed: true, remAllowed: 0, pending: 2,
			requeueAfter: time.Minute,
		},
		{
			name: "no Node after nodeStartupTimeout since provisioning",
			machines: []Machine{
				with(worker("a"), func(m *Machine) { m.HadNode, m.Node, m.Started = false, nil, now.Add(-11*time.Minute) }),
			},
			want:    []want{{reason: clusterv1.MachineNodeStartupTimeoutReason, action: Remediate, message: "nodeStartupTimeout (10m0s)"}},
			healthy: 0, allowed: true, remAllowed: 0,
		},
		{
			name: "no Node yet, within nodeStartupTimeout",
			machines: []Machine{
				with(worker("a"), func(m *Machine) { m.HadNode, m.Node, m.Started = false, nil, now.Add(-3*time.Minute) }),
			},
			want:    []want{{}},
			healthy: 1, allowed: true, remAllowed: 1,
			requeueAfter: 7 * time.Minute,
		},
		{
			name: "Node deleted after it existed",
			machines: []Machine{
				with(worker("a"), func(m *Machine) { m.Node = nil }),
				worker("b"),
			},
			want:    []want{{reason: clusterv1.MachineNodeDeletedReason, action: Remediate}, {}},
			healthy: 1, allowed: true, remAllowed: 1,
		},
		{
			name: "machine Failed",
			machines: []Machine{
				with(worker("a"), func(m *Machine) { m.Failed, m.FailureMessage = true, "disk gone" }),
			},
			want:    []want{{reason: clusterv1.MachineFailedReason, action: Remediate, message: "disk gone"}},
			healthy: 0, allowed: true, remAllowed: 0,
		},
		{
			name: "int limit: unhealthy exactly at maxUnhealthy remediates",
			max:  num(2),
			machines: []Machine{
				with(worker("a"), dead), with(worker("b"), dead), worker("c"), worker("d"), worker("e"),
			},
			want:    []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason, action: Remediate}, {reason: clusterv1.MachineUnhealthyNodeConditionReason, action: Remediate}, {}, {}, {}},
			healthy: 3, allowed: true, remAllowed: 0,
		},
		{
			name: "int limit: one above maxUnhealthy short-circuits",
			max:  num(2),
			machines: []Machine{
				with(worker("a"), dead), with(worker("b"), dead), with(worker("c"), dead), worker("d"), worker("e"),
			},
			want:    []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason}, {reason: clusterv1.MachineUnhealthyNodeConditionReason}, {reason: clusterv1.MachineUnhealthyNodeConditionReason}, {}, {}},
			healthy: 2, allowed: false, remAllowed: 0,
		},
		{
			// 40% of 5 is 2: two unhealthy are remediated.
			name: "percent limit: exactly at 40% of 5",
			max:  pct("40%"),
			machines: []Machine{
				with(worker("a"), dead), with(worker("b"), dead), worker("c"), worker("d"), worker("e"),
			},
			want:    []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason, action: Remediate}, {reason: clusterv1.MachineUnhealthyNodeConditionReason, action: Remediate}, {}, {}, {}},
			healthy: 3, allowed: true, remAllowed: 0,
		},
		{
			name: "percent limit: 3 of 5 is above 40%",
			max:  pct("40%"),
			machines: []Machine{
				with(worker("a"), dead), with(worker("b"), dead), with(worker("c"), dead), worker("d"), worker("e"),
			},
			want:    []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason}, {reason: clusterv1.MachineUnhealthyNodeConditionReason}, {reason: clusterv1.MachineUnhealthyNodeConditionReason}, {}, {}},
			healthy: 2, allowed: false, remAllowed: 0,
		},
		{
			// 40% of 6 is 2.4, rounded down to 2: the third stops remediation.
			name: "percent limit rounds down",
			max:  pct("40%"),
			machines: []Machine{
				with(worker("a"), dead), with(worker("b"), dead), with(worker("c"), dead), worker("d"), worker("e"), worker("f"),
			},
			want:    []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason}, {reason: clusterv1.MachineUnhealthyNodeConditionReason}, {reason: clusterv1.MachineUnhealthyNodeConditionReason}, {}, {}, {}},
			healthy: 3, allowed: false, remAllowed: 0,
		},
		{
			name: "control-plane machine is only marked",
			machines: []Machine{
				with(worker("cp"), func(m *Machine) { dead(m); m.ControlPlane, m.OwnedBySet = true, false }),
			},
			want:    []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason, action: MarkOnly, message: "the control plane replaces it once etcd keeps its quorum"}},
			healthy: 0, allowed: true, remAllowed: 0,
		},
		{
			name: "machine no set owns is only marked",
			machines: []Machine{
				with(worker("solo"), func(m *Machine) { dead(m); m.OwnedBySet = false }),
				worker("b"),
			},
			want:    []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason, action: MarkOnly, message: "no MachineSet owns the machine"}, {}},
			healthy: 1, allowed: true, remAllowed: 1,
		},
		{
			// Remediated before (a crash and restart, or a stale read): it
			// counts once, as not healthy, and is not deleted again.
			name: "machine already being deleted",
			max:  num(1),
			machines: []Machine{
				with(worker("a"), func(m *Machine) { dead(m); m.Deleting = true }),
				worker("b"), worker("c"),
			},
			want:    []want{{reason: clusterv1.DeletingReason}, {}, {}},
			healthy: 2, allowed: true, remAllowed: 0,
		},
		{
			// One machine is going away and a second fails: two unhealthy of
			// three is above the limit of 1, so nothing more is remediated.
			name: "a machine being deleted counts against maxUnhealthy",
			max:  num(1),
			machines: []Machine{
				with(worker("a"), func(m *Machine) { m.Deleting = true }),
				with(worker("b"), dead), worker("c"),
			},
			want:    []want{{reason: clusterv1.DeletingReason}, {reason: clusterv1.MachineUnhealthyNodeConditionReason}, {}},
			healthy: 1, allowed: false, remAllowed: 0,
		},
		{
			// A storm subsiding: Nodes come back one by one, and one not yet
			// back when remediation resumes is not taken for dead.
			name:     "remediation resumed a minute ago: an older condition waits its timeout past the resumption",
			max:      pct("40%"),
			machines: []Machine{with(worker("a"), dead), worker("b"), worker("c"), worker("d"), worker("e")},
			want:     []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason, action: None, message: "waits until"}, {}, {}, {}, {}},
			healthy:  4, allowed: true, remAllowed: 1,
			resumedAgo: time.Minute, requeueAfter: 4 * time.Minute,
		},
		{
			name:     "held its timeout past the resumption: remediated",
			max:      pct("40%"),
			machines: []Machine{with(worker("a"), dead), worker("b"), worker("c"), worker("d"), worker("e")},
			want:     []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason, action: Remediate}, {}, {}, {}, {}},
			healthy:  4, allowed: true, remAllowed: 1,
			resumedAgo: 5 * time.Minute,
		},
		{
			name:     "a condition that began after the resumption counts from itself",
			machines: []Machine{with(worker("a"), dead), worker("b")},
			want:     []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason, action: Remediate}, {}},
			healthy:  1, allowed: true, remAllowed: 1,
			resumedAgo: 10 * time.Minute,
		},
		{
			// A storm building: one Node past its timeout, two more whose
			// condition has begun. 3 count, more than 40% of 5 (2): the
			// first is not remediated ahead of the others.
			name: "conditions begun but not past their timeout count toward maxUnhealthy",
			max:  pct("40%"),
			machines: []Machine{
				with(worker("a"), dead), with(worker("b"), notReadyFor(3*time.Second, now)), with(worker("c"), notReadyFor(time.Minute, now)),
				worker("d"), worker("e"),
			},
			want:    []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason}, {}, {}, {}, {}},
			healthy: 4, allowed: false, remAllowed: 0, pending: 2,
			requeueAfter: 4 * time.Minute,
		},
		{
			name: "one condition begun within the limit: the dead one is remediated",
			max:  pct("40%"),
			machines: []Machine{
				with(worker("a"), dead), with(worker("b"), notReadyFor(time.Minute, now)), worker("c"), worker("d"), worker("e"),
			},
			want:    []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason, action: Remediate}, {}, {}, {}, {}},
			healthy: 4, allowed: true, remAllowed: 0, pending: 1,
			requeueAfter: 4 * time.Minute,
		},
		{
			// Two machines remediated within nodeStartupTimeout are gone,
			// replaced by healthy machines: they still count, so a third
			// dead one is more than 40% of 5.
			name: "remediations within the window count after their machines are gone",
			max:  pct("40%"),
			machines: []Machine{
				with(worker("a"), dead), worker("b"), worker("c"), worker("d"), worker("e"),
			},
			records: []Remediation{{Machine: "x", At: now.Add(-9 * time.Minute)}, {Machine: "y", At: now.Add(-time.Minute)}},
			want:    []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason}, {}, {}, {}, {}},
			healthy: 4, allowed: false, remAllowed: 0, recent: 2, kept: 2,
		},
		{
			name: "a remediation older than the window no longer counts and is dropped",
			max:  pct("40%"),
			machines: []Machine{
				with(worker("a"), dead), worker("b"), worker("c"), worker("d"), worker("e"),
			},
			records: []Remediation{{Machine: "x", At: now.Add(-10 * time.Minute)}, {Machine: "y", At: now.Add(-time.Minute)}},
			want:    []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason, action: Remediate}, {}, {}, {}, {}},
			healthy: 4, allowed: true, remAllowed: 0, recent: 1, kept: 1,
		},
		{
			// Still being deleted, it counts once, as unhealthy.
			name: "a remediated machine still present counts once",
			max:  num(1),
			machines: []Machine{
				with(worker("a"), func(m *Machine) { dead(m); m.Deleting = true }), worker("b"), worker("c"),
			},
			records: []Remediation{{Machine: "a", At: now.Add(-time.Minute)}},
			want:    []want{{reason: clusterv1.DeletingReason}, {}, {}},
			healthy: 2, allowed: true, remAllowed: 0, recent: 0, kept: 1,
		},
		{
			name:      "nodeStartupTimeout 0s: the window is 10 minutes",
			max:       num(1),
			noStartup: true,
			machines:  []Machine{with(worker("a"), dead), worker("b")},
			records:   []Remediation{{Machine: "x", At: now.Add(-9 * time.Minute)}, {Machine: "z", At: now.Add(-11 * time.Minute)}},
			want:      []want{{reason: clusterv1.MachineUnhealthyNodeConditionReason}, {}},
			healthy:   1, allowed: false, remAllowed: 0, recent: 1, kept: 1,
		},
		{
			name:     "no machines selected",
			max:      pct("40%"),
			machines: nil,
			want:     nil,
			healthy:  0, allowed: true, remAllowed: 0,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := spec(tc.max)
			s.Remediations = tc.records
			if tc.noStartup {
				s.NodeStartupTimeout = 0
			}
			if tc.resumedAgo > 0 {
				s.Resumed = now.Add(-tc.resumedAgo)
			}
			plan, err := Decide(s, tc.machines, now)
			if err != nil {
				t.Fatal(err)
			}
			if len(plan.Machines) != len(tc.want) {
				t.Fatalf("%d verdicts, want %d", len(plan.Machines), len(tc.want))
			}
			for i, w := range tc.want {
				v := plan.Machines[i]
				if v.Healthy != (w.reason == "") || v.Reason != w.reason || v.Action != w.action || !strings.Contains(v.Message, w.message) {
					t.Errorf("machine %s: healthy=%v reason=%q action=%v message=%q; want reason %q action %v message containing %q",
						v.Name, v.Healthy, v.Reason, v.Action, v.Message, w.reason, w.action, w.message)
				}
			}
			if plan.Healthy != tc.healthy || plan.Allowed != tc.allowed || plan.RemediationsAllowed != tc.remAllowed || plan.Expected != len(tc.machines) {
				t.Errorf("expected=%d healthy=%d allowed=%v remediationsAllowed=%d; want %d, %d, %v, %d",
					plan.Expected, plan.Healthy, plan.Allowed, plan.RemediationsAllowed, len(tc.machines), tc.healthy, tc.allowed, tc.remAllowed)
			}
			if plan.Pending != tc.pending || plan.Recent != tc.recent || len(plan.Remediations) != tc.kept {
				t.Errorf("pending=%d recent=%d kept records=%d; want %d, %d, %d", plan.Pending, plan.Recent, len(plan.Remediations), tc.pending, tc.recent, tc.kept)
			}
			var wantRequeue time.Time
			if tc.requeueAfter > 0 {
				wantRequeue = now.Add(tc.requeueAfter)
			}
			if !plan.RequeueAt.Equal(wantRequeue) {
				t.Errorf("requeue at %v, want %v", plan.RequeueAt, wantRequeue)
			}
		})
	}
}

func TestNodeStartupTimeoutZeroDisablesTheCheck(t *testing.T) {
	s := spec(nil)
	s.NodeStartupTimeout = 0
	m := with(worker("a"), func(m *Machine) { m.HadNode, m.Node, m.Started = false, nil, t0 })
	plan, err := Decide(s, []Machine{m}, t0.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if !plan.Machines[0].Healthy || !plan.RequeueAt.IsZero() {
		t.Errorf("verdict %+v, requeue %v: want healthy and no requeue", plan.Machines[0], plan.RequeueAt)
	}
}

func TestMaxUnhealthy(t *testing.T) {
	tests := []struct {
		v        intstr.IntOrString
		expected int
		want     int
		err      bool
	}{
		{v: intstr.FromInt32(2), expected: 10, want: 2},
		{v: intstr.FromInt32(0), expected: 10, want: 0},
		{v: intstr.FromInt32(20), expected: 10, want: 20},
		{v: intstr.FromString("40%"), expected: 25, want: 10},
		{v: intstr.FromString("40%"), expected: 6, want: 2},
		{v: intstr.FromString("40%"), expected: 10, want: 4},
		{v: intstr.FromString("100%"), expected: 7, want: 7},
		{v: intstr.FromString("0%"), expected: 7, want: 0},
		{v: intstr.FromString("33%"), expected: 3, want: 0},
		{v: intstr.FromInt32(-1), err: true},
		{v: intstr.FromString("101%"), err: true},
		{v: intstr.FromString("-5%"), err: true},
		{v: intstr.FromString("40"), err: true},
		{v: intstr.FromString("lots%"), err: true},
	}
	for _, tc := range tests {
		got, err := MaxUnhealthy(&tc.v, tc.expected)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("MaxUnhealthy(%s, %d) = %d, %v; want %d, error %v", tc.v.String(), tc.expected, got, err, tc.want, tc.err)
		}
	}
	if got, _ := MaxUnhealthy(nil, 9); got != 9 {
		t.Errorf("unset maxUnhealthy: %d of 9, want 9 (100%%)", got)
	}
}

// A bad maxUnhealthy stops remediation: the error is returned and no
// machine is to be remediated.
func TestInvalidMaxUnhealthyRemediatesNothing(t *testing.T) {
	bad := intstr.FromString("150%")
	now := t0.Add(time.Hour)
	plan, err := Decide(spec(&bad), []Machine{with(worker("a"), notReadyFor(time.Hour, now))}, now)
	if err == nil {
		t.Fatal("no error for maxUnhealthy 150%")
	}
	for _, v := range plan.Machines {
		if v.Action != None {
			t.Errorf("machine %s: action %v with an invalid maxUnhealthy", v.Name, v.Action)
		}
	}
}

// Record keeps the records within the window and adds one per machine
// remediated now, replacing an older record of the same machine.
func TestRecord(t *testing.T) {
	now := t0.Add(time.Hour)
	plan := Plan{
		Machines: []Verdict{{Name: "a", Action: Remediate}, {Name: "b", Action: MarkOnly}, {Name: "c", Healthy: true}, {Name: "d", Action: Remediate}},
		Remediations: []Remediation{
			{Machine: "old", At: now.Add(-5 * time.Minute)},
			{Machine: "d", At: now.Add(-time.Minute)},
		},
	}
	got := Record(plan, now)
	want := []Remediation{{Machine: "old", At: now.Add(-5 * time.Minute)}, {Machine: "a", At: now}, {Machine: "d", At: now}}
	if len(got) != len(want) {
		t.Fatalf("records %v, want %v", got, want)
	}
	for i := range want {
		if got[i].Machine != want[i].Machine || !got[i].At.Equal(want[i].At) {
			t.Errorf("record %d: %v, want %v", i, got[i], want[i])
		}
	}
}

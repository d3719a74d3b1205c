package machinehealthcheck

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/controller/machine"
	"marina.dev/marina/internal/controller/machineset"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/internal/testenv/localenv"
	"marina.dev/marina/provider"
)

var (
	suite          *localenv.Suite
	mgmt, workload *testenv.Env
)

func TestMain(m *testing.M) {
	localenv.Main(m, "marina-mhc-", func(s *localenv.Suite) { suite, mgmt, workload = s, s.Mgmt, s.Workload })
}

// startNodeLifecycle runs the real node lifecycle controller on the
// workload cluster, so a Node whose agent is killed turns Ready=Unknown. The
// grace period must outlast the agent's Lease renewal (10s) with a margin
// for a loaded machine, or healthy Nodes would flap and be remediated.
func startNodeLifecycle(t *testing.T) {
	testenv.StartControllerManager(t, workload, []string{"node-lifecycle-controller"},
		"--node-monitor-grace-period=18s", "--node-monitor-period=1s")
}

// startMachines runs the machine and MachineSet controllers with the
// fixture's local provider until the test ends.
func startMachines(f *localenv.Fixture) {
	localenv.StartManager(f.T, mgmt.Config, f.NS, func(ctx context.Context, mgr ctrl.Manager) error {
		reg, err := provider.NewRegistry(f.Provider)
		if err != nil {
			return err
		}
		if _, err := machine.SetupWithManager(ctx, mgr, machine.Options{Providers: reg, MaxConcurrentReconciles: 4}); err != nil {
			return err
		}
		_, err = machineset.SetupWithManager(mgr, machineset.Options{MaxConcurrentReconciles: 2})
		return err
	})
}

// startChecks runs the MachineHealthCheck controller, in a manager of its
// own so that a test can kill it alone, until the test ends or stop is called.
func startChecks(f *localenv.Fixture, opts Options) (stop func()) {
	return localenv.StartManager(f.T, mgmt.Config, f.NS, func(ctx context.Context, mgr ctrl.Manager) error {
		_, err := SetupWithManager(ctx, mgr, opts)
		return err
	})
}

// newCheck checks the machines labelled pool=workers: Ready Unknown or
// False for 5s is unhealthy.
func newCheck(f *localenv.Fixture, maxUnhealthy *intstr.IntOrString) *clusterv1.MachineHealthCheck {
	return &clusterv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Name: "workers", Namespace: f.NS},
		Spec: clusterv1.MachineHealthCheckSpec{
			ClusterName: f.Cluster,
			Selector:    metav1.LabelSelector{MatchLabels: map[string]string{"pool": "workers"}},
			UnhealthyConditions: []clusterv1.UnhealthyCondition{
				{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Timeout: metav1.Duration{Duration: 5 * time.Second}},
				{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Timeout: metav1.Duration{Duration: 5 * time.Second}},
			},
			MaxUnhealthy: maxUnhealthy,
		},
	}
}

func create(t *testing.T, o client.Object) {
	t.Helper()
	if err := mgmt.Client.Create(context.Background(), o); err != nil {
		t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
	}
}

func machinesIn(t *testing.T, ns string) []clusterv1.Machine {
	t.Helper()
	list := &clusterv1.MachineList{}
	if err := mgmt.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func getMachine(name, ns string) (*clusterv1.Machine, error) {
	m := &clusterv1.Machine{}
	return m, mgmt.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, m)
}

func getCheck(t *testing.T, mhc *clusterv1.MachineHealthCheck) *clusterv1.MachineHealthCheck {
	t.Helper()
	got := &clusterv1.MachineHealthCheck{}
	if err := mgmt.Client.Get(context.Background(), client.ObjectKeyFromObject(mhc), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// ready reports whether a machine is Ready and not being deleted.
func ready(m *clusterv1.Machine) bool {
	return m.DeletionTimestamp.IsZero() && meta.IsStatusConditionTrue(m.Status.Conditions, clusterv1.ReadyCondition)
}

// waitReady waits until want machines with the label pool=workers are
// Ready, and returns them by name.
func waitReady(t *testing.T, ns string, want int, timeout time.Duration) map[string]clusterv1.Machine {
	t.Helper()
	var out map[string]clusterv1.Machine
	testenv.Eventually(t, timeout, fmt.Sprintf("%d Ready machines", want), func() error {
		out = map[string]clusterv1.Machine{}
		var states []string
		for _, m := range machinesIn(t, ns) {
			states = append(states, fmt.Sprintf("%s:%s", m.Name, m.Status.Phase))
			if ready(&m) {
				out[m.Name] = m
			}
		}
		if len(out) != want {
			return fmt.Errorf("%d Ready: %v", len(out), states)
		}
		return nil
	})
	return out
}

// killAgent kills the node agent of a machine by its PID, as a crashed
// kubelet: its Node stops heartbeating. The machine is first annotated as
// stopped on purpose: a machine merely killed is started again by the
// machine controller within seconds (issue 25), and the check would never
// see its Node go Unknown.
func killAgent(t *testing.T, f *localenv.Fixture, m *clusterv1.Machine) {
	t.Helper()
	cur := &clusterv1.Machine{}
	if err := mgmt.Client.Get(context.Background(), client.ObjectKeyFromObject(m), cur); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	cur.Annotations[clusterv1.StoppedOnPurposeAnnotation] = "true"
	if err := mgmt.Client.Patch(context.Background(), cur, patch); err != nil {
		t.Fatalf("annotating %s stopped on purpose: %v", m.Name, err)
	}
	pid, err := f.Provider.AgentPID(m.UID)
	if err != nil {
		t.Fatalf("finding the agent of %s: %v", m.Name, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing the agent of %s (pid %d): %v", m.Name, pid, err)
	}
}

// nodeUnknownSince returns when the machine's Node turned Ready=Unknown;
// zero while it has not.
func nodeUnknownSince(t *testing.T, m *clusterv1.Machine) time.Time {
	t.Helper()
	n := &corev1.Node{}
	if err := workload.Client.Get(context.Background(), types.NamespacedName{Name: m.Status.NodeRef.Name}, n); err != nil {
		t.Fatal(err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionUnknown {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// nodeReady returns the status of the machine's Node's Ready condition.
func nodeReady(t *testing.T, m *clusterv1.Machine) corev1.ConditionStatus {
	t.Helper()
	n := &corev1.Node{}
	if err := workload.Client.Get(context.Background(), types.NamespacedName{Name: m.Status.NodeRef.Name}, n); err != nil {
		t.Fatal(err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return corev1.ConditionUnknown
}

func condition(conds []metav1.Condition, t string) *metav1.Condition {
	return meta.FindStatusCondition(conds, t)
}

// events returns "reason: note" of the namespace's events.
func events(t *testing.T, ns string) []string {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := mgmt.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Reason+": "+e.Note)
	}
	legacy := &corev1.EventList{}
	if err := mgmt.Client.List(context.Background(), legacy, client.InNamespace(ns)); err == nil {
		for _, e := range legacy.Items {
			out = append(out, e.Reason+": "+e.Message)
		}
	}
	return out
}

func hasEvent(t *testing.T, ns, reason, part string) error {
	all := events(t, ns)
	for _, e := range all {
		if strings.HasPrefix(e, reason+": ") && strings.Contains(e, part) {
			return nil
		}
	}
	return fmt.Errorf("no %s event mentioning %q among %q", reason, part, all)
}

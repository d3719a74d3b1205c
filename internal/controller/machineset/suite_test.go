package machineset

import (
	"context"
	"fmt"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/controller/machine"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/internal/testenv/localenv"
	"marina.dev/marina/provider"
)

var (
	suite *localenv.Suite
	mgmt  *testenv.Env
)

func TestMain(m *testing.M) {
	localenv.Main(m, "marina-machineset-", func(s *localenv.Suite) { suite, mgmt = s, s.Mgmt })
}

// start runs the MachineSet controller, and with machines the machine
// controller and the fixture's local provider too, until the test ends or
// stop is called.
func start(f *localenv.Fixture, opts Options, machines bool) (stop func()) {
	_, stop = startReconciler(f, opts, machines)
	return stop
}

// startReconciler is start, returning the MachineSet reconciler too.
func startReconciler(f *localenv.Fixture, opts Options, machines bool) (r *Reconciler, stop func()) {
	stop = localenv.StartManager(f.T, mgmt.Config, f.NS, func(ctx context.Context, mgr ctrl.Manager) error {
		if machines {
			reg, err := provider.NewRegistry(f.Provider)
			if err != nil {
				return err
			}
			if _, err := machine.SetupWithManager(ctx, mgr, machine.Options{Providers: reg, MaxConcurrentReconciles: 4}); err != nil {
				return err
			}
		}
		var err error
		r, err = SetupWithManager(mgr, opts)
		return err
	})
	return r, stop
}

func newSet(f *localenv.Fixture, name string, replicas int32) *clusterv1.MachineSet {
	return f.WorkerSet(name, replicas, map[string]string{"pool": name})
}

func create(t *testing.T, o client.Object) {
	t.Helper()
	if err := mgmt.Client.Create(context.Background(), o); err != nil {
		t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
	}
}

// machinesIn lists the namespace's machines.
func machinesIn(t *testing.T, ns string) []clusterv1.Machine {
	t.Helper()
	list := &clusterv1.MachineList{}
	if err := mgmt.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// owned counts the machines set ms controls, and how many of them are Ready.
func owned(t *testing.T, ms *clusterv1.MachineSet) (all, ready int, names map[string]bool) {
	names = map[string]bool{}
	for _, m := range machinesIn(t, ms.Namespace) {
		if ref := metav1.GetControllerOf(&m); ref == nil || ref.UID != ms.UID {
			continue
		}
		all++
		names[m.Name] = true
		for _, c := range m.Status.Conditions {
			if c.Type == clusterv1.ReadyCondition && c.Status == metav1.ConditionTrue && m.DeletionTimestamp.IsZero() {
				ready++
			}
		}
	}
	return all, ready, names
}

// scale writes spec.replicas through the scale subresource, as
// `kubectl scale` and cluster-autoscaler do.
func scale(t *testing.T, ms *clusterv1.MachineSet, replicas int32) {
	t.Helper()
	s := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: replicas}}
	if err := mgmt.Client.SubResource("scale").Update(context.Background(), ms, client.WithSubResourceBody(s)); err != nil {
		t.Fatalf("scaling %s to %d: %v", ms.Name, replicas, err)
	}
}

func getSet(t *testing.T, ms *clusterv1.MachineSet) *clusterv1.MachineSet {
	t.Helper()
	got := &clusterv1.MachineSet{}
	if err := mgmt.Client.Get(context.Background(), client.ObjectKeyFromObject(ms), got); err != nil {
		t.Fatal(err)
	}
	return got
}

func condition(conds []metav1.Condition, t string) string {
	for _, c := range conds {
		if c.Type == t {
			return fmt.Sprintf("%s/%s: %s", c.Status, c.Reason, c.Message)
		}
	}
	return "absent"
}

// waitOwned waits until the set controls exactly want machines, ready of
// them Ready (ready < 0: any number).
func waitOwned(t *testing.T, ms *clusterv1.MachineSet, want, ready int, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, timeout, fmt.Sprintf("%s to have %d machines, %d Ready", ms.Name, want, ready), func() error {
		all, r, _ := owned(t, ms)
		if all != want || (ready >= 0 && r != ready) {
			return fmt.Errorf("%d machines, %d Ready; status %+v", all, r, getSet(t, ms).Status)
		}
		return nil
	})
}

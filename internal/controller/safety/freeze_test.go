package safety

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/controller/machineset"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/internal/testenv/localenv"
	"marina.dev/marina/provider"
)

// A MachineSet with more machines than replicas + maxSurge for longer than
// a look is frozen: the annotation and the Frozen condition give the
// counts. Once the set has deleted its extra machines it is thawed, and
// the condition goes.
func TestRunawayMachineSetIsFrozenThenThawed(t *testing.T) {
	f := suite.NewFixture(t)
	ctx := context.Background()
	c := suite.Mgmt.Client
	// Paused, the set keeps the machines it has been given: a runaway.
	ms := f.WorkerSet("runaway", 1, map[string]string{"pool": "runaway"})
	ms.Annotations = map[string]string{clusterv1.PausedAnnotation: "yes"}
	if err := c.Create(ctx, ms); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		m := &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("runaway-%d", i), Namespace: f.NS, Labels: ms.Spec.Template.ObjectMeta.Labels,
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(ms, clusterv1.GroupVersion.WithKind("MachineSet"))}},
			Spec: ms.Spec.Template.Spec,
		}
		if err := c.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	registry, err := provider.NewRegistry(f.Provider)
	if err != nil {
		t.Fatal(err)
	}
	localenv.StartManager(t, suite.Mgmt.Config, f.NS, func(ctx context.Context, mgr ctrl.Manager) error {
		if _, err := machineset.SetupWithManager(mgr, machineset.Options{StatusInterval: -1}); err != nil {
			return err
		}
		return SetupWithManager(mgr, Options{Providers: registry, Period: 200 * time.Millisecond, FreezeAfter: time.Second})
	})

	testenv.Eventually(t, 30*time.Second, "the set frozen", func() error {
		got := getSet(t, ms)
		why := got.Annotations[clusterv1.FrozenAnnotation]
		if !strings.Contains(why, "3 machines, above replicas 1 + maxSurge 0") {
			return fmt.Errorf("annotation %q", why)
		}
		if cond := frozenCondition(got); cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != clusterv1.TooManyMachinesReason || cond.Message != why {
			return fmt.Errorf("Frozen condition %+v", cond)
		}
		return nil
	})

	// Resumed, the set deletes the extra machines (nothing holds them
	// here), and is thawed.
	unpaused := getSet(t, ms)
	before := unpaused.DeepCopy()
	delete(unpaused.Annotations, clusterv1.PausedAnnotation)
	if err := c.Patch(ctx, unpaused, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the set thawed with 1 machine", func() error {
		got := getSet(t, ms)
		if why, ok := got.Annotations[clusterv1.FrozenAnnotation]; ok {
			return fmt.Errorf("still frozen: %s", why)
		}
		if cond := frozenCondition(got); cond != nil {
			return fmt.Errorf("Frozen condition left: %+v", cond)
		}
		var list clusterv1.MachineList
		if err := c.List(ctx, &list, client.InNamespace(f.NS)); err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d machines", len(list.Items))
		}
		return nil
	})
}

// A frozen set creates nothing, even below its replicas, and says why.
func TestFrozenMachineSetCreatesNoMachine(t *testing.T) {
	f := suite.NewFixture(t)
	ctx := context.Background()
	ms := f.WorkerSet("frozen", 2, map[string]string{"pool": "frozen"})
	ms.Annotations = map[string]string{clusterv1.FrozenAnnotation: "9 machines, above replicas 2 + maxSurge 1"}
	if err := suite.Mgmt.Client.Create(ctx, ms); err != nil {
		t.Fatal(err)
	}
	localenv.StartManager(t, suite.Mgmt.Config, f.NS, func(ctx context.Context, mgr ctrl.Manager) error {
		_, err := machineset.SetupWithManager(mgr, machineset.Options{StatusInterval: -1})
		return err
	})
	testenv.Eventually(t, 30*time.Second, "the Frozen condition", func() error {
		got := getSet(t, ms)
		if cond := frozenCondition(got); cond == nil || cond.Message != "9 machines, above replicas 2 + maxSurge 1" || cond.ObservedGeneration != got.Generation {
			return fmt.Errorf("Frozen condition %+v", cond)
		}
		return nil
	})
	// The pass that wrote the condition would have created the machines
	// before writing it.
	var list clusterv1.MachineList
	if err := suite.Mgmt.Client.List(ctx, &list, client.InNamespace(f.NS)); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Errorf("a frozen set created %d machines", len(list.Items))
	}
}

func getSet(t *testing.T, ms *clusterv1.MachineSet) *clusterv1.MachineSet {
	t.Helper()
	got := &clusterv1.MachineSet{}
	if err := suite.Mgmt.Client.Get(context.Background(), client.ObjectKeyFromObject(ms), got); err != nil {
		t.Fatal(err)
	}
	return got
}

func frozenCondition(ms *clusterv1.MachineSet) *metav1.Condition {
	for i := range ms.Status.Conditions {
		if ms.Status.Conditions[i].Type == clusterv1.FrozenCondition {
			return &ms.Status.Conditions[i]
		}
	}
	return nil
}

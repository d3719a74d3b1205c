package machinedeployment

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/controller/machineset"
	"marina.dev/marina/internal/testenv"
)

const rollTimeout = 3 * time.Minute

// fleetWatcher follows every change of the namespace's machines through a
// watch and records, at each one, how many exist, how many are Ready (and
// not being deleted), and how many are available: Ready for minReadySeconds
// at the moment of the change. Availability only grows between changes, as
// time passes, so the least seen at changes is the least there was.
type fleetWatcher struct {
	mu                 sync.Mutex
	machines           map[string]*clusterv1.Machine
	minReadySeconds    int32
	minReady, maxTotal int
	minAvailable       int
	events             int
	err                error
	stop               context.CancelFunc
	done               chan struct{}
}

func watchFleet(t *testing.T, ns string) *fleetWatcher {
	t.Helper()
	return watchFleetAvailable(t, ns, 0)
}

func watchFleetAvailable(t *testing.T, ns string, minReadySeconds int32) *fleetWatcher {
	t.Helper()
	wc, err := client.NewWithWatch(mgmt.Config, client.Options{Scheme: mgmt.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	list := &clusterv1.MachineList{}
	if err := wc.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &clusterv1.MachineList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	fw := &fleetWatcher{machines: map[string]*clusterv1.Machine{}, minReadySeconds: minReadySeconds, minReady: 1 << 30, minAvailable: 1 << 30, stop: cancel, done: make(chan struct{})}
	for i := range list.Items {
		fw.machines[list.Items[i].Name] = &list.Items[i]
	}
	fw.record()
	go func() {
		defer close(fw.done)
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if !ok {
					fw.mu.Lock()
					fw.err = fmt.Errorf("the watch ended early")
					fw.mu.Unlock()
					return
				}
				m, isMachine := ev.Object.(*clusterv1.Machine)
				if !isMachine {
					continue
				}
				fw.mu.Lock()
				if ev.Type == watch.Deleted {
					delete(fw.machines, m.Name)
				} else {
					fw.machines[m.Name] = m
				}
				fw.mu.Unlock()
				fw.record()
			}
		}
	}()
	t.Cleanup(fw.close)
	return fw
}

func (fw *fleetWatcher) record() {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	ready := 0
	for _, m := range fw.machines {
		if m.DeletionTimestamp.IsZero() && meta.IsStatusConditionTrue(m.Status.Conditions, clusterv1.ReadyCondition) {
			ready++
		}
	}
	all := make([]*clusterv1.Machine, 0, len(fw.machines))
	for _, m := range fw.machines {
		all = append(all, m)
	}
	fw.minAvailable = min(fw.minAvailable, int(machineset.Count(all, fw.minReadySeconds, time.Now()).Available))
	fw.events++
	fw.minReady = min(fw.minReady, ready)
	fw.maxTotal = max(fw.maxTotal, len(fw.machines))
}

func (fw *fleetWatcher) close() {
	fw.stop()
	<-fw.done
}

// result returns what the watcher saw since the last reset, and resets.
func (fw *fleetWatcher) result() (minReady, maxTotal, events int, err error) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	minReady, maxTotal, events, err = fw.minReady, fw.maxTotal, fw.events, fw.err
	fw.minReady, fw.maxTotal, fw.events = 1<<30, 0, 0
	return minReady, maxTotal, events, err
}

// A 10-machine deployment rolls to a new template with maxSurge 2 and
// maxUnavailable 0: a watcher sees the Ready machines never drop below 10
// and the machines never exceed 12. Annotating rollback-to-revision=0 then
// restores the previous template under the same bounds, on the previous
// revision's MachineSet, now revision 3.
func TestRollingUpdateKeepsCapacityThenRollsBack(t *testing.T) {
	f := suite.NewFixture(t)
	start(f)
	md := newDeployment(f, "workers", 10, 2, 0)
	create(t, md)
	md = waitSettled(t, md, 10, "v1", rollTimeout)
	if c := condition(md.Status.Conditions, clusterv1.ReadyCondition); !strings.HasPrefix(c, "True") {
		t.Errorf("settled deployment not Ready: %s", c)
	}
	first := setsOf(t, md)
	if len(first) != 1 || first[0].Annotations[clusterv1.RevisionAnnotation] != "1" || first[0].Labels[clusterv1.MachineDeploymentNameLabel] != md.Name {
		t.Fatalf("first revision's sets: %+v", first)
	}

	// Changing only the deployment's own labels and annotations rolls
	// nothing. (The size annotations make the controller's pass visible:
	// they get a NodeGroupSizeValid condition.)
	names := map[string]bool{}
	for _, m := range machinesIn(t, f.NS) {
		names[m.Name] = true
	}
	update(t, md, func(md *clusterv1.MachineDeployment) {
		md.Labels = map[string]string{"team": "blue"}
		md.Annotations[clusterv1.AutoscalerMinSizeAnnotation] = "1"
		md.Annotations[clusterv1.AutoscalerMaxSizeAnnotation] = "20"
	})
	testenv.Eventually(t, 30*time.Second, "the deployment to see its new annotations", func() error {
		if c := condition(get(t, md.DeepCopy()).Status.Conditions, clusterv1.NodeGroupSizeValidCondition); !strings.HasPrefix(c, "True") {
			return fmt.Errorf("NodeGroupSizeValid %s", c)
		}
		return nil
	})
	if sets := setsOf(t, md); len(sets) != 1 {
		t.Errorf("a metadata-only change made %d sets", len(sets))
	}
	for _, m := range machinesIn(t, f.NS) {
		if !names[m.Name] || !m.DeletionTimestamp.IsZero() {
			t.Errorf("a metadata-only change touched machine %s", m.Name)
		}
	}
	fw := watchFleet(t, f.NS)
	update(t, md, func(md *clusterv1.MachineDeployment) { md.Spec.Template.Spec.Labels["tier"] = "v2" })
	waitSettled(t, md, 10, "v2", rollTimeout)
	minReady, maxTotal, events, err := fw.result()
	t.Logf("rollout: %d machine changes seen, Ready never below %d, at most %d machines", events, minReady, maxTotal)
	if err != nil || minReady < 10 || maxTotal > 12 {
		t.Errorf("rollout broke its bounds: Ready fell to %d (want >= 10), %d machines (want <= 12), watch error %v", minReady, maxTotal, err)
	}
	sets := setsOf(t, md)
	if len(sets) != 2 {
		t.Fatalf("%d sets after one rollout, want 2 (revisionHistoryLimit 1)", len(sets))
	}

	update(t, md, func(md *clusterv1.MachineDeployment) { md.Annotations[clusterv1.RollbackToRevisionAnnotation] = "0" })
	md = waitSettled(t, md, 10, "v1", rollTimeout)
	minReady, maxTotal, _, err = fw.result()
	if err != nil || minReady < 10 || maxTotal > 12 {
		t.Errorf("rollback broke its bounds: Ready fell to %d, %d machines, watch error %v", minReady, maxTotal, err)
	}
	if _, ok := md.Annotations[clusterv1.RollbackToRevisionAnnotation]; ok || md.Annotations[clusterv1.RevisionAnnotation] != "3" {
		t.Errorf("after rollback: annotations %v, want revision 3 and no rollback annotation", md.Annotations)
	}
	for _, ms := range setsOf(t, md) {
		if ms.UID == first[0].UID && ms.Annotations[clusterv1.RevisionAnnotation] != "3" {
			t.Errorf("the first set came back as revision %s, want 3", ms.Annotations[clusterv1.RevisionAnnotation])
		}
	}
	if c := condition(md.Status.Conditions, clusterv1.ProgressingCondition); !strings.HasPrefix(c, "True/"+clusterv1.NewMachineSetAvailableReason) {
		t.Errorf("Progressing %s", c)
	}
}

// New machines that never become Ready stall the rollout: old capacity
// stays, and after progressDeadlineSeconds the Progressing condition turns
// False saying what to do. A rollback to a revision that does not exist is
// reported; rolling back to the previous one recovers.
func TestStalledRolloutIsReportedAndRolledBack(t *testing.T) {
	f := suite.NewFixture(t)
	start(f)
	md := newDeployment(f, "stall", 1, 1, 0)
	md.Spec.ProgressDeadlineSeconds = ptrTo[int32](2)
	create(t, md)
	waitSettled(t, md, 1, "v1", rollTimeout)

	// A class that does not exist: the new machine never becomes Ready.
	update(t, md, func(md *clusterv1.MachineDeployment) {
		md.Spec.Template.Spec.ProviderSpec = nil
		md.Spec.Template.Spec.ClassRef = &clusterv1.MachineClassReference{Name: "no-such-class-" + f.NS}
	})
	testenv.Eventually(t, time.Minute, "Progressing to turn False on the deadline", func() error {
		got := get(t, md.DeepCopy())
		if c := condition(got.Status.Conditions, clusterv1.ProgressingCondition); !strings.HasPrefix(c, "False/"+clusterv1.ProgressDeadlineExceededReason) {
			return fmt.Errorf("Progressing %s", c)
		}
		return nil
	})
	got := get(t, md.DeepCopy())
	if got.Status.ReadyReplicas != 1 || got.Status.Replicas != 2 {
		t.Errorf("stalled rollout: %d machines, %d Ready; want the old one Ready and one new", got.Status.Replicas, got.Status.ReadyReplicas)
	}

	update(t, md, func(md *clusterv1.MachineDeployment) { md.Annotations[clusterv1.RollbackToRevisionAnnotation] = "7" })
	testenv.Eventually(t, 30*time.Second, "an unknown revision to be reported", func() error {
		c := condition(get(t, md.DeepCopy()).Status.Conditions, clusterv1.ProgressingCondition)
		if !strings.HasPrefix(c, "False/"+clusterv1.RollbackFailedReason) || !strings.Contains(c, "revision 7") {
			return fmt.Errorf("Progressing %s", c)
		}
		return nil
	})
	update(t, md, func(md *clusterv1.MachineDeployment) { md.Annotations[clusterv1.RollbackToRevisionAnnotation] = "0" })
	got = waitSettled(t, md, 1, "v1", rollTimeout)
	if c := condition(got.Status.Conditions, clusterv1.ProgressingCondition); !strings.HasPrefix(c, "True/"+clusterv1.NewMachineSetAvailableReason) {
		t.Errorf("after rollback, Progressing %s", c)
	}
}

func ptrTo[T any](v T) *T { return &v }

// With the OnDelete strategy a template change replaces nothing by itself;
// a machine someone deletes comes back from the new template.
func TestOnDeleteReplacesOnlyDeletedMachines(t *testing.T) {
	f := suite.NewFixture(t)
	start(f)
	md := newDeployment(f, "ondelete", 2, 1, 0)
	md.Spec.Strategy = &clusterv1.MachineDeploymentStrategy{Type: clusterv1.OnDeleteStrategy}
	create(t, md)
	waitSettled(t, md, 2, "v1", rollTimeout)
	update(t, md, func(md *clusterv1.MachineDeployment) { md.Spec.Template.Spec.Labels["tier"] = "v2" })
	testenv.Eventually(t, 30*time.Second, "the new revision's set to exist, empty", func() error {
		got := get(t, md.DeepCopy())
		if got.Status.ObservedGeneration != got.Generation || len(setsOf(t, md)) != 2 {
			return fmt.Errorf("observedGeneration %d of %d, %d sets", got.Status.ObservedGeneration, got.Generation, len(setsOf(t, md)))
		}
		return nil
	})
	machines := machinesIn(t, f.NS)
	if len(machines) != 2 || machines[0].Spec.Labels["tier"] != "v1" || machines[1].Spec.Labels["tier"] != "v1" {
		t.Fatalf("OnDelete replaced machines on its own: %d machines", len(machines))
	}
	if err := mgmt.Client.Delete(context.Background(), &machines[0]); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, rollTimeout, "the deleted machine to come back from the new template", func() error {
		tiers := map[string]int{}
		for _, m := range machinesIn(t, f.NS) {
			if m.DeletionTimestamp.IsZero() && meta.IsStatusConditionTrue(m.Status.Conditions, clusterv1.ReadyCondition) {
				tiers[m.Spec.Labels["tier"]]++
			}
		}
		if tiers["v1"] != 1 || tiers["v2"] != 1 || len(machinesIn(t, f.NS)) != 2 {
			return fmt.Errorf("Ready machines by tier %v", tiers)
		}
		return nil
	})
}

// A template changed again in the middle of a rollout, and a scale-up
// through the scale subresource while it runs: the deployment goes straight
// to the newest template and size, within the surge and availability
// bounds, and keeps only revisionHistoryLimit old sets.
func TestTemplateAndScaleChangeMidRollout(t *testing.T) {
	f := suite.NewFixture(t)
	start(f)
	md := newDeployment(f, "midway", 6, 2, 1)
	create(t, md)
	waitSettled(t, md, 6, "v1", rollTimeout)
	fw := watchFleet(t, f.NS)

	update(t, md, func(md *clusterv1.MachineDeployment) { md.Spec.Template.Spec.Labels["tier"] = "v2" })
	testenv.Eventually(t, time.Minute, "the first rollout to be under way", func() error {
		v2 := 0
		for _, m := range machinesIn(t, f.NS) {
			if m.Spec.Labels["tier"] == "v2" {
				v2++
			}
		}
		if v2 == 0 {
			return fmt.Errorf("no v2 machine yet")
		}
		return nil
	})
	update(t, md, func(md *clusterv1.MachineDeployment) { md.Spec.Template.Spec.Labels["tier"] = "v3" })
	scaleTo(t, md, 8)
	got := waitSettled(t, md, 8, "v3", rollTimeout)
	minReady, maxTotal, events, err := fw.result()
	t.Logf("%d machine changes seen, Ready never below %d, at most %d machines", events, minReady, maxTotal)
	// Bounds of the smaller size (6 - 1 available, 8 + 2 machines) hold
	// throughout.
	if err != nil || minReady < 5 || maxTotal > 10 {
		t.Errorf("bounds broken: Ready fell to %d (want >= 5), %d machines (want <= 10), watch error %v", minReady, maxTotal, err)
	}
	if got.Annotations[clusterv1.RevisionAnnotation] != "3" {
		t.Errorf("revision %q, want 3", got.Annotations[clusterv1.RevisionAnnotation])
	}
	testenv.Eventually(t, 30*time.Second, "old sets beyond revisionHistoryLimit 1 to go", func() error {
		if sets := setsOf(t, md); len(sets) != 2 {
			return fmt.Errorf("%d sets", len(sets))
		}
		return nil
	})
}

// A scale-up during a rollout that is stuck (the new template's machines
// never get Ready) is spread over the sets in proportion to their sizes,
// as a Deployment's is: the old template, which works, gets its share,
// instead of every new machine going to the template that does not.
func TestScaleUpDuringStuckRolloutIsProportional(t *testing.T) {
	f := suite.NewFixture(t)
	start(f)
	md := newDeployment(f, "stuck", 2, 1, 0)
	create(t, md)
	waitSettled(t, md, 2, "v1", rollTimeout)
	update(t, md, func(md *clusterv1.MachineDeployment) {
		md.Spec.Template.Spec.ProviderSpec = nil
		md.Spec.Template.Spec.ClassRef = &clusterv1.MachineClassReference{Name: "no-such-class-" + f.NS}
	})
	testenv.Eventually(t, time.Minute, "the rollout to be stuck on one new machine", func() error {
		if n := len(machinesIn(t, f.NS)); n != 3 {
			return fmt.Errorf("%d machines", n)
		}
		return nil
	})
	scaleTo(t, md, 4)
	// 5 machines allowed (4 + maxSurge 1) for the 3 the sets hold: the old
	// set 2*5/3 -> 3, the new one 1*5/3 -> 2.
	testenv.Eventually(t, rollTimeout, "the old template to get its share of the scale-up", func() error {
		var oldReady, newMachines int
		for _, m := range machinesIn(t, f.NS) {
			switch {
			case m.Spec.ClassRef != nil:
				newMachines++
			case m.DeletionTimestamp.IsZero() && meta.IsStatusConditionTrue(m.Status.Conditions, clusterv1.ReadyCondition):
				oldReady++
			}
		}
		if oldReady != 3 || newMachines != 2 {
			return fmt.Errorf("%d Ready machines of the old template (want 3), %d of the stuck one (want 2)", oldReady, newMachines)
		}
		return nil
	})
}

// A rollout of 10 with minReadySeconds, maxSurge 2 and maxUnavailable 0,
// with a watcher counting the available machines at every change: never
// fewer than 10, and never more than 12 machines.
func TestRolloutKeepsMachinesAvailableWithMinReadySeconds(t *testing.T) {
	f := suite.NewFixture(t)
	start(f)
	md := newDeployment(f, "minready", 10, 2, 0)
	md.Spec.MinReadySeconds = 5
	create(t, md)
	waitSettled(t, md, 10, "v1", rollTimeout)
	fw := watchFleetAvailable(t, f.NS, md.Spec.MinReadySeconds)
	update(t, md, func(md *clusterv1.MachineDeployment) { md.Spec.Template.Spec.Labels["tier"] = "v2" })
	waitSettled(t, md, 10, "v2", rollTimeout)
	fw.mu.Lock()
	minAvailable := fw.minAvailable
	fw.mu.Unlock()
	_, maxTotal, events, err := fw.result()
	t.Logf("rollout: %d machine changes seen, available never below %d, at most %d machines", events, minAvailable, maxTotal)
	if err != nil || minAvailable < 10 || maxTotal > 12 {
		t.Errorf("available fell to %d (want >= 10), %d machines (want <= 12), watch error %v", minAvailable, maxTotal, err)
	}
}

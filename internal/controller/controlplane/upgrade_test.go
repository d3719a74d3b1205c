package controlplane

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/upgrade"
)

// The upgrade takes over only while the control plane has its machines
// and none is being deleted; a Replace upgrade's extra machine makes the
// scale planner want a Delete, which the upgrade decides instead.
func TestMayUpgrade(t *testing.T) {
	three := Facts{Replicas: 3, Initialized: true, Machines: []Machine{ready("a"), ready("b"), ready("c")}}
	four := three
	four.Machines = append(append([]Machine(nil), three.Machines...), Machine{Name: "d"})
	short := three
	short.Machines = three.Machines[:2]
	gone := three
	gone.Machines = []Machine{ready("a"), ready("b"), deleting(ready("c"))}
	for _, tc := range []struct {
		name string
		step Step
		f    Facts
		want bool
	}{
		{"all there and done", Step{Action: Done}, three, true},
		{"all there, one not ready (its API server restarts)", Step{Action: Wait}, three, true},
		{"Replace's fourth machine", Step{Action: Delete, Machine: "d"}, four, true},
		{"one missing: the scale planner makes it first", Step{Action: Create}, short, false},
		{"one being deleted: its release goes first", Step{Action: Release, Machine: "c"}, gone, false},
		{"not initialized", Step{Action: Wait}, Facts{Replicas: 1, Machines: []Machine{{Name: "a"}}}, false},
	} {
		if got := mayUpgrade(tc.step, tc.f); got != tc.want {
			t.Errorf("%s: mayUpgrade = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A drained machine stays out of the endpoint while the step on it has
// not taken effect, and comes back once its component reports the target
// (or the step was rolled back).
func TestPendingStep(t *testing.T) {
	m := &clusterv1.Machine{}
	m.Name = "a"
	m.Status.Versions.ControlPlane = &clusterv1.ComponentVersions{APIServer: "v1.36.3", ControllerManager: "v1.36.3", Scheduler: "v1.36.3"}
	step := &clusterv1.UpgradeStep{Action: string(upgrade.SetComponent), Machine: "a", Component: string(upgrade.APIServer), From: "v1.36.3", To: "v1.37.2"}
	if !pending(step, m) {
		t.Errorf("a step whose component still reports its old version is not pending")
	}
	other := *step
	other.Machine = "b"
	if pending(&other, m) {
		t.Errorf("a step on another machine holds this one out of the endpoint")
	}
	rolledBack := *step
	rolledBack.State = clusterv1.UpgradeStepRolledBack
	if pending(&rolledBack, m) {
		t.Errorf("a rolled-back step holds its machine out of the endpoint")
	}
	m.Status.Versions.ControlPlane.APIServer = "v1.37.2"
	if pending(step, m) {
		t.Errorf("a step whose component reports the target is still pending")
	}
	if pending(nil, m) {
		t.Errorf("no step, yet pending")
	}
}

// status.upgrade.steps: done from what the machines report, the current
// one with its state, the rest pending.
func TestStepsOf(t *testing.T) {
	in := upgrade.Input{Version: "v1.37.2", Strategy: upgrade.InPlace, Replicas: 2, EtcdHealthy: true, Machines: []upgrade.Machine{
		{Name: "a", Healthy: true, Versions: map[upgrade.Component]string{upgrade.APIServer: "v1.37.2", upgrade.ControllerManager: "v1.36.3", upgrade.Scheduler: "v1.36.3", upgrade.Kubelet: "v1.36.3"}},
		{Name: "b", Healthy: true, Versions: map[upgrade.Component]string{upgrade.APIServer: "v1.36.3", upgrade.ControllerManager: "v1.36.3", upgrade.Scheduler: "v1.36.3", upgrade.Kubelet: "v1.36.3"}},
	}}
	cur := &clusterv1.UpgradeStep{Action: string(upgrade.SetComponent), Machine: "b", Component: string(upgrade.APIServer), To: "v1.37.2", State: clusterv1.UpgradeStepRunning}
	steps := stepsOf(in, &clusterv1.UpgradeStatus{From: "v1.36.3", Current: cur})
	if len(steps) != 8 {
		t.Fatalf("%d steps, want 8: %+v", len(steps), steps)
	}
	want := []clusterv1.UpgradeStepState{clusterv1.UpgradeStepDone, clusterv1.UpgradeStepRunning, clusterv1.UpgradeStepPending}
	for i, w := range want {
		if steps[i].State != w {
			t.Errorf("step %d (%s on %s) is %s, want %s", i, steps[i].Component, steps[i].Machine, steps[i].State, w)
		}
	}
	if steps[0].From != "v1.36.3" {
		t.Errorf("a done step reads from %q, want the upgrade's v1.36.3", steps[0].From)
	}
}

// A crash between taking a step (the Machine patched) and recording it
// (the Cluster's status) leaves status.upgrade.current on the step before:
// the machines show the step under way, and a halt or a rollback acts on it.
func TestInFlightStepIsRecoveredFromTheMachines(t *testing.T) {
	m := clusterv1.Machine{}
	m.Name = "b"
	m.Spec.Versions = clusterv1.MachineVersions{Kubelet: "v1.36.3", ControlPlane: "v1.36.3", Components: &clusterv1.ComponentVersions{APIServer: "v1.37.2"}}
	m.Status.Versions.Kubelet = "v1.36.3"
	m.Status.Versions.ControlPlane = &clusterv1.ComponentVersions{APIServer: "v1.36.3", ControllerManager: "v1.36.3", Scheduler: "v1.36.3"}
	previous := &clusterv1.UpgradeStep{Action: string(upgrade.SetComponent), Machine: "a", Component: string(upgrade.APIServer), From: "v1.36.3", To: "v1.37.2", State: clusterv1.UpgradeStepRunning}
	st := &clusterv1.UpgradeStatus{Current: previous}
	inFlight(st, []clusterv1.Machine{m})
	if c := st.Current; c.Machine != "b" || c.Component != "kube-apiserver" || c.From != "v1.36.3" || c.To != "v1.37.2" || c.StartedAt == nil {
		t.Errorf("current = %+v, want kube-apiserver on b, v1.36.3 → v1.37.2, timed from now", c)
	}

	// The recorded step is kept, its start too.
	recorded := st.Current
	inFlight(st, []clusterv1.Machine{m})
	if st.Current != recorded {
		t.Errorf("a recorded step was replaced")
	}
	// So is a rolled-back one, while the component returns.
	rolled := *recorded
	rolled.State = clusterv1.UpgradeStepRolledBack
	st.Current = &rolled
	m.Spec.Versions.Components.APIServer = "v1.36.3"
	m.Status.Versions.ControlPlane.APIServer = ""
	inFlight(st, []clusterv1.Machine{m})
	if st.Current != &rolled {
		t.Errorf("a rollback under way was replaced by %+v", st.Current)
	}
	// A machine whose components run what it asks shows nothing.
	st.Current = previous
	m.Status.Versions.ControlPlane.APIServer = "v1.36.3"
	inFlight(st, []clusterv1.Machine{m})
	if st.Current != previous {
		t.Errorf("a settled machine changed the current step to %+v", st.Current)
	}
}

// A controller restarted after a machine was marked for its step waits
// the drain period again from its start: it cannot know whether the
// endpoint was told before it stopped, and its first pass tells it.
func TestDrainWaitCountsFromARestart(t *testing.T) {
	m := &clusterv1.Machine{}
	m.Annotations = map[string]string{clusterv1.EndpointDrainAnnotation: time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)}
	if wait, err := (&ControlPlane{}).drain(context.Background(), m); err != nil || wait {
		t.Errorf("a machine marked a minute ago by this controller: wait = %v (%v), want none", wait, err)
	}
	if wait, err := (&ControlPlane{Started: time.Now()}).drain(context.Background(), m); err != nil || !wait {
		t.Errorf("a machine marked before this controller started: wait = %v (%v), want the drain period again", wait, err)
	}
}

// status.upgrade.current follows the step the machines record when it is
// newer than the one the status names, and keeps the status's own state
// (a halt) of the same step; an older record (a machine added before the
// current RemoveMachine step) changes nothing.
func TestAdoptReadsTheStepUnderWayFromTheMachines(t *testing.T) {
	at := func(d time.Duration) *metav1.Time {
		tm := metav1.NewTime(time.Now().Add(d).Truncate(time.Second))
		return &tm
	}
	onMachine := func(name string, step clusterv1.UpgradeStep) clusterv1.Machine {
		m := clusterv1.Machine{}
		m.Name = name
		rec, err := encodeStep(&step)
		if err != nil {
			t.Fatal(err)
		}
		m.Annotations = map[string]string{clusterv1.UpgradeStepAnnotation: rec}
		return m
	}
	older := clusterv1.UpgradeStep{Action: string(upgrade.SetComponent), Component: "kube-apiserver", From: "v1.36.3", To: "v1.37.2", State: clusterv1.UpgradeStepRunning, StartedAt: at(-time.Hour)}
	newer := older
	newer.StartedAt = at(-time.Minute)
	machines := []clusterv1.Machine{onMachine("a", older), onMachine("b", newer)}

	st := &clusterv1.UpgradeStatus{To: "v1.37.2", Current: &clusterv1.UpgradeStep{Action: older.Action, Machine: "a", Component: older.Component,
		From: older.From, To: older.To, State: clusterv1.UpgradeStepRunning, StartedAt: older.StartedAt}}
	adopt(st, machines)
	if st.Current.Machine != "b" || !st.Current.StartedAt.Equal(newer.StartedAt) {
		t.Errorf("current = %+v, want b's step, begun a minute ago", st.Current)
	}

	halted := *st.Current
	halted.State = clusterv1.UpgradeStepFailed
	st.Current = &halted
	adopt(st, machines)
	if st.Current.State != clusterv1.UpgradeStepFailed {
		t.Errorf("the halt of the recorded step was lost: %+v", st.Current)
	}

	removing := &clusterv1.UpgradeStep{Action: string(upgrade.RemoveMachine), Machine: "c", To: "v1.37.2", State: clusterv1.UpgradeStepRunning, StartedAt: at(0)}
	st.Current = removing
	adopt(st, machines)
	if st.Current != removing {
		t.Errorf("an older record replaced the current step: %+v", st.Current)
	}

	other := &clusterv1.UpgradeStatus{To: "v1.38.0"}
	adopt(other, machines)
	if other.Current != nil {
		t.Errorf("a record of another upgrade was adopted: %+v", other.Current)
	}
}

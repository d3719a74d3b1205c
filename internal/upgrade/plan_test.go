package upgrade

import (
	"fmt"
	"testing"
)

const (
	oldV = "v1.36.3"
	newV = "v1.37.2"
)

// at is a healthy machine whose components run the given versions, in
// Order (apiserver, controller manager, scheduler, etcd, kubelet).
func at(name string, vs ...string) Machine {
	m := Machine{Name: name, Healthy: true, Versions: map[Component]string{}}
	for i, v := range vs {
		m.Versions[Order[i]] = v
	}
	return m
}

func sick(m Machine) Machine { m.Healthy = false; return m }

func inPlace(ms ...Machine) Input {
	return Input{Version: newV, Strategy: InPlace, Replicas: len(ms), Machines: ms, EtcdHealthy: true,
		Workers: map[string]string{"w-1": oldV}}
}

func TestPlanInPlace(t *testing.T) {
	o, n := oldV, newV
	set := func(m string, c Component, from string) Decision {
		return Decision{Next: &Step{Kind: SetComponent, Machine: m, Component: c, From: from, To: newV}}
	}
	tests := []struct {
		name string
		in   Input
		want Decision
	}{
		{"one machine: API server first", inPlace(at("a", o, o, o, "", o)), set("a", APIServer, o)},
		{"one machine: then controller manager", inPlace(at("a", n, o, o, "", o)), set("a", ControllerManager, o)},
		{"one machine: then scheduler", inPlace(at("a", n, n, o, "", o)), set("a", Scheduler, o)},
		{"one machine: then its kubelet", inPlace(at("a", n, n, n, "", o)), set("a", Kubelet, o)},
		{"three: every API server before any controller manager",
			inPlace(at("a", n, o, o, "", o), at("b", o, o, o, "", o), at("c", o, o, o, "", o)), set("b", APIServer, o)},
		{"three: controller managers once all API servers are new",
			inPlace(at("a", n, o, o, "", o), at("b", n, o, o, "", o), at("c", n, o, o, "", o)), set("a", ControllerManager, o)},
		{"three: every controller manager before any scheduler",
			inPlace(at("a", n, n, o, "", o), at("b", n, n, o, "", o), at("c", n, o, o, "", o)), set("c", ControllerManager, o)},
		{"halt: an upgraded API server is unhealthy, the next machine waits",
			inPlace(sick(at("a", n, o, o, "", o)), at("b", o, o, o, "", o), at("c", o, o, o, "", o)),
			Decision{Waiting: "waiting for control-plane machine a to be healthy"}},
		{"halt: a restarted component has not reported its version",
			inPlace(at("a", "", o, o, "", o), at("b", o, o, o, "", o)),
			Decision{Waiting: "waiting for kube-apiserver on a to report its version"}},
		{"halt: etcd unhealthy", func() Input { in := inPlace(at("a", o, o, o, "", o)); in.EtcdHealthy = false; return in }(),
			Decision{Waiting: "waiting for every etcd member to be healthy"}},
		{"crash mid-step: mixed versions resume at the first outdated component in order",
			inPlace(at("a", n, n, o, "", o), at("b", n, o, o, "", o), at("c", n, n, o, "", o)), set("b", ControllerManager, o)},
		{"control plane done: the workers roll", inPlace(at("a", n, n, n, "", n)), Decision{Next: &Step{Kind: RollWorkers, To: newV}}},
		{"all done", func() Input {
			in := inPlace(at("a", n, n, n, "", n))
			in.Workers = map[string]string{"w-1": n}
			return in
		}(),
			Decision{Done: true}},
		{"etcd when the release pins a newer one", func() Input {
			in := inPlace(at("a", n, n, n, "v3.6.16", o))
			in.EtcdVersion = "v3.6.17"
			return in
		}(), Decision{Next: &Step{Kind: SetComponent, Machine: "a", Component: Etcd, From: "v3.6.16", To: "v3.6.17"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Plan(tc.in); fmt.Sprint(got, got.Next) != fmt.Sprint(tc.want, tc.want.Next) {
				t.Errorf("Plan = %+v %+v, want %+v %+v", got, got.Next, tc.want, tc.want.Next)
			}
		})
	}
}

// TestPlanInPlaceResumesAtEveryStep walks a 3-machine upgrade by applying
// each step to the observed state, as the controller does, and checks the
// order the components change in: no step is repeated or skipped, and a
// fresh Plan (a restart) at every point gives the same next step.
func TestPlanInPlaceResumesAtEveryStep(t *testing.T) {
	in := inPlace(at("a", oldV, oldV, oldV, "", oldV), at("b", oldV, oldV, oldV, "", oldV), at("c", oldV, oldV, oldV, "", oldV))
	var steps []string
	for range 20 {
		d := Plan(in)
		if again := Plan(in); fmt.Sprint(again.Next) != fmt.Sprint(d.Next) {
			t.Fatalf("a restart planned %v, not %v", again.Next, d.Next)
		}
		if d.Done || d.Next == nil || d.Next.Kind != SetComponent {
			break
		}
		steps = append(steps, string(d.Next.Component)+"/"+d.Next.Machine)
		for i := range in.Machines {
			if in.Machines[i].Name == d.Next.Machine {
				in.Machines[i].Versions[d.Next.Component] = d.Next.To
			}
		}
	}
	want := "[kube-apiserver/a kube-apiserver/b kube-apiserver/c kube-controller-manager/a kube-controller-manager/b kube-controller-manager/c kube-scheduler/a kube-scheduler/b kube-scheduler/c kubelet/a kubelet/b kubelet/c]"
	if fmt.Sprint(steps) != want {
		t.Errorf("steps = %v\nwant    %s", steps, want)
	}
}

func TestPlanReplace(t *testing.T) {
	o, n := oldV, newV
	rep := func(replicas int, ms ...Machine) Input {
		in := inPlace(ms...)
		in.Strategy, in.Replicas = Replace, replicas
		return in
	}
	tests := []struct {
		name string
		in   Input
		want Decision
	}{
		{"one machine: add a new one first", rep(1, at("a", o, o, o, "", o)), Decision{Next: &Step{Kind: AddMachine, To: newV}}},
		{"the new one healthy: remove the old", rep(1, at("a", o, o, o, "", o), at("b", n, n, n, "", n)), Decision{Next: &Step{Kind: RemoveMachine, Machine: "a"}}},
		{"the new one not healthy yet: wait", rep(1, at("a", o, o, o, "", o), sick(at("b", n, n, n, "", n))),
			Decision{Waiting: "waiting for control-plane machine b to be healthy"}},
		{"three: the oldest outdated goes first", rep(3, at("a", o, o, o, "", o), at("b", o, o, o, "", o), at("c", o, o, o, "", o), at("d", n, n, n, "", n)),
			Decision{Next: &Step{Kind: RemoveMachine, Machine: "a"}}},
		{"three: one replaced, add the next", rep(3, at("b", o, o, o, "", o), at("c", o, o, o, "", o), at("d", n, n, n, "", n)),
			Decision{Next: &Step{Kind: AddMachine, To: newV}}},
		{"replaced: the workers roll", rep(1, at("d", n, n, n, "", n)), Decision{Next: &Step{Kind: RollWorkers, To: newV}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Plan(tc.in); fmt.Sprint(got, got.Next) != fmt.Sprint(tc.want, tc.want.Next) {
				t.Errorf("Plan = %+v %+v, want %+v %+v", got, got.Next, tc.want, tc.want.Next)
			}
		})
	}
}

func TestNeeded(t *testing.T) {
	o, n := oldV, newV
	done := func(in Input) Input { in.Workers = map[string]string{"w-1": newV}; return in }
	tests := []struct {
		name string
		in   Input
		want bool
	}{
		{"everything at the version", done(inPlace(at("a", n, n, n, "", n))), false},
		{"an unhealthy cluster at the version has nothing to upgrade", done(inPlace(sick(at("a", n, n, n, "", n)))), false},
		{"one scheduler behind", done(inPlace(at("a", n, n, n, "", n), at("b", n, n, o, "", n))), true},
		{"a kubelet behind", done(inPlace(at("a", n, n, n, "", o))), true},
		{"a worker behind", inPlace(at("a", n, n, n, "", n)), true},
		{"machines being made report nothing: no upgrade", done(inPlace(at("a", "", "", "", "", ""), at("b", n, n, n, "", n))), false},
		{"workers being made report nothing: no upgrade", func() Input { in := inPlace(at("a", n, n, n, "", n)); in.Workers["w-1"] = ""; return in }(), false},
		{"one restarting component does not hide the others behind", done(inPlace(at("a", "", o, o, "", o))), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Needed(tc.in); got != tc.want {
				t.Errorf("Needed = %v, want %v", got, tc.want)
			}
			if d := Plan(tc.in); d.Done == tc.want {
				t.Errorf("Plan = %+v, but Needed = %v", d, tc.want)
			}
		})
	}
}

// The plan a person reads lists every step Plan takes, in its order, and
// nothing else.
func TestStepsListWhatPlanWalks(t *testing.T) {
	o := oldV
	in := inPlace(at("a", o, o, o, "", o), at("b", o, o, o, "", o))
	steps := Steps(in)
	if len(steps) != 4*2+1 {
		t.Fatalf("%d steps, want 9 (4 components on 2 machines, then the workers): %v", len(steps), steps)
	}
	for i := 0; ; i++ {
		d := Plan(in)
		if d.Done {
			if i != len(steps) {
				t.Errorf("Plan took %d steps, Steps listed %d", i, len(steps))
			}
			return
		}
		if d.Next == nil || *d.Next != steps[i] {
			t.Fatalf("step %d: Plan says %+v, Steps listed %v", i, d, steps[i])
		}
		apply(&in, *d.Next)
	}
}

// apply is what carrying out s leads the machines to report.
func apply(in *Input, s Step) {
	if s.Kind == RollWorkers {
		for w := range in.Workers {
			in.Workers[w] = s.To
		}
		return
	}
	for i := range in.Machines {
		if in.Machines[i].Name == s.Machine {
			in.Machines[i].Versions[s.Component] = s.To
		}
	}
}

package upgrade

import (
	"fmt"
)

// Component is one part of a control-plane machine that upgrades on its own.
type Component string

// Components, in the order InPlace upgrades them (M12): every API server
// first, because the other components and the kubelets may be older than
// the API server but never newer.
const (
	APIServer         Component = "kube-apiserver"
	ControllerManager Component = "kube-controller-manager"
	Scheduler         Component = "kube-scheduler"
	Etcd              Component = "etcd"
	Kubelet           Component = "kubelet"
)

// Order is the in-place order of components.
var Order = []Component{APIServer, ControllerManager, Scheduler, Etcd, Kubelet}

// Strategy is spec.controlPlane.upgradeStrategy.type.
type Strategy string

// Strategies.
const (
	InPlace Strategy = "InPlace"
	Replace Strategy = "Replace"
)

// Machine is what the planner knows of one control-plane machine.
type Machine struct {
	Name string
	// Versions are what each component reports of itself; a missing entry
	// is unknown (a component that has not reported since it restarted).
	Versions map[Component]string
	// Healthy: every component of the machine passes its health check.
	Healthy bool
}

// Input is the observed state the planner decides from.
type Input struct {
	// Version is the desired Kubernetes version; EtcdVersion the etcd the
	// release pins (empty: etcd is not upgraded, or it is external).
	Version, EtcdVersion string
	Strategy             Strategy
	// Replicas is the desired number of control-plane machines.
	Replicas int
	// Machines are the control-plane machines, oldest first.
	Machines []Machine
	// EtcdHealthy: every etcd member answers.
	EtcdHealthy bool
	// Workers are the kubelet versions of the workers, by machine name.
	Workers map[string]string
}

// Kind is what a step does.
type Kind string

// Kinds of step.
const (
	// SetComponent restarts one component of one machine at To.
	SetComponent Kind = "SetComponent"
	// AddMachine creates a control-plane machine at the new version (Replace).
	AddMachine Kind = "AddMachine"
	// RemoveMachine removes an old control-plane machine, its etcd member
	// first (Replace).
	RemoveMachine Kind = "RemoveMachine"
	// RollWorkers moves the workers' MachineDeployments to the new version;
	// their rolling update respects maxSurge and maxUnavailable.
	RollWorkers Kind = "RollWorkers"
)

// Step is one step of an upgrade.
type Step struct {
	Kind      Kind
	Machine   string
	Component Component
	From, To  string
}

func (s Step) String() string {
	switch s.Kind {
	case SetComponent:
		return fmt.Sprintf("%s on %s: %s → %s", s.Component, s.Machine, s.From, s.To)
	case AddMachine:
		return fmt.Sprintf("add a control-plane machine at %s", s.To)
	case RemoveMachine:
		return fmt.Sprintf("remove control-plane machine %s", s.Machine)
	}
	return fmt.Sprintf("roll the workers to %s", s.To)
}

// Decision is the planner's output: exactly one of Done, Next and Waiting.
type Decision struct {
	Done bool
	// Next is the step to take now.
	Next *Step
	// Waiting says why no step is taken now: the last step has not
	// finished (a component has not reported its new version), or
	// something is unhealthy. The controller halts the upgrade when it
	// waits longer than stepTimeout.
	Waiting string
}

// Plan returns the next step of the upgrade to in.Version.
func Plan(in Input) Decision {
	if !Needed(in) {
		return Decision{Done: true}
	}
	if in.Strategy == Replace {
		return planReplace(in)
	}
	return planInPlace(in)
}

func planInPlace(in Input) Decision {
	for _, c := range Order {
		target := targetOf(in, c)
		if target == "" {
			continue
		}
		for _, m := range in.Machines {
			got := m.Versions[c]
			if got == target {
				continue
			}
			// One component on one machine at a time, and only when
			// everything else serves: the step takes this one away.
			if w := unhealthy(in, m.Name); w != "" {
				return Decision{Waiting: w}
			}
			if got == "" {
				return Decision{Waiting: fmt.Sprintf("waiting for %s on %s to report its version", c, m.Name)}
			}
			return Decision{Next: &Step{Kind: SetComponent, Machine: m.Name, Component: c, From: got, To: target}}
		}
	}
	if w := unhealthy(in, ""); w != "" {
		return Decision{Waiting: w}
	}
	return rollWorkers(in)
}

func planReplace(in Input) Decision {
	var old []string
	for _, m := range in.Machines {
		if !current(in, m) {
			old = append(old, m.Name)
		}
	}
	if w := unhealthy(in, ""); w != "" {
		return Decision{Waiting: w}
	}
	if len(old) == 0 {
		return rollWorkers(in)
	}
	if len(in.Machines) <= in.Replicas {
		return Decision{Next: &Step{Kind: AddMachine, To: in.Version}}
	}
	return Decision{Next: &Step{Kind: RemoveMachine, Machine: old[0]}}
}

func rollWorkers(in Input) Decision {
	for _, v := range in.Workers {
		if v != in.Version {
			return Decision{Next: &Step{Kind: RollWorkers, To: in.Version}}
		}
	}
	return Decision{Done: true}
}

// current: every component of m runs the target.
func current(in Input, m Machine) bool {
	for _, c := range Order {
		if t := targetOf(in, c); t != "" && m.Versions[c] != t {
			return false
		}
	}
	return true
}

func targetOf(in Input, c Component) string {
	if c == Etcd {
		return in.EtcdVersion
	}
	return in.Version
}

// unhealthy names what is not healthy, ignoring machine except (the one a
// step is about to take away anyway, which may be what is being fixed).
func unhealthy(in Input, except string) string {
	if !in.EtcdHealthy {
		return "waiting for every etcd member to be healthy"
	}
	for _, m := range in.Machines {
		if !m.Healthy && m.Name != except {
			return fmt.Sprintf("waiting for control-plane machine %s to be healthy", m.Name)
		}
	}
	return ""
}

// Needed reports whether anything reports another version than in asks
// for: a control-plane component or a worker's kubelet. A cluster that
// runs its version has no upgrade, healthy or not; nor has one whose
// machines are still being made (they report nothing yet, and are made at
// the spec's version).
func Needed(in Input) bool {
	for _, m := range in.Machines {
		for _, c := range Order {
			if t, got := targetOf(in, c), m.Versions[c]; t != "" && got != "" && got != t {
				return true
			}
		}
	}
	for _, v := range in.Workers {
		if v != "" && v != in.Version {
			return true
		}
	}
	return false
}

// Steps are the in-place steps of the whole upgrade in the order Plan
// takes them, each from the version the component reports now: the plan
// a person reads (marina upgrade plan, status.upgrade). A step whose
// component runs its target already is listed with From == To.
func Steps(in Input) []Step {
	var steps []Step
	if in.Strategy == Replace {
		for _, m := range in.Machines {
			if !current(in, m) {
				steps = append(steps, Step{Kind: AddMachine, To: in.Version}, Step{Kind: RemoveMachine, Machine: m.Name})
			}
		}
	} else {
		for _, c := range Order {
			target := targetOf(in, c)
			if target == "" {
				continue
			}
			for _, m := range in.Machines {
				steps = append(steps, Step{Kind: SetComponent, Machine: m.Name, Component: c, From: m.Versions[c], To: target})
			}
		}
	}
	if len(in.Workers) > 0 {
		steps = append(steps, Step{Kind: RollWorkers, To: in.Version})
	}
	return steps
}

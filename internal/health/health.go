package health

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// Spec is the part of a MachineHealthCheck's spec the decision reads.
type Spec struct {
	// Conditions make a machine unhealthy when its Node has one of them for
	// at least its timeout.
	Conditions []Condition
	// NodeStartupTimeout is how long a machine may go without a Node after
	// it started; 0 disables the check.
	NodeStartupTimeout time.Duration
	// MaxUnhealthy is a number of machines or a percentage ("40%") of the
	// selected machines; nil means 100%.
	MaxUnhealthy *intstr.IntOrString
	// Resumed is when remediation was last allowed: again after it had
	// stopped (a short-circuit, an unreachable cluster), or first, when the
	// check was made; zero for none. What stopped it, a network partition say, also made the
	// Nodes' conditions: as it heals, Nodes come back one by one, and a
	// machine whose Node has not yet is not remediated until its condition
	// has also held for its timeout past Resumed.
	Resumed time.Time
	// Remediations are the check's earlier remediations, as recorded
	// (status.recentRemediations). Those made within RemediationWindow of
	// now count toward MaxUnhealthy while their machine is gone.
	Remediations []Remediation
}

// DefaultRemediationWindow is how long a remediation counts toward
// maxUnhealthy when NodeStartupTimeout is 0 (disabled).
const DefaultRemediationWindow = 10 * time.Minute

// RemediationWindow is how long a remediation counts toward maxUnhealthy:
// the time its replacement is given to come up (NodeStartupTimeout), or
// DefaultRemediationWindow when that check is disabled.
func (s Spec) RemediationWindow() time.Duration {
	if s.NodeStartupTimeout > 0 {
		return s.NodeStartupTimeout
	}
	return DefaultRemediationWindow
}

// Remediation is a machine the check deleted, and when.
type Remediation struct {
	Machine string
	At      time.Time
}

// Condition is a Node condition that, held for Timeout, makes a machine
// unhealthy.
type Condition struct {
	Type    corev1.NodeConditionType
	Status  corev1.ConditionStatus
	Timeout time.Duration
}

// Machine is what was observed about one selected machine.
type Machine struct {
	// Name identifies the machine in the plan.
	Name string
	// Failed is true when the machine's phase is Failed or it has a
	// failureReason; FailureMessage says why.
	Failed         bool
	FailureMessage string
	// Deleting is true when the machine has a deletionTimestamp.
	Deleting bool
	// ControlPlane is true for a machine with the ControlPlane role.
	ControlPlane bool
	// OwnedBySet is true when a MachineSet controls the machine, so that
	// deleting it makes the set create a replacement.
	OwnedBySet bool
	// HadNode is true when the machine recorded a Node (status.nodeRef).
	HadNode bool
	// Node is the machine's Node as the workload cluster has it now; nil
	// when no Node carries the machine's providerID.
	Node *corev1.Node
	// Started is when the node-startup clock started: when the machine was
	// provisioned, or created when it has not been yet.
	Started time.Time
}

// Action is what to do about a machine.
type Action int

const (
	// None: nothing beyond the healthy or unhealthy mark.
	None Action = iota
	// Remediate: delete the machine; its MachineSet replaces it.
	Remediate
	// MarkOnly: the machine is unhealthy and would be remediated, but
	// marina cannot replace it (no set owns it, or it is a control-plane
	// machine): annotate it so a person can.
	MarkOnly
)

func (a Action) String() string {
	switch a {
	case Remediate:
		return "Remediate"
	case MarkOnly:
		return "MarkOnly"
	default:
		return "None"
	}
}

// Verdict is the decision about one machine.
type Verdict struct {
	Name string
	// Healthy is false when the machine is unhealthy or being deleted.
	Healthy bool
	// Reason and Message explain an unhealthy machine (a
	// HealthCheckSucceeded reason and a sentence); empty when healthy.
	Reason, Message string
	Action          Action
	// Pending is true for a healthy machine whose Node has an unhealthy
	// condition that has not yet lasted its timeout: it counts toward
	// maxUnhealthy, as what is coming.
	Pending bool
	// HoldUntil, for a machine unhealthy by a Node condition older than
	// Spec.Resumed, is when its timeout past Resumed ends: it counts as
	// unhealthy, but is not remediated before then.
	HoldUntil time.Time
}

// Plan is the decision for one MachineHealthCheck.
type Plan struct {
	// Machines has one verdict per input machine, in input order.
	Machines []Verdict
	// Expected is the number of selected machines; Healthy of them are
	// healthy. Machines being deleted count as expected, not healthy.
	Expected, Healthy int
	// Pending is the number of healthy machines whose Node has an unhealthy
	// condition that has not yet lasted its timeout.
	Pending int
	// Remediations are the records of Spec.Remediations still within the
	// remediation window, to keep; Recent of them are of machines that are
	// gone (a machine still being deleted counts as unhealthy already).
	Remediations []Remediation
	Recent       int
	// Window is Spec.RemediationWindow().
	Window time.Duration
	// MaxUnhealthy is spec.maxUnhealthy as a number of machines.
	MaxUnhealthy int
	// Allowed is false when more machines count against MaxUnhealthy than
	// it allows (see Counted): then nothing is remediated or marked for
	// remediation.
	Allowed bool
	// RemediationsAllowed is how many more machines may count against
	// MaxUnhealthy before remediation stops.
	RemediationsAllowed int
	// RequeueAt is the earliest time a pending timeout expires; zero when
	// none is pending (the next change of a machine or Node brings the check
	// back).
	RequeueAt time.Time
}

// Unhealthy is the number of selected machines that are not healthy.
func (p Plan) Unhealthy() int { return p.Expected - p.Healthy }

// Counted is the number of machines that count against MaxUnhealthy: the
// unhealthy ones, those whose unhealthy condition has begun (Pending), and
// those remediated within the window whose machines are gone (Recent).
// Upstream Cluster API counts only the first; a storm that builds a few
// machines at a time would then be remediated whole, each batch within the
// limit, the remediated machines gone within seconds and their replacements
// counted healthy.
func (p Plan) Counted() int { return p.Unhealthy() + p.Pending + p.Recent }

// Decide judges each machine at time now and decides what to remediate. It
// returns an error only for a maxUnhealthy it cannot read; then nothing may
// be remediated.
func Decide(spec Spec, machines []Machine, now time.Time) (Plan, error) {
	plan := Plan{Machines: make([]Verdict, len(machines)), Expected: len(machines), Window: spec.RemediationWindow()}
	present := make(map[string]bool, len(machines))
	for i := range machines {
		present[machines[i].Name] = true
		v, next := judge(spec, &machines[i], now)
		plan.Machines[i] = v
		if v.Healthy {
			plan.Healthy++
		}
		if v.Pending {
			plan.Pending++
		}
		if !next.IsZero() && (plan.RequeueAt.IsZero() || next.Before(plan.RequeueAt)) {
			plan.RequeueAt = next
		}
	}
	for _, r := range spec.Remediations {
		if now.Sub(r.At) >= plan.Window {
			continue // long enough ago to be a separate event
		}
		plan.Remediations = append(plan.Remediations, r)
		if !present[r.Machine] {
			plan.Recent++
		}
	}
	limit, err := MaxUnhealthy(spec.MaxUnhealthy, plan.Expected)
	if err != nil {
		return plan, err
	}
	plan.MaxUnhealthy = limit
	// As upstream Cluster API, remediation goes on while at most
	// maxUnhealthy machines count, the limit included; but more count (see
	// Counted).
	plan.Allowed = plan.Counted() <= limit
	plan.RemediationsAllowed = max(limit-plan.Counted(), 0)
	if !plan.Allowed {
		return plan, nil
	}
	for i := range plan.Machines {
		v, m := &plan.Machines[i], &machines[i]
		switch {
		case v.Healthy || m.Deleting:
			// A machine being deleted is not remediated again: it is
			// already on its way out, and its set has counted it.
		case now.Before(v.HoldUntil):
			v.Message += fmt.Sprintf("; remediation resumed at %s after it had stopped, so it waits until %s for the Node to come back",
				spec.Resumed.UTC().Format(time.RFC3339), v.HoldUntil.UTC().Format(time.RFC3339))
			if plan.RequeueAt.IsZero() || v.HoldUntil.Before(plan.RequeueAt) {
				plan.RequeueAt = v.HoldUntil
			}
		case m.ControlPlane:
			// Marked for its control plane, which replaces it when etcd
			// keeps a quorum without it, one machine at a time.
			v.Action = MarkOnly
			v.Message += "; the control plane replaces it once etcd keeps its quorum without it (see the Cluster's ControlPlaneReady condition)"
		case !m.OwnedBySet:
			v.Action = MarkOnly
			v.Message += "; no MachineSet owns the machine, so nothing would replace it: replace it by hand, or delete it"
		default:
			v.Action = Remediate
		}
	}
	return plan, nil
}

// judge decides whether one machine is healthy now, and when its verdict may
// change on its own (a timeout yet to expire; zero when none).
func judge(spec Spec, m *Machine, now time.Time) (Verdict, time.Time) {
	v := Verdict{Name: m.Name}
	unhealthy := func(reason, format string, args ...any) (Verdict, time.Time) {
		v.Reason, v.Message, v.Pending = reason, fmt.Sprintf(format, args...), false
		return v, time.Time{}
	}
	switch {
	case m.Deleting:
		return unhealthy(clusterv1.DeletingReason, "the machine is being deleted")
	case m.Failed:
		msg := m.FailureMessage
		if msg == "" {
			msg = "no failure message"
		}
		return unhealthy(clusterv1.MachineFailedReason, "the machine is Failed: %s", msg)
	case m.Node == nil && m.HadNode:
		return unhealthy(clusterv1.MachineNodeDeletedReason, "the machine's Node was deleted from the workload cluster")
	case m.Node == nil:
		if spec.NodeStartupTimeout <= 0 {
			v.Healthy = true
			return v, time.Time{}
		}
		deadline := m.Started.Add(spec.NodeStartupTimeout)
		if !now.Before(deadline) {
			return unhealthy(clusterv1.MachineNodeStartupTimeoutReason,
				"no Node registered within nodeStartupTimeout (%s) of the machine starting at %s",
				spec.NodeStartupTimeout, m.Started.UTC().Format(time.RFC3339))
		}
		v.Healthy = true
		return v, deadline
	}
	var next time.Time
	for _, c := range spec.Conditions {
		nc := nodeCondition(m.Node, c.Type)
		if nc == nil || nc.Status != c.Status {
			continue
		}
		since := nc.LastTransitionTime.Time
		deadline := since.Add(c.Timeout)
		if !now.Before(deadline) {
			if since.Before(spec.Resumed) {
				v.HoldUntil = spec.Resumed.Add(c.Timeout)
			}
			return unhealthy(clusterv1.MachineUnhealthyNodeConditionReason,
				"Node %s has had %s=%s for %s, longer than the timeout (%s)",
				m.Node.Name, c.Type, c.Status, now.Sub(since).Round(time.Second), c.Timeout)
		}
		v.Pending = true
		if next.IsZero() || deadline.Before(next) {
			next = deadline
		}
	}
	v.Healthy = true
	return v, next
}

// Record is the check's remediation record after plan is carried out at
// now: the records still within the window, and one for each machine the
// plan remediates (replacing an older record of the same machine).
func Record(plan Plan, now time.Time) []Remediation {
	out := make([]Remediation, 0, len(plan.Remediations))
	remediated := map[string]bool{}
	for _, v := range plan.Machines {
		if v.Action == Remediate {
			remediated[v.Name] = true
		}
	}
	for _, r := range plan.Remediations {
		if !remediated[r.Machine] {
			out = append(out, r)
		}
	}
	for _, v := range plan.Machines {
		if v.Action == Remediate {
			out = append(out, Remediation{Machine: v.Name, At: now})
		}
	}
	return out
}

func nodeCondition(n *corev1.Node, t corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == t {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// MaxUnhealthy turns spec.maxUnhealthy into a number of machines out of
// expected: a number stands for itself, a percentage is rounded down (40%
// of 6 machines is 2), as upstream Cluster API does; nil means 100%. A
// negative number or a percentage outside 0%..100% is an error.
func MaxUnhealthy(v *intstr.IntOrString, expected int) (int, error) {
	if v == nil {
		return expected, nil
	}
	if v.Type == intstr.Int {
		if v.IntVal < 0 {
			return 0, fmt.Errorf("maxUnhealthy %d is negative: use a number of machines from 0 or a percentage like 40%%", v.IntVal)
		}
		return int(v.IntVal), nil
	}
	s, ok := strings.CutSuffix(v.StrVal, "%")
	pct, err := strconv.Atoi(s)
	if !ok || err != nil || pct < 0 || pct > 100 {
		return 0, fmt.Errorf("maxUnhealthy %q is neither a number of machines nor a percentage from 0%% to 100%%", v.StrVal)
	}
	return pct * expected / 100, nil // integer division rounds down
}

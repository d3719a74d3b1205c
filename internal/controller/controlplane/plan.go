package controlplane

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// Machine is what the planner knows of one control-plane machine.
type Machine struct {
	Name string
	// Ready: its Node is Ready (its agent and API server answer).
	Ready bool
	// Deleting: it has a deletion timestamp, DeletingFor this long.
	Deleting    bool
	DeletingFor time.Duration
	// Hook: it still holds the etcd pre-terminate hook.
	Hook bool
	// Made: the machine controller recorded the provider's answer on it
	// (a providerID or an address), the one definition of made that the
	// machine controller acts on too. A machine deleted before that
	// answer landed may run an etcd member nobody can see yet.
	Made bool
	// Known: its member, if it runs one, can be told from a member of no
	// machine: the machine records its member ID or its address, or its
	// member was found by name. A provider may record a machine's ID
	// before its address; until the address lands, a joining member (a
	// learner, nameless until it starts) cannot be tied to it.
	Known bool
	// Member: the etcd cluster lists a member for it (by the member ID
	// recorded on it, else its address or name); MemberHealthy: that
	// member answers and votes; MemberVotes: it votes (not a learner).
	Member, MemberHealthy, MemberVotes bool
	// MemberGone: its recorded member is no longer in the etcd cluster:
	// it can never serve again, and is replaced.
	MemberGone bool
	// Unhealthy: a MachineHealthCheck marked it for remediation.
	Unhealthy bool
	// Drained: an upgrade step took its API server out of the endpoint.
	Drained bool
}

// Facts are the planner's input: the spec, the machines, and etcd.
type Facts struct {
	// Replicas is spec.controlPlane.replicas.
	Replicas int
	// Stacked: each machine runs an etcd member marina manages.
	Stacked bool
	// Initialized: the first control-plane machine has come up once.
	Initialized bool
	// Machines, oldest first.
	Machines []Machine
	// Members counts the stacked etcd's members, learners included;
	// Voters those that vote, HealthyMembers the voters that answer. All
	// three include members of no machine (left over, or being added).
	Members, Voters, HealthyMembers int
	// Orphans are the members that belong to no machine.
	Orphans []Member
	// EtcdKnown: the etcd facts were read (false when no member answered).
	EtcdKnown bool
}

// Member is an etcd member, as the planner knows one that belongs to no
// machine.
type Member struct {
	ID   uint64
	Name string
	// Healthy: it answers and votes; Votes: it is not a learner.
	Healthy, Votes bool
}

// Action is what the control plane does next.
type Action string

// Actions.
const (
	// Create a control-plane machine: the first (Init) or one more.
	Create Action = "Create"
	// Delete a control-plane machine (scale down).
	Delete Action = "Delete"
	// Remediate deletes an unhealthy control-plane machine, which the
	// next steps replace.
	Remediate Action = "Remediate"
	// Release the etcd hook of a machine being deleted: remove its member
	// (if any), then the hook, so that its deletion goes on.
	Release Action = "Release"
	// RemoveMember removes an etcd member that belongs to no machine.
	RemoveMember Action = "RemoveMember"
	// Wait for something to change; Reason says what.
	Wait Action = "Wait"
	// Done: the control plane has its replicas.
	Done Action = "Done"
)

// Step is the planner's output: one action at a time (M10: one machine at a
// time, up or down).
type Step struct {
	Action   Action
	Machine  string // Delete, Release
	MemberID uint64 // RemoveMember
	Init     bool   // Create: the machine starts a new cluster
	Reason   string // Wait: why, for the conditions
	// Why is the ControlPlaneReady reason of a Wait that is not the
	// usual one (a constant of the API package), or empty.
	Why string
	// RequeueAfter: a Wait that ends by itself, after this long.
	RequeueAfter time.Duration
}

// Plan returns the next step. It is a pure function: the control plane
// executes the step and plans again from what it then observes, so a
// restart at any point resumes from the facts, never from memory.
func Plan(f Facts) Step {
	for _, m := range f.Machines {
		if m.Deleting && m.Hook {
			return release(f, m)
		}
	}
	for _, m := range f.Machines {
		if m.Deleting {
			return Step{Action: Wait, Reason: fmt.Sprintf("waiting for control-plane machine %s to be deleted", m.Name)}
		}
	}
	n := len(f.Machines)
	if !f.Initialized {
		if n == 0 {
			return Step{Action: Create, Init: true}
		}
		return Step{Action: Wait, Reason: fmt.Sprintf("waiting for the first control-plane machine %s to come up", f.Machines[0].Name)}
	}
	if n == 0 {
		return Step{Action: Wait, Reason: "every control-plane machine is gone: there is no running control plane to join; restore the cluster from a backup"}
	}
	if step, ok := orphan(f); ok {
		return step
	}
	for _, m := range f.Machines {
		if (m.Unhealthy || m.MemberGone) && n >= f.Replicas {
			return remediate(f, m)
		}
	}
	if notReady := unready(f.Machines); len(notReady) > 0 && n <= f.Replicas {
		return Step{Action: Wait, Reason: "waiting for control-plane machines to be ready: " + strings.Join(notReady, ", ")}
	}
	if f.Stacked && n <= f.Replicas {
		if !f.EtcdKnown {
			return Step{Action: Wait, Reason: "no etcd member answers", Why: clusterv1.ClusterEtcdMembershipUnknownReason}
		}
		if f.HealthyMembers < f.Members {
			return Step{Action: Wait, Reason: fmt.Sprintf("%d of %d etcd members are healthy: no machine is added until all are", f.HealthyMembers, f.Members)}
		}
	}
	switch {
	case n < f.Replicas:
		return Step{Action: Create}
	case n > f.Replicas:
		return Step{Action: Delete, Machine: victim(f.Machines)}
	}
	return Step{Action: Done}
}

// EndpointDrainWait is how long a machine being deleted keeps its etcd
// member: the endpoint stops sending to its API server first (the cluster
// controller takes it out of the backends at once; the local balancer
// applies that within a second and closes what is left two seconds
// later), so that no client is left on an API server whose etcd is gone.
const EndpointDrainWait = 5 * time.Second

// release lets m's deletion go on when removing its etcd member keeps a
// quorum of healthy voters (M14); otherwise it waits and says why. A
// machine whose member cannot be known (the provider's answer is not
// recorded on it, or etcd does not answer) waits: letting it go could take
// a voter away without removing it.
func release(f Facts, m Machine) Step {
	if !f.Stacked {
		return Step{Action: Release, Machine: m.Name}
	}
	if !m.Made {
		return Step{Action: Wait, Why: clusterv1.ClusterWaitingForProviderReason, Reason: fmt.Sprintf(
			"control-plane machine %s is being deleted before its provider's answer was recorded: waiting for the machine controller to learn whether it was made (its etcd member goes first)", m.Name)}
	}
	if !f.EtcdKnown {
		return Step{Action: Wait, Why: clusterv1.ClusterEtcdMembershipUnknownReason,
			Reason: fmt.Sprintf("cannot tell whether %s has an etcd member to remove first: no etcd member answers", m.Name)}
	}
	if !m.Member {
		return Step{Action: Release, Machine: m.Name}
	}
	if m.DeletingFor < EndpointDrainWait {
		return Step{Action: Wait, Reason: fmt.Sprintf("waiting for the endpoint to stop sending to %s before removing its etcd member", m.Name),
			RequeueAfter: EndpointDrainWait - m.DeletingFor}
	}
	if ok, after, healthyAfter := KeepsQuorum(f.Voters, f.HealthyMembers, m.MemberVotes, m.MemberHealthy); !ok {
		return Step{Action: Wait, Reason: fmt.Sprintf(
			"removing the etcd member of %s would leave %d healthy of %d voting members, below the quorum of %d: waiting until the other members are healthy",
			m.Name, healthyAfter, after, after/2+1)}
	}
	return Step{Action: Release, Machine: m.Name}
}

// KeepsQuorum projects the removal of one member from an etcd cluster of
// voters voting members, healthy of which answer: the removal is safe when
// the healthy voters left are a quorum of the voters left (a learner's
// removal changes neither). Removing the last member is allowed: the
// cluster is going.
func KeepsQuorum(voters, healthy int, votes, answers bool) (ok bool, after, healthyAfter int) {
	after, healthyAfter = voters, healthy
	if votes {
		after--
		if answers {
			healthyAfter--
		}
	}
	return after == 0 || healthyAfter >= after/2+1, after, healthyAfter
}

// orphan removes a member that belongs to no machine (left by a machine
// deleted with its member, or by a crash), as upstream KubeadmControlPlane
// does, when that keeps a quorum of healthy voters. Never while a machine
// is not made yet, or made but not known yet (no address, no member ID
// recorded): a joining machine adds its member before that is recorded,
// and that member would look like an orphan.
func orphan(f Facts) (Step, bool) {
	if !f.Stacked || !f.EtcdKnown || len(f.Orphans) == 0 {
		return Step{}, false
	}
	for _, m := range f.Machines {
		if !m.Made || !m.Known {
			return Step{}, false
		}
	}
	// The ones that do not answer first: their removal can only help.
	orphans := slices.Clone(f.Orphans)
	slices.SortStableFunc(orphans, func(a, b Member) int {
		return cmpBool(a.Healthy, b.Healthy)
	})
	o := orphans[0]
	name := memberName(o)
	if ok, after, healthyAfter := KeepsQuorum(f.Voters, f.HealthyMembers, o.Votes, o.Healthy); !ok {
		return Step{Action: Wait, Reason: fmt.Sprintf(
			"etcd member %s belongs to no control-plane machine, but removing it would leave %d healthy of %d voting members, below the quorum of %d",
			name, healthyAfter, after, after/2+1)}, true
	}
	return Step{Action: RemoveMember, MemberID: o.ID, Reason: fmt.Sprintf("etcd member %s belongs to no control-plane machine", name)}, true
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

func memberName(m Member) string {
	if m.Name == "" {
		return fmt.Sprintf("%x (not started)", m.ID)
	}
	return fmt.Sprintf("%s (%x)", m.Name, m.ID)
}

// remediate deletes m, marked unhealthy by a health check, when the
// control plane keeps serving without it (issue: health and safety): one
// machine at a time (the others ready, none being replaced), never the
// only one, and never when removing its etcd member would leave fewer
// members than a quorum, or any unhealthy member beside it: the outcome is
// projected before acting.
func remediate(f Facts, m Machine) Step {
	wait := func(format string, args ...any) Step {
		return Step{Action: Wait, Reason: fmt.Sprintf("control-plane machine %s is unhealthy but is not remediated yet: ", m.Name) + fmt.Sprintf(format, args...)}
	}
	if len(f.Machines) == 1 {
		return wait("it is the only one, and replacing it would lose the cluster's etcd; repair it, or restore the cluster from a backup")
	}
	var others []string
	for _, o := range f.Machines {
		if o.Name != m.Name && (!o.Ready || o.Drained) {
			others = append(others, o.Name)
		}
	}
	if len(others) > 0 {
		sort.Strings(others)
		return wait("one control-plane machine is remediated at a time, and %s is not ready or is being upgraded", strings.Join(others, ", "))
	}
	if f.Stacked {
		if !f.EtcdKnown {
			step := wait("no etcd member answers")
			step.Why = clusterv1.ClusterEtcdMembershipUnknownReason
			return step
		}
		members, healthyAfter := f.Members, f.HealthyMembers
		if m.Member {
			members--
			if m.MemberHealthy {
				healthyAfter--
			}
		}
		if healthyAfter < members {
			return wait("%d of the %d etcd members that would remain are healthy: every other member must be", healthyAfter, members)
		}
		ok, after, healthyAfter := KeepsQuorum(f.Voters, f.HealthyMembers, m.Member && m.MemberVotes, m.MemberHealthy)
		if after == 0 || !ok {
			return wait("removing its etcd member would leave %d healthy of %d, below a quorum", healthyAfter, after)
		}
	}
	return Step{Action: Remediate, Machine: m.Name}
}

func unready(ms []Machine) []string {
	var names []string
	for _, m := range ms {
		if !m.Ready {
			names = append(names, m.Name)
		}
	}
	sort.Strings(names)
	return names
}

// victim is the machine a scale-down removes: one that is not ready (it
// serves nothing), else the oldest (it has run longest on old settings).
func victim(ms []Machine) string {
	for _, m := range ms {
		if !m.Ready {
			return m.Name
		}
	}
	return ms[0].Name
}

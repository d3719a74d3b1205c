package controlplane

import (
	"strings"
	"testing"
	"time"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

func ready(name string) Machine {
	return Machine{Name: name, Ready: true, Made: true, Known: true, Hook: true, Member: true, MemberHealthy: true, MemberVotes: true}
}

func deleting(m Machine) Machine { m.Deleting, m.DeletingFor = true, time.Minute; return m }

func marked(m Machine) Machine { m.Unhealthy = true; return m }

func TestPlan(t *testing.T) {
	sick := ready("cp-1")
	sick.Ready, sick.MemberHealthy = false, false
	neverMade := Machine{Name: "cp-2", Hook: true, Deleting: true}
	cases := []struct {
		name   string
		facts  Facts
		want   Step
		reason string // a fragment of Step.Reason
	}{
		{name: "a new cluster starts with its first machine",
			facts: Facts{Replicas: 3, Stacked: true},
			want:  Step{Action: Create, Init: true}},
		{name: "the first machine is not up yet: nothing else is made",
			facts:  Facts{Replicas: 3, Stacked: true, Machines: []Machine{{Name: "cp-0", Made: true}}},
			want:   Step{Action: Wait},
			reason: "first control-plane machine cp-0"},
		{name: "initialized and healthy: one more joins",
			facts: Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0")}, Members: 1, Voters: 1, HealthyMembers: 1, EtcdKnown: true},
			want:  Step{Action: Create}},
		{name: "one at a time: the second must be ready before the third",
			facts:  Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), {Name: "cp-1", Made: true}}, Members: 2, Voters: 2, HealthyMembers: 2, EtcdKnown: true},
			want:   Step{Action: Wait},
			reason: "cp-1"},
		{name: "an unhealthy member stops scale-up",
			facts:  Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), ready("cp-1")}, Members: 2, Voters: 2, HealthyMembers: 1, EtcdKnown: true},
			want:   Step{Action: Wait},
			reason: "1 of 2 etcd members"},
		{name: "etcd unreachable stops scale-up",
			facts:  Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0")}},
			want:   Step{Action: Wait, Why: clusterv1.ClusterEtcdMembershipUnknownReason},
			reason: "no etcd member answers"},
		{name: "external etcd needs no etcd facts",
			facts: Facts{Replicas: 2, Initialized: true, Machines: []Machine{ready("cp-0")}},
			want:  Step{Action: Create}},
		{name: "in shape",
			facts: Facts{Replicas: 1, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0")}, Members: 1, Voters: 1, HealthyMembers: 1, EtcdKnown: true},
			want:  Step{Action: Done}},
		{name: "scale down removes the oldest ready machine",
			facts: Facts{Replicas: 1, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), ready("cp-1"), ready("cp-2")}, Members: 3, Voters: 3, HealthyMembers: 3, EtcdKnown: true},
			want:  Step{Action: Delete, Machine: "cp-0"}},
		{name: "scale down removes an unready machine first",
			facts: Facts{Replicas: 1, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), sick, ready("cp-2")}, Members: 3, Voters: 3, HealthyMembers: 2, EtcdKnown: true},
			want:  Step{Action: Delete, Machine: "cp-1"}},
		{name: "a deleted machine's member goes when quorum holds (3 healthy → 2)",
			facts: Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), deleting(ready("cp-1")), ready("cp-2")}, Members: 3, Voters: 3, HealthyMembers: 3, EtcdKnown: true},
			want:  Step{Action: Release, Machine: "cp-1"}},
		{name: "a sick member can go even when another is down (3 members, 1 sick being removed)",
			facts: Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), deleting(sick), ready("cp-2")}, Members: 3, Voters: 3, HealthyMembers: 2, EtcdKnown: true},
			want:  Step{Action: Release, Machine: "cp-1"}},
		{name: "removing a healthy member while another is sick would lose quorum",
			facts:  Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{deleting(ready("cp-0")), sick, ready("cp-2")}, Members: 3, Voters: 3, HealthyMembers: 2, EtcdKnown: true},
			want:   Step{Action: Wait},
			reason: "below the quorum of 2"},
		{name: "a member stays until the endpoint has stopped sending to its API server",
			facts:  Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), {Name: "cp-1", Ready: true, Made: true, Hook: true, Member: true, MemberHealthy: true, MemberVotes: true, Deleting: true, DeletingFor: time.Second}, ready("cp-2")}, Members: 3, Voters: 3, HealthyMembers: 3, EtcdKnown: true},
			want:   Step{Action: Wait, RequeueAfter: EndpointDrainWait - time.Second},
			reason: "endpoint to stop sending to cp-1"},
		{name: "a machine deleted before the provider's answer was recorded waits for it: it may run a voting member",
			facts:  Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), neverMade}, Members: 2, Voters: 2, HealthyMembers: 2, EtcdKnown: true},
			want:   Step{Action: Wait, Why: clusterv1.ClusterWaitingForProviderReason},
			reason: "whether it was made"},
		{name: "a made machine with no member goes at once",
			facts: Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), {Name: "cp-2", Hook: true, Deleting: true, Made: true}}, Members: 1, Voters: 1, HealthyMembers: 1, EtcdKnown: true},
			want:  Step{Action: Release, Machine: "cp-2"}},
		{name: "external etcd: a machine never made goes at once",
			facts: Facts{Replicas: 3, Initialized: true, Machines: []Machine{ready("cp-0"), neverMade}},
			want:  Step{Action: Release, Machine: "cp-2"}},
		{name: "etcd not observable: a machine without a known member is not let go",
			facts:  Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), {Name: "cp-2", Hook: true, Deleting: true, DeletingFor: time.Minute, Made: true}}},
			want:   Step{Action: Wait, Why: clusterv1.ClusterEtcdMembershipUnknownReason},
			reason: "no etcd member answers"},
		{name: "a learner's removal changes no quorum (3 voters, 2 healthy, 2 learners, one goes)",
			facts: Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), sick, ready("cp-3"), deleting(Machine{Name: "cp-2", Made: true, Hook: true, Member: true})}, Members: 5, Voters: 3, HealthyMembers: 2, EtcdKnown: true},
			want:  Step{Action: Release, Machine: "cp-2"}},
		{name: "a member of no machine is removed when quorum holds",
			facts: Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), ready("cp-2")}, Members: 3, Voters: 3, HealthyMembers: 2, EtcdKnown: true,
				Orphans: []Member{{ID: 0x1b, Name: "cp-1", Votes: true}}},
			want: Step{Action: RemoveMember, MemberID: 0x1b}},
		{name: "the orphan that does not answer goes first",
			facts: Facts{Replicas: 1, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0")}, Members: 3, Voters: 3, HealthyMembers: 2, EtcdKnown: true,
				Orphans: []Member{{ID: 0x1a, Name: "a", Votes: true, Healthy: true}, {ID: 0x1b, Name: "b", Votes: true}}},
			want: Step{Action: RemoveMember, MemberID: 0x1b}},
		{name: "a member of no machine stays when its removal would lose quorum",
			facts: Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), sick}, Members: 3, Voters: 3, HealthyMembers: 2, EtcdKnown: true,
				Orphans: []Member{{ID: 0x1c, Name: "old", Votes: true, Healthy: true}}},
			want:   Step{Action: Wait},
			reason: "below the quorum of 2"},
		{name: "no member is taken for an orphan while a machine is not made (it may be that machine's)",
			facts:  Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), {Name: "cp-1", Hook: true}}, Members: 2, Voters: 1, HealthyMembers: 1, EtcdKnown: true, Orphans: []Member{{ID: 0x1d}}},
			want:   Step{Action: Wait},
			reason: "waiting for control-plane machines to be ready: cp-1"},
		{name: "nor while a made machine is not known yet (its provider gave no address yet, its member is not recorded)",
			facts:  Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), {Name: "cp-1", Hook: true, Made: true}}, Members: 2, Voters: 1, HealthyMembers: 1, EtcdKnown: true, Orphans: []Member{{ID: 0x1d}}},
			want:   Step{Action: Wait},
			reason: "waiting for control-plane machines to be ready: cp-1"},
		{name: "etcd not observable: no orphan is removed",
			facts:  Facts{Replicas: 1, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0")}, Orphans: []Member{{ID: 0x1d}}},
			want:   Step{Action: Wait, Why: clusterv1.ClusterEtcdMembershipUnknownReason},
			reason: "no etcd member answers"},
		{name: "a machine whose recorded member is gone is replaced",
			facts: Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), {Name: "cp-1", Ready: true, Made: true, Hook: true, MemberGone: true}, ready("cp-2")}, Members: 2, Voters: 2, HealthyMembers: 2, EtcdKnown: true},
			want:  Step{Action: Remediate, Machine: "cp-1"}},
		{name: "the last member may go (the cluster is deleted)",
			facts: Facts{Replicas: 1, Stacked: true, Initialized: true, Machines: []Machine{deleting(ready("cp-0"))}, Members: 1, Voters: 1, HealthyMembers: 1, EtcdKnown: true},
			want:  Step{Action: Release, Machine: "cp-0"}},
		{name: "no member answers: a made machine's member cannot be removed",
			facts:  Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{deleting(ready("cp-0"))}},
			want:   Step{Action: Wait, Why: clusterv1.ClusterEtcdMembershipUnknownReason},
			reason: "no etcd member answers"},
		{name: "a released machine is waited for before anything else",
			facts:  Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), {Name: "cp-1", Deleting: true, Made: true}}, Members: 1, Voters: 1, HealthyMembers: 1, EtcdKnown: true},
			want:   Step{Action: Wait},
			reason: "cp-1 to be deleted"},
		{name: "remediation: a marked machine whose member is down goes (2 healthy of 2 remain)",
			facts: Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), marked(sick), ready("cp-2")}, Members: 3, Voters: 3, HealthyMembers: 2, EtcdKnown: true},
			want:  Step{Action: Remediate, Machine: "cp-1"}},
		{name: "remediation: a marked machine goes before the not-ready wait would hold it",
			facts: Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{marked(sick), ready("cp-0"), ready("cp-2")}, Members: 3, Voters: 3, HealthyMembers: 2, EtcdKnown: true},
			want:  Step{Action: Remediate, Machine: "cp-1"}},
		{name: "remediation: one at a time, a second marked machine waits while the first's replacement is not ready",
			facts:  Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), marked(ready("cp-2")), {Name: "cp-3", Made: true, Hook: true, Member: true}}, Members: 3, Voters: 3, HealthyMembers: 2, EtcdKnown: true},
			want:   Step{Action: Wait},
			reason: "one control-plane machine is remediated at a time, and cp-3 is not ready"},
		{name: "remediation: not while another machine is out of the endpoint for an upgrade step",
			facts:  Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{func() Machine { m := ready("cp-0"); m.Drained = true; return m }(), marked(sick), ready("cp-2")}, Members: 3, Voters: 3, HealthyMembers: 2, EtcdKnown: true},
			want:   Step{Action: Wait},
			reason: "cp-0 is not ready or is being upgraded"},
		{name: "remediation: never when another member is unhealthy (projected: 1 healthy of 2 remain)",
			facts:  Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), marked(ready("cp-1")), ready("cp-2")}, Members: 3, Voters: 3, HealthyMembers: 2, EtcdKnown: true},
			want:   Step{Action: Wait},
			reason: "1 of the 2 etcd members that would remain are healthy"},
		{name: "remediation: not while etcd cannot be listed",
			facts:  Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), marked(sick), ready("cp-2")}},
			want:   Step{Action: Wait, Why: clusterv1.ClusterEtcdMembershipUnknownReason},
			reason: "no etcd member answers"},
		{name: "remediation: never the only machine",
			facts:  Facts{Replicas: 1, Stacked: true, Initialized: true, Machines: []Machine{marked(sick)}, Members: 1, Voters: 1, HealthyMembers: 0, EtcdKnown: true},
			want:   Step{Action: Wait},
			reason: "it is the only one"},
		{name: "remediation: not while a machine is missing (its replacement comes first)",
			facts: Facts{Replicas: 3, Stacked: true, Initialized: true, Machines: []Machine{ready("cp-0"), marked(ready("cp-2"))}, Members: 2, Voters: 2, HealthyMembers: 2, EtcdKnown: true},
			want:  Step{Action: Create}},
		{name: "every machine gone after initialization: nothing to join",
			facts:  Facts{Replicas: 1, Stacked: true, Initialized: true},
			want:   Step{Action: Wait},
			reason: "no running control plane"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Plan(tc.facts)
			reason := got.Reason
			got.Reason = ""
			if got != tc.want {
				t.Fatalf("Plan() = %+v (reason %q), want %+v", got, reason, tc.want)
			}
			if !strings.Contains(reason, tc.reason) {
				t.Fatalf("reason %q does not mention %q", reason, tc.reason)
			}
		})
	}
}

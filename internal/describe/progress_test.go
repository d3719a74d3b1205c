package describe

import (
	"fmt"
	"strings"
	"testing"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

func TestCreationStages(t *testing.T) {
	deploys, sets := fleet(1)
	o := Objects{
		Cluster: cluster(clusterv1.ClusterPhaseProvisioning, 1,
			cond(clusterv1.ClusterCertificatesAvailableCondition, "True", "", ""),
			cond(clusterv1.ClusterControlPlaneInitializedCondition, "True", "", "")),
		Machines: []clusterv1.Machine{
			cpMachine("ha-cp-0", clusterv1.MachinePhaseRunning, true, ready, nodeReady),
			worker("w-a", "ha-workers-7d9f", clusterv1.MachinePhaseRunning, ready, nodeReady),
			worker("w-b", "ha-workers-7d9f", clusterv1.MachinePhasePending),
		},
		MachineDeployments: deploys, MachineSets: sets,
	}
	o.Cluster.Spec.ControlPlaneEndpoint.Host = "127.1.2.3"
	got := fmt.Sprintf("%+v", stagesOf(Creation(o)))
	want := "[{Name:certificates Done:true Count:0 Total:0} {Name:control-plane endpoint Done:true Count:0 Total:0} {Name:first control-plane machine Done:true Count:0 Total:0} " +
		"{Name:control-plane machines ready Done:false Count:1 Total:3} {Name:cluster Ready Done:false Count:0 Total:0} {Name:workers joined Done:false Count:1 Total:2}]"
	if got != want {
		t.Errorf("stages:\n%s\nwant\n%s", got, want)
	}
	if why := Failed(o); why != "" {
		t.Errorf("a cluster being made reads as failed: %s", why)
	}

	o.Machines[2].Status.Phase = clusterv1.MachinePhaseFailed
	o.Machines[2].Status.FailureReason, o.Machines[2].Status.FailureMessage = "InvalidProviderSpec", "spec.memroy"
	if why := Failed(o); !strings.Contains(why, "machine w-b failed: InvalidProviderSpec: spec.memroy") {
		t.Errorf("a failed machine: %q", why)
	}
}

func TestBar(t *testing.T) {
	for _, tc := range []struct {
		count, total int
		want         string
	}{{0, 4, "[....]"}, {1, 4, "[#...]"}, {4, 4, "[####]"}, {5, 4, "[####]"}, {1, 0, ""}} {
		if got := Bar(tc.count, tc.total, 4); got != tc.want {
			t.Errorf("Bar(%d, %d) = %q, want %q", tc.count, tc.total, got, tc.want)
		}
	}
}

// stagesOf drops Stage's String method, to compare every field.
type plainStage struct {
	Name         string
	Done         bool
	Count, Total int
}

func stagesOf(ss []Stage) []plainStage {
	out := make([]plainStage, len(ss))
	for i, s := range ss {
		out[i] = plainStage(s)
	}
	return out
}

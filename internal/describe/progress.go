package describe

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// Stage is one stage of making a cluster, as marina create cluster --wait
// shows it.
type Stage struct {
	Name string
	Done bool
	// Count of Total, for stages that count machines; Total 0 otherwise.
	Count, Total int
}

func (s Stage) String() string {
	if s.Total == 0 {
		return s.Name
	}
	return fmt.Sprintf("%s %d/%d", s.Name, s.Count, s.Total)
}

// Creation is the stages of making o's cluster, in order: its
// certificates, its endpoint, its first control-plane machine, every
// control-plane machine (and etcd member), the cluster Ready (its control
// plane answers), the workers joined.
func Creation(o Objects) []Stage {
	c := o.Cluster
	conds := c.Status.Conditions
	cpReplicas := int(max(c.Spec.ControlPlane.Replicas, 1))
	workers, joined := 0, 0
	for i := range o.MachineDeployments {
		workers += int(replicas(o.MachineDeployments[i].Spec.Replicas))
	}
	for i := range o.Machines {
		m := &o.Machines[i]
		if _, cp := m.Labels[clusterv1.ControlPlaneLabel]; cp || !m.DeletionTimestamp.IsZero() {
			continue
		}
		if len(o.MachineDeployments) == 0 {
			workers++
		}
		if m.Status.Phase == clusterv1.MachinePhaseRunning && meta.IsStatusConditionTrue(m.Status.Conditions, clusterv1.MachineNodeReadyCondition) {
			joined++
		}
	}
	stages := []Stage{
		{Name: "certificates", Done: meta.IsStatusConditionTrue(conds, clusterv1.ClusterCertificatesAvailableCondition)},
		{Name: "control-plane endpoint", Done: c.Spec.ControlPlaneEndpoint.Host != ""},
		{Name: "first control-plane machine", Done: meta.IsStatusConditionTrue(conds, clusterv1.ClusterControlPlaneInitializedCondition)},
		{Name: "control-plane machines ready", Count: int(c.Status.ControlPlane.ReadyReplicas), Total: cpReplicas,
			Done: int(c.Status.ControlPlane.ReadyReplicas) >= cpReplicas},
	}
	stages = append(stages, Stage{Name: "cluster Ready", Done: meta.IsStatusConditionTrue(conds, clusterv1.ReadyCondition)})
	if workers > 0 {
		stages = append(stages, Stage{Name: "workers joined", Count: min(joined, workers), Total: workers, Done: joined >= workers})
	}
	return stages
}

// Failed says why making o cannot succeed without the user's help: a
// machine that failed, or a cluster condition that waits on the user
// (a version not built, a provider that cannot make an endpoint). Empty
// while it may still succeed.
func Failed(o Objects) string {
	for i := range o.Machines {
		m := &o.Machines[i]
		if m.Status.Phase == clusterv1.MachinePhaseFailed {
			return fmt.Sprintf("machine %s failed: %s: %s", m.Name, m.Status.FailureReason, m.Status.FailureMessage)
		}
	}
	for _, c := range o.Cluster.Status.Conditions {
		switch c.Reason {
		case clusterv1.ClusterVersionUnavailableReason, clusterv1.ClusterEndpointUnavailableReason:
			return fmt.Sprintf("cluster %s: %s: %s", o.Cluster.Name, c.Reason, c.Message)
		}
	}
	return ""
}

// Bar draws count of total as a bar of width cells.
func Bar(count, total, width int) string {
	if total <= 0 {
		return ""
	}
	full := min(count*width/total, width)
	return "[" + strings.Repeat("#", full) + strings.Repeat(".", width-full) + "]"
}

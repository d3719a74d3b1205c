package cluster

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// setReady sums the conditions up in Ready and the phase, and reports
// whether the cluster is ready.
func setReady(cluster *clusterv1.Cluster) bool {
	conds := cluster.Status.Conditions
	for _, t := range []string{
		clusterv1.ClusterCertificatesAvailableCondition,
		clusterv1.ClusterControlPlaneInitializedCondition,
		clusterv1.ClusterControlPlaneReadyCondition,
		clusterv1.ClusterEtcdHealthyCondition,
	} {
		c := meta.FindStatusCondition(conds, t)
		if c == nil || c.Status != metav1.ConditionTrue {
			reason, msg := "WaitingFor"+t, "waiting for "+t
			if c != nil {
				reason, msg = c.Reason, t+": "+c.Message
			}
			setCondition(cluster, clusterv1.ReadyCondition, metav1.ConditionFalse, reason, msg)
			if cluster.Status.Phase == clusterv1.ClusterPhaseFailed {
				return false
			}
			cluster.Status.Phase = clusterv1.ClusterPhaseProvisioning
			if meta.IsStatusConditionTrue(conds, clusterv1.ClusterControlPlaneInitializedCondition) {
				cluster.Status.Phase = clusterv1.ClusterPhaseProvisioned
			}
			return false
		}
	}
	setCondition(cluster, clusterv1.ReadyCondition, metav1.ConditionTrue, "Ready", "")
	cluster.Status.Phase = clusterv1.ClusterPhaseProvisioned
	return true
}

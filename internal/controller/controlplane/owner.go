package controlplane

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// Owns: cluster is m's controller (metadata.ownerReferences, controller
// true, the Cluster's UID). The control plane acts only on the machines it
// owns, as upstream's KubeadmControlPlane does: the labels say which
// cluster a machine belongs to, ownership says the control plane made it.
// A machine labelled by hand, by an administrator or through a hole in
// admission, never counts towards quorum, scaling or an upgrade, and gets
// no control-plane bootstrap (the cluster's keys).
//
// Every control-plane machine marina made has carried this reference from
// the first control-plane controller on (create sets it), so machines of
// clusters made before this check need no adoption.
func Owns(cluster *clusterv1.Cluster, m *clusterv1.Machine) bool {
	ref := metav1.GetControllerOf(m)
	if ref == nil {
		return false
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	return err == nil && gv.Group == clusterv1.GroupVersion.Group && ref.Kind == "Cluster" &&
		ref.Name == cluster.Name && ref.UID == cluster.UID
}

// splitOwned separates the machines cluster owns from those it does not.
func splitOwned(cluster *clusterv1.Cluster, machines []clusterv1.Machine) (owned, unowned []clusterv1.Machine) {
	for _, m := range machines {
		if Owns(cluster, &m) {
			owned = append(owned, m)
		} else {
			unowned = append(unowned, m)
		}
	}
	return owned, unowned
}

// reportUnowned sets ControlPlaneMachinesOwned on the cluster: False,
// naming the machines, while any labelled machine is not the cluster's;
// absent otherwise. An event goes out when the set of names changes, not
// every pass.
func (cp *ControlPlane) reportUnowned(cluster *clusterv1.Cluster, unowned []clusterv1.Machine) {
	if len(unowned) == 0 {
		meta.RemoveStatusCondition(&cluster.Status.Conditions, clusterv1.ClusterControlPlaneMachinesOwnedCondition)
		return
	}
	names := make([]string, 0, len(unowned))
	for _, m := range unowned {
		names = append(names, m.Name)
	}
	slices.Sort(names)
	what := "machine " + names[0] + " carries"
	if len(names) > 1 {
		what = "machines " + strings.Join(names, ", ") + " carry"
	}
	msg := fmt.Sprintf("%s the labels %s=%s and %s but the Cluster is not its controller (metadata.ownerReferences): "+
		"the control plane ignores it (no quorum, scaling, upgrade or bootstrap); delete it, or remove the %s label",
		what, clusterv1.ClusterNameLabel, cluster.Name, clusterv1.ControlPlaneLabel, clusterv1.ControlPlaneLabel)
	if c := meta.FindStatusCondition(cluster.Status.Conditions, clusterv1.ClusterControlPlaneMachinesOwnedCondition); c == nil || c.Message != msg {
		cp.event(cluster, corev1.EventTypeWarning, clusterv1.ClusterUnownedControlPlaneMachineReason, "Ignore", msg)
	}
	setCondition(cluster, clusterv1.ClusterControlPlaneMachinesOwnedCondition, metav1.ConditionFalse, clusterv1.ClusterUnownedControlPlaneMachineReason, msg)
}

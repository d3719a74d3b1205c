package machine

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/desiredversions"
	"marina.dev/marina/provider"
)

// Well-known node role label and taint (M9).
const (
	controlPlaneRoleLabel = "node-role.kubernetes.io/control-plane"
	controlPlaneTaintKey  = "node-role.kubernetes.io/control-plane"
)

// nodeMetadata is what the machine's Node must carry: the merged labels and
// taints, plus, on a control-plane machine, the role label and (unless the
// machine is also a worker) the NoSchedule taint.
func nodeMetadata(roles []clusterv1.MachineRole, labels map[string]string, taints []corev1.Taint) (map[string]string, []corev1.Taint) {
	outLabels := make(map[string]string, len(labels)+1)
	for k, v := range labels {
		outLabels[k] = v
	}
	outTaints := append([]corev1.Taint(nil), taints...)
	if hasRole(roles, clusterv1.ControlPlaneRole) {
		outLabels[controlPlaneRoleLabel] = ""
		if !hasRole(roles, clusterv1.WorkerRole) {
			outTaints = upsertTaint(outTaints, corev1.Taint{Key: controlPlaneTaintKey, Effect: corev1.TaintEffectNoSchedule})
		}
	}
	return outLabels, outTaints
}

func hasRole(roles []clusterv1.MachineRole, want clusterv1.MachineRole) bool {
	for _, r := range roles {
		if r == want {
			return true
		}
	}
	return false
}

// upsertTaint adds t, replacing a taint with the same key and effect.
func upsertTaint(taints []corev1.Taint, t corev1.Taint) []corev1.Taint {
	for i := range taints {
		if taints[i].Key == t.Key && taints[i].Effect == t.Effect {
			taints[i] = t
			return taints
		}
	}
	return append(taints, t)
}

// missingMetadata returns the node's labels and taints with the desired ones
// applied, and whether anything changed. Labels and taints the node has
// beyond the desired ones (set by others) are kept.
func missingMetadata(node *corev1.Node, labels map[string]string, taints []corev1.Taint) (map[string]string, []corev1.Taint, bool) {
	changed := false
	outLabels := make(map[string]string, len(node.Labels)+len(labels))
	for k, v := range node.Labels {
		outLabels[k] = v
	}
	for k, v := range labels {
		if have, ok := outLabels[k]; !ok || have != v {
			outLabels[k] = v
			changed = true
		}
	}
	outTaints := append([]corev1.Taint(nil), node.Spec.Taints...)
	for _, t := range taints {
		found := false
		for _, have := range outTaints {
			if have.Key == t.Key && have.Effect == t.Effect && have.Value == t.Value {
				found = true
				break
			}
		}
		if !found {
			outTaints = upsertTaint(outTaints, t)
			changed = true
		}
	}
	return outLabels, outTaints, changed
}

// nodeAnnotations are the annotations that tie a Node to its Machine, as
// cluster-autoscaler's clusterapi provider reads them (docs/autoscaling.md).
func nodeAnnotations(m *clusterv1.Machine) map[string]string {
	return map[string]string{
		clusterv1.NodeMachineAnnotation:          m.Name,
		clusterv1.NodeClusterNameAnnotation:      m.Spec.ClusterName,
		clusterv1.NodeClusterNamespaceAnnotation: m.Namespace,
	}
}

// missingAnnotations returns the node's annotations with the desired ones
// applied, and whether anything changed.
func missingAnnotations(node *corev1.Node, want map[string]string) (map[string]string, bool) {
	out := make(map[string]string, len(node.Annotations)+len(want))
	for k, v := range node.Annotations {
		out[k] = v
	}
	changed := false
	for k, v := range want {
		if have, ok := out[k]; !ok || have != v {
			out[k] = v
			changed = true
		}
	}
	return out, changed
}

// syncNodeMetadata writes the machine's labels and taints (M1), and the
// annotations naming the machine, onto its Node when any is missing.
func syncNodeMetadata(ctx context.Context, c client.Client, node *corev1.Node, m *clusterv1.Machine, labels map[string]string, taints []corev1.Taint) error {
	labels, taints = nodeMetadata(m.Spec.Roles, labels, taints)
	newLabels, newTaints, changed := missingMetadata(node, labels, taints)
	newAnnotations, annotationsChanged := missingAnnotations(node, nodeAnnotations(m))
	if !changed && !annotationsChanged {
		return nil
	}
	patched := node.DeepCopy()
	patched.Labels, patched.Spec.Taints, patched.Annotations = newLabels, newTaints, newAnnotations
	if err := c.Patch(ctx, patched, client.MergeFromWithOptions(node, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("copying labels, taints and annotations onto node %s: %w", node.Name, client.IgnoreNotFound(err))
	}
	return nil
}

// setDesiredVersions writes v in the node's annotation
// cluster.marina.dev/desired-versions, which the machine's agent watches
// (M12), when it says something else. It is written with the workload
// cluster's admin credentials: NodeRestriction lets a node change its own
// Node, never another's.
func setDesiredVersions(ctx context.Context, c client.Client, node *corev1.Node, v provider.Versions) error {
	raw, err := desiredversions.Encode(desiredversions.Versions{Kubelet: v.Kubelet, ControlPlane: v.ControlPlane, Settings: v.Settings})
	if err != nil {
		return err
	}
	if node.Annotations[clusterv1.DesiredVersionsAnnotation] == raw {
		return nil
	}
	patched := node.DeepCopy()
	if patched.Annotations == nil {
		patched.Annotations = map[string]string{}
	}
	patched.Annotations[clusterv1.DesiredVersionsAnnotation] = raw
	if err := c.Patch(ctx, patched, client.MergeFrom(node)); err != nil {
		return fmt.Errorf("writing the desired versions on node %s: %w", node.Name, err)
	}
	return nil
}

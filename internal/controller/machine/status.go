package machine

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// phaseOf derives the one-word phase from the rest of the status, so the
// phase can never disagree with what the conditions and fields say.
func phaseOf(m *clusterv1.Machine) clusterv1.MachinePhase {
	s := &m.Status
	switch {
	case !m.DeletionTimestamp.IsZero():
		return clusterv1.MachinePhaseDeleting
	case s.FailureReason != "":
		return clusterv1.MachinePhaseFailed
	case s.NodeRef != nil:
		return clusterv1.MachinePhaseRunning
	case s.ProviderID != "":
		return clusterv1.MachinePhaseProvisioned
	case conditionReason(m, clusterv1.MachineProvisionedCondition) == clusterv1.MachineProvisioningReason,
		conditionReason(m, clusterv1.MachineProvisionedCondition) == clusterv1.MachineProvisioningFailedReason:
		return clusterv1.MachinePhaseProvisioning
	default:
		return clusterv1.MachinePhasePending
	}
}

func conditionReason(m *clusterv1.Machine, t string) string {
	if c := meta.FindStatusCondition(m.Status.Conditions, t); c != nil {
		return c.Reason
	}
	return ""
}

func setCondition(m *clusterv1.Machine, t string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
		Type:               t,
		Status:             status,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: m.Generation,
	})
}

// fail records a failure only a person (or a replacement machine) can fix.
func fail(m *clusterv1.Machine, reason, message string) {
	m.Status.FailureReason = reason
	m.Status.FailureMessage = message
	setCondition(m, clusterv1.ReadyCondition, metav1.ConditionFalse, reason, message)
}

// clearFixableFailure forgets a failure that came from the machine's own
// configuration, so that a corrected spec is tried again. A vanished machine
// stays failed: it is replaced, never silently re-created.
func clearFixableFailure(m *clusterv1.Machine) {
	switch m.Status.FailureReason {
	case clusterv1.MachineInvalidProviderSpecReason, clusterv1.MachineOverrideNotAllowedReason:
		m.Status.FailureReason, m.Status.FailureMessage = "", ""
	}
}

// setNodeReady mirrors the Node's Ready condition onto the machine.
func setNodeReady(m *clusterv1.Machine, node *corev1.Node) {
	ready := nodeCondition(node, corev1.NodeReady)
	switch {
	case ready == nil:
		setCondition(m, clusterv1.MachineNodeReadyCondition, metav1.ConditionUnknown, clusterv1.MachineNodeNotReadyReason,
			"the Node has not reported a Ready condition yet")
	case ready.Status == corev1.ConditionTrue:
		setCondition(m, clusterv1.MachineNodeReadyCondition, metav1.ConditionTrue, clusterv1.MachineNodeReadyReason, "")
	default:
		msg := "Node " + node.Name + " is not ready"
		if ready.Message != "" {
			msg += ": " + ready.Message
		}
		setCondition(m, clusterv1.MachineNodeReadyCondition, metav1.ConditionStatus(ready.Status), clusterv1.MachineNodeNotReadyReason,
			msg+"; check the machine's agent or kubelet")
	}
	setReady(m)
}

// setReady summarises: a machine is Ready when it runs and its Node is
// ready. A machine that does not run says so first: its Node says only
// NotReady, and not until the workload cluster notices, tens of seconds
// later.
func setReady(m *clusterv1.Machine) {
	if m.Status.FailureReason != "" {
		return
	}
	if c := instanceDown(m); c != nil {
		setCondition(m, clusterv1.ReadyCondition, metav1.ConditionFalse, c.Reason, c.Message)
		return
	}
	if meta.IsStatusConditionTrue(m.Status.Conditions, clusterv1.MachineNodeReadyCondition) {
		setCondition(m, clusterv1.ReadyCondition, metav1.ConditionTrue, clusterv1.MachineNodeReadyReason, "")
		return
	}
	c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineNodeReadyCondition)
	if c == nil {
		c = meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineProvisionedCondition)
	}
	if c == nil {
		return
	}
	setCondition(m, clusterv1.ReadyCondition, metav1.ConditionFalse, c.Reason, c.Message)
}

func nodeCondition(node *corev1.Node, t corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == t {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

package machinehealthcheck

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/health"
	"marina.dev/marina/internal/metrics"
)

// setStatus computes the check's status from the pass, and records an event
// when remediation stops for too many unhealthy machines.
func (r *Reconciler) setStatus(_ context.Context, before *clusterv1.MachineHealthCheck, s *scope) {
	st := &s.mhc.Status
	st.ObservedGeneration = s.mhc.Generation
	if s.decided {
		st.ExpectedMachines = int32(s.plan.Expected)
		st.CurrentHealthy = int32(s.plan.Healthy)
		st.RemediationsAllowed = int32(s.plan.RemediationsAllowed)
		st.RecentRemediations = remediationsStatus(s.records)
	} else if s.machines != nil || s.blocked {
		// The machines are known but not their health: keep the last
		// counts, and allow nothing.
		st.RemediationsAllowed = 0
		if s.machines != nil {
			st.ExpectedMachines = int32(len(s.machines))
		}
	}
	setRemediationAllowedCondition(s)
	setPausedCondition(s)

	was := meta.FindStatusCondition(before.Status.Conditions, clusterv1.RemediationAllowedCondition)
	now := meta.FindStatusCondition(st.Conditions, clusterv1.RemediationAllowedCondition)
	if now.Reason == clusterv1.TooManyUnhealthyReason && (was == nil || was.Reason != clusterv1.TooManyUnhealthyReason) {
		r.recorder.Eventf(s.mhc, nil, corev1.EventTypeWarning, clusterv1.TooManyUnhealthyReason, "Remediate", "%s", now.Message)
		metrics.ShortCircuits.WithLabelValues(s.mhc.Namespace, s.mhc.Name).Inc()
	}
}

// setPausedCondition is True while the check's paused annotation stops it
// (marina move waits for it), and absent otherwise.
func setPausedCondition(s *scope) {
	if !s.blocked || s.reason != clusterv1.PausedReason {
		meta.RemoveStatusCondition(&s.mhc.Status.Conditions, clusterv1.PausedCondition)
		return
	}
	meta.SetStatusCondition(&s.mhc.Status.Conditions, metav1.Condition{
		Type: clusterv1.PausedCondition, Status: metav1.ConditionTrue, Reason: s.reason, Message: s.message, ObservedGeneration: s.mhc.Generation,
	})
}

// setRemediationAllowedCondition says whether the check may remediate now,
// and if not, why.
func setRemediationAllowedCondition(s *scope) {
	set := func(status metav1.ConditionStatus, reason, message string) {
		meta.SetStatusCondition(&s.mhc.Status.Conditions, metav1.Condition{
			Type:               clusterv1.RemediationAllowedCondition,
			Status:             status,
			Reason:             reason,
			Message:            message,
			ObservedGeneration: s.mhc.Generation,
		})
	}
	switch {
	case s.blocked:
		set(metav1.ConditionFalse, s.reason, s.message)
	case s.planErr != nil:
		set(metav1.ConditionFalse, clusterv1.InvalidMaxUnhealthyReason, s.planErr.Error()+": nothing is remediated until spec.maxUnhealthy is fixed")
	case s.plan.Expected == 0:
		set(metav1.ConditionTrue, clusterv1.NoMachinesSelectedReason, fmt.Sprintf(
			"spec.selector %s matches no machine of cluster %s: check it against the machines' labels", metav1.FormatLabelSelector(&s.mhc.Spec.Selector), s.mhc.Spec.ClusterName))
	case !s.plan.Allowed:
		set(metav1.ConditionFalse, clusterv1.TooManyUnhealthyReason, shortCircuitMessage(s)+
			": look for a common cause (network, workload control plane) before raising spec.maxUnhealthy")
	default:
		set(metav1.ConditionTrue, clusterv1.RemediationAllowedReason, fmt.Sprintf(
			"%s, within maxUnhealthy (%d): %d more may be remediated",
			counts(s.plan), s.plan.MaxUnhealthy, s.plan.RemediationsAllowed))
	}
}

func shortCircuitMessage(s *scope) string {
	return fmt.Sprintf("remediation stopped: %s, more than maxUnhealthy (%s, %d machines) allows",
		counts(s.plan), maxUnhealthyString(s.mhc), s.plan.MaxUnhealthy)
}

// counts says what counts against maxUnhealthy: "3 of 10 machines are
// unhealthy", and, when there are any, the machines whose condition has
// begun and the recent remediations, with the total.
func counts(p health.Plan) string {
	msg := fmt.Sprintf("%d of %d machines are unhealthy", p.Unhealthy(), p.Expected)
	if p.Pending == 0 && p.Recent == 0 {
		return msg
	}
	var plus []string
	if p.Pending > 0 {
		plus = append(plus, fmt.Sprintf("%d whose Node condition has begun but not yet lasted its timeout", p.Pending))
	}
	if p.Recent > 0 {
		plus = append(plus, fmt.Sprintf("%d remediated in the last %s (status.recentRemediations)", p.Recent, p.Window))
	}
	return msg + ", plus " + strings.Join(plus, " and ") + fmt.Sprintf(": %d count", p.Counted())
}

func maxUnhealthyString(mhc *clusterv1.MachineHealthCheck) string {
	if mhc.Spec.MaxUnhealthy == nil {
		return "100%"
	}
	return mhc.Spec.MaxUnhealthy.String()
}

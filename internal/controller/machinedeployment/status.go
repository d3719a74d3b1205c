package machinedeployment

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/controller/machineset"
	"marina.dev/marina/internal/rollout"
)

// lastProgress is when the rollout last moved: the new set created, a
// machine of it created or turning Ready, or a set scaled by this pass.
func lastProgress(newSet *clusterv1.MachineSet, machines []*clusterv1.Machine, acted bool, now time.Time) time.Time {
	if acted {
		return now
	}
	var t time.Time
	if newSet != nil {
		t = newSet.CreationTimestamp.Time
	}
	for _, m := range machines {
		if m.CreationTimestamp.After(t) {
			t = m.CreationTimestamp.Time
		}
		if c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.ReadyCondition); c != nil && c.Status == metav1.ConditionTrue && c.LastTransitionTime.After(t) {
			t = c.LastTransitionTime.Time
		}
	}
	return t
}

// setStatus fills the status from what the pass saw and did.
func setStatus(s *scope) {
	md := s.md
	want := ptrOr(md.Spec.Replicas, 1)
	var all []*clusterv1.Machine
	for _, ms := range s.sets {
		all = append(all, s.machines[ms.UID]...)
	}
	c := machineset.Count(all, md.Spec.MinReadySeconds, s.now)
	var updated machineset.Counts
	var newMachines []*clusterv1.Machine
	if s.newSet != nil {
		newMachines = s.machines[s.newSet.UID]
		updated = machineset.Count(newMachines, md.Spec.MinReadySeconds, s.now)
	}
	if sel, err := metav1.LabelSelectorAsSelector(&md.Spec.Selector); err == nil {
		md.Status.Selector = sel.String()
	}
	md.Status.Replicas, md.Status.ReadyReplicas, md.Status.AvailableReplicas = c.Replicas, c.Ready, c.Available
	md.Status.UpdatedReplicas = updated.Replicas - updated.Deleting
	md.Status.ObservedGeneration = md.Generation
	active := c.Replicas - c.Deleting

	set := func(t string, status metav1.ConditionStatus, reason, msg string) {
		machineset.SetCondition(&md.Status.Conditions, md.Generation, t, status, reason, msg)
	}
	in := s.input()
	_, unavailable, _ := rollout.Bounds(want, in.MaxSurge, in.MaxUnavailable)
	if md.Spec.Strategy != nil && md.Spec.Strategy.Type == clusterv1.OnDeleteStrategy {
		unavailable = 0
	}
	if c.Available >= want-unavailable {
		set(clusterv1.AvailableCondition, metav1.ConditionTrue, clusterv1.AvailableReason, "")
	} else {
		set(clusterv1.AvailableCondition, metav1.ConditionFalse, clusterv1.NotEnoughAvailableReason,
			fmt.Sprintf("%d machines available, at least %d wanted (replicas %d, maxUnavailable %d)", c.Available, want-unavailable, want, unavailable))
	}
	if active == c.Ready {
		set(clusterv1.MachinesReadyCondition, metav1.ConditionTrue, clusterv1.MachinesReadyReason, "")
	} else {
		set(clusterv1.MachinesReadyCondition, metav1.ConditionFalse, clusterv1.MachinesNotReadyReason,
			fmt.Sprintf("%d of %d machines are not Ready: see their Ready conditions (kubectl get machines -l %s)", active-c.Ready, active, md.Status.Selector))
	}
	if active < want {
		set(clusterv1.ScalingUpCondition, metav1.ConditionTrue, clusterv1.ScalingReason, fmt.Sprintf("%d machines, %d wanted", active, want))
	} else {
		set(clusterv1.ScalingUpCondition, metav1.ConditionFalse, clusterv1.NotScalingReason, "")
	}
	if active > want || c.Deleting > 0 {
		set(clusterv1.ScalingDownCondition, metav1.ConditionTrue, clusterv1.ScalingReason,
			fmt.Sprintf("%d machines, %d wanted; %d being deleted", active, want, c.Deleting))
	} else {
		set(clusterv1.ScalingDownCondition, metav1.ConditionFalse, clusterv1.NotScalingReason, "")
	}
	switch s.blockedReason {
	case clusterv1.PausedReason, clusterv1.ClusterPausedReason:
		set(clusterv1.PausedCondition, metav1.ConditionTrue, s.blockedReason, s.blockedMessage)
	default:
		set(clusterv1.PausedCondition, metav1.ConditionFalse, clusterv1.NotPausedReason, "")
	}
	machineset.SetNodeGroupSizeCondition(&md.Status.Conditions, md.Generation, md.Annotations)

	// Rolling out: machines of older templates remain, or the current
	// template's set has not been given every replica yet.
	rolling := in.New == nil || in.New.Replicas != want || in.New.Actual != want
	for _, o := range in.Old {
		rolling = rolling || o.Replicas > 0 || o.Actual > 0
	}
	// Like a Deployment's, a completed rollout stays complete until the next
	// one, whatever happens to single machines later.
	complete := !rolling && (updated.Available >= want ||
		meta.IsStatusConditionPresentAndEqual(md.Status.Conditions, clusterv1.ProgressingCondition, metav1.ConditionTrue) &&
			meta.FindStatusCondition(md.Status.Conditions, clusterv1.ProgressingCondition).Reason == clusterv1.NewMachineSetAvailableReason)
	if rolling {
		set(clusterv1.RollingOutCondition, metav1.ConditionTrue, clusterv1.RollingOutReason,
			fmt.Sprintf("%d of %d machines are built from the current template (revision %s) and available", updated.Available, want, md.Annotations[clusterv1.RevisionAnnotation]))
	} else {
		set(clusterv1.RollingOutCondition, metav1.ConditionFalse, clusterv1.RolloutCompleteReason, "")
	}
	deadline := time.Duration(ptrOr(md.Spec.ProgressDeadlineSeconds, 600)) * time.Second
	stalled := false
	switch {
	case s.rollbackProblem != "":
		set(clusterv1.ProgressingCondition, metav1.ConditionFalse, clusterv1.RollbackFailedReason, s.rollbackProblem)
	case s.blockedReason != "":
		// Not scaling on purpose: the Ready condition says why.
	case complete:
		set(clusterv1.ProgressingCondition, metav1.ConditionTrue, clusterv1.NewMachineSetAvailableReason, "")
	default:
		since := s.now.Sub(lastProgress(s.newSet, newMachines, s.acted, s.now))
		if since > deadline {
			stalled = true
			set(clusterv1.ProgressingCondition, metav1.ConditionFalse, clusterv1.ProgressDeadlineExceededReason, fmt.Sprintf(
				"no progress for %s (spec.progressDeadlineSeconds %d): %d of %d new machines available; check their Ready conditions, then fix the template or roll back (annotate %s=0)",
				since.Truncate(time.Second), int(deadline.Seconds()), updated.Available, want, clusterv1.RollbackToRevisionAnnotation))
		} else {
			set(clusterv1.ProgressingCondition, metav1.ConditionTrue, clusterv1.MachineSetUpdatedReason,
				fmt.Sprintf("rolling to revision %s: %d of %d new machines available", md.Annotations[clusterv1.RevisionAnnotation], updated.Available, want))
			s.requeueIn(deadline - since + time.Second)
		}
	}

	switch {
	case s.blockedReason != "":
		set(clusterv1.ReadyCondition, metav1.ConditionFalse, s.blockedReason, s.blockedMessage)
	case stalled:
		c := meta.FindStatusCondition(md.Status.Conditions, clusterv1.ProgressingCondition)
		set(clusterv1.ReadyCondition, metav1.ConditionFalse, c.Reason, c.Message)
	case rolling:
		set(clusterv1.ReadyCondition, metav1.ConditionFalse, clusterv1.RollingOutReason,
			fmt.Sprintf("rolling out: %d of %d machines updated and available", updated.Available, want))
	case active != want || c.Deleting > 0:
		set(clusterv1.ReadyCondition, metav1.ConditionFalse, clusterv1.ScalingReason, fmt.Sprintf("%d machines (%d being deleted), %d wanted", c.Replicas, c.Deleting, want))
	case c.Ready != want:
		set(clusterv1.ReadyCondition, metav1.ConditionFalse, clusterv1.MachinesNotReadyReason, fmt.Sprintf("%d of %d machines are Ready", c.Ready, want))
	default:
		set(clusterv1.ReadyCondition, metav1.ConditionTrue, clusterv1.MachinesReadyReason, "")
	}
}

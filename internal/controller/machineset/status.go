package machineset

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/autoscaling"
)

// Counts are the replica counts of a group of machines.
type Counts struct {
	// Replicas counts every machine, those being deleted included.
	Replicas int32
	// Deleting counts the machines being deleted.
	Deleting int32
	// Ready counts machines not being deleted whose Ready condition is True.
	Ready int32
	// Available counts Ready machines that have been Ready for at least
	// minReadySeconds.
	Available int32
	// NextAvailable is how long until the next Ready machine becomes
	// available; 0 when none waits.
	NextAvailable time.Duration
	// Marked counts machines not being deleted that carry the
	// delete-machine annotation.
	Marked int32
}

// Count counts machines as a set's or deployment's status reports them.
func Count(machines []*clusterv1.Machine, minReadySeconds int32, now time.Time) Counts {
	var c Counts
	for _, m := range machines {
		c.Replicas++
		if !m.DeletionTimestamp.IsZero() {
			c.Deleting++
			continue
		}
		if _, ok := m.Annotations[clusterv1.DeleteMachineAnnotation]; ok {
			c.Marked++
		}
		ready, wait := availability(m, minReadySeconds, now)
		if !ready {
			continue
		}
		c.Ready++
		if wait <= 0 {
			c.Available++
		} else if c.NextAvailable == 0 || wait < c.NextAvailable {
			c.NextAvailable = wait
		}
	}
	return c
}

// availability is the one definition of an available machine, shared by
// the counts the rollout planner is given and the order in which a set
// deletes (a planner that counts a machine as unavailable must see the set
// delete it before available ones): ready when its Ready condition is
// True, and available once it has been for minReadySeconds, that is when
// wait is not positive. Being deleted is the caller's to check.
func availability(m *clusterv1.Machine, minReadySeconds int32, now time.Time) (ready bool, wait time.Duration) {
	c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.ReadyCondition)
	if c == nil || c.Status != metav1.ConditionTrue {
		return false, 0
	}
	return true, c.LastTransitionTime.Add(time.Duration(minReadySeconds) * time.Second).Sub(now)
}

// setStatus fills the status from what the pass saw and did.
func setStatus(s *scope) {
	ms := s.ms
	want := ptrOr(ms.Spec.Replicas, 1)
	c := Count(s.machines, ms.Spec.MinReadySeconds, s.now)
	if sel, err := metav1.LabelSelectorAsSelector(&ms.Spec.Selector); err == nil {
		ms.Status.Selector = sel.String()
	}
	ms.Status.Replicas, ms.Status.ReadyReplicas, ms.Status.AvailableReplicas = c.Replicas, c.Ready, c.Available
	ms.Status.ObservedGeneration = ms.Generation
	if c.NextAvailable > 0 {
		// Requeue a little after, so the machine is available by then.
		s.requeueIn(c.NextAvailable + 100*time.Millisecond)
	}
	active := c.Replicas - c.Deleting

	set := func(t string, status metav1.ConditionStatus, reason, msg string) {
		SetCondition(&ms.Status.Conditions, ms.Generation, t, status, reason, msg)
	}
	if active == c.Ready {
		set(clusterv1.MachinesReadyCondition, metav1.ConditionTrue, clusterv1.MachinesReadyReason, "")
	} else {
		set(clusterv1.MachinesReadyCondition, metav1.ConditionFalse, clusterv1.MachinesNotReadyReason,
			fmt.Sprintf("%d of %d machines are not Ready: see their Ready conditions (kubectl get machines -l %s)", active-c.Ready, active, ms.Status.Selector))
	}
	if c.Replicas < want {
		set(clusterv1.ScalingUpCondition, metav1.ConditionTrue, clusterv1.ScalingReason, fmt.Sprintf("creating %d machines", want-c.Replicas))
	} else {
		set(clusterv1.ScalingUpCondition, metav1.ConditionFalse, clusterv1.NotScalingReason, "")
	}
	if active > want || c.Deleting > 0 {
		set(clusterv1.ScalingDownCondition, metav1.ConditionTrue, clusterv1.ScalingReason,
			fmt.Sprintf("removing %d machines, %d of them draining or being deleted", max(active-want, 0)+c.Deleting, c.Deleting))
	} else {
		set(clusterv1.ScalingDownCondition, metav1.ConditionFalse, clusterv1.NotScalingReason, "")
	}
	switch s.blockedReason {
	case clusterv1.PausedReason, clusterv1.ClusterPausedReason:
		set(clusterv1.PausedCondition, metav1.ConditionTrue, s.blockedReason, s.blockedMessage)
	default:
		set(clusterv1.PausedCondition, metav1.ConditionFalse, clusterv1.NotPausedReason, "")
	}
	SetNodeGroupSizeCondition(&ms.Status.Conditions, ms.Generation, ms.Annotations)
	if len(s.overlaps) == 0 {
		set(clusterv1.SelectorExclusiveCondition, metav1.ConditionTrue, clusterv1.SelectorExclusiveReason, "")
	} else {
		slices.Sort(s.overlaps)
		set(clusterv1.SelectorExclusiveCondition, metav1.ConditionFalse, clusterv1.SelectorOverlapReason, fmt.Sprintf(
			"spec.selector %q also matches machines of MachineSet(s) %s; they stay with their owner, but give each set its own labels",
			ms.Status.Selector, strings.Join(s.overlaps, ", ")))
	}

	frozen, isFrozen := ms.Annotations[clusterv1.FrozenAnnotation]
	if isFrozen {
		set(clusterv1.FrozenCondition, metav1.ConditionTrue, clusterv1.TooManyMachinesReason, frozen)
	} else {
		meta.RemoveStatusCondition(&ms.Status.Conditions, clusterv1.FrozenCondition)
	}

	switch {
	case s.blockedReason != "":
		set(clusterv1.ReadyCondition, metav1.ConditionFalse, s.blockedReason, s.blockedMessage)
	case isFrozen:
		set(clusterv1.ReadyCondition, metav1.ConditionFalse, clusterv1.TooManyMachinesReason, frozen)
	case s.createErr != nil:
		set(clusterv1.ReadyCondition, metav1.ConditionFalse, clusterv1.MachineCreationFailedReason,
			fmt.Sprintf("creating a machine failed (retrying): %v", s.createErr))
	case c.Replicas != want || active != want:
		set(clusterv1.ReadyCondition, metav1.ConditionFalse, clusterv1.ScalingReason,
			fmt.Sprintf("%d machines (%d being deleted), %d wanted", c.Replicas, c.Deleting, want))
	case c.Ready != want:
		set(clusterv1.ReadyCondition, metav1.ConditionFalse, clusterv1.MachinesNotReadyReason,
			fmt.Sprintf("%d of %d machines are Ready", c.Ready, want))
	default:
		set(clusterv1.ReadyCondition, metav1.ConditionTrue, clusterv1.MachinesReadyReason, "")
	}
}

// SetCondition sets a condition observed at generation.
func SetCondition(conds *[]metav1.Condition, generation int64, t string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(conds, metav1.Condition{
		Type: t, Status: status, Reason: reason, Message: msg, ObservedGeneration: generation,
	})
}

// SetNodeGroupSizeCondition reports whether the autoscaler min/max
// annotations are usable; without them there is no condition. It only
// reports: replicas are never changed because of a bad annotation.
func SetNodeGroupSizeCondition(conds *[]metav1.Condition, generation int64, annotations map[string]string) {
	minSize, maxSize, present, err := autoscaling.NodeGroupSize(annotations)
	switch {
	case !present:
		meta.RemoveStatusCondition(conds, clusterv1.NodeGroupSizeValidCondition)
	case err != nil:
		SetCondition(conds, generation, clusterv1.NodeGroupSizeValidCondition, metav1.ConditionFalse, clusterv1.InvalidNodeGroupSizeReason,
			err.Error()+"; until then cluster-autoscaler ignores or refuses this node group")
	default:
		SetCondition(conds, generation, clusterv1.NodeGroupSizeValidCondition, metav1.ConditionTrue, clusterv1.NodeGroupSizeValidReason,
			fmt.Sprintf("cluster-autoscaler may scale between %d and %d replicas", minSize, maxSize))
	}
}

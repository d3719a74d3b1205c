package machineset

import (
	"crypto/sha256"
	"encoding/binary"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// Deletion priorities, most urgent first.
const (
	priorityAnnotated    = iota // cluster.marina.dev/delete-machine
	priorityFailed              // failed, or found unhealthy by a health check
	priorityNotReady            // no Node yet, or its Node is not Ready
	priorityNotAvailable        // Ready for less than minReadySeconds
	priorityAvailable
)

func deletePriority(m *clusterv1.Machine, minReadySeconds int32, now time.Time) int {
	if _, ok := m.Annotations[clusterv1.DeleteMachineAnnotation]; ok {
		return priorityAnnotated
	}
	if m.Status.FailureReason != "" || m.Status.Phase == clusterv1.MachinePhaseFailed ||
		meta.IsStatusConditionFalse(m.Status.Conditions, clusterv1.MachineHealthCheckSucceededCondition) {
		return priorityFailed
	}
	ready, wait := availability(m, minReadySeconds, now)
	switch {
	case m.Status.NodeRef == nil || !ready:
		return priorityNotReady
	case wait > 0:
		return priorityNotAvailable
	}
	return priorityAvailable
}

// DeletionOrder returns the first n of machines (none of them already being
// deleted) to delete: those annotated with cluster.marina.dev/delete-machine,
// then failed or unhealthy ones, then those not Ready, then those Ready for
// less than minReadySeconds at now (not available yet, as Count and so the
// rollout planner count them: a rollout that removes an unavailable old
// machine must not lose an available one instead), then the rest by
// policy: Newest (most recently created first), Oldest, or Random. Random is
// a fixed shuffle keyed by each machine's UID, so two passes over the same
// machines pick the same ones: a pass that repeats after a crash or a stale
// read deletes nothing more. Ties go by name. machines is not modified.
func DeletionOrder(machines []*clusterv1.Machine, policy clusterv1.MachineDeletePolicy, n int, minReadySeconds int32, now time.Time) []*clusterv1.Machine {
	sorted := append([]*clusterv1.Machine(nil), machines...)
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if pa, pb := deletePriority(a, minReadySeconds, now), deletePriority(b, minReadySeconds, now); pa != pb {
			return pa < pb
		}
		switch policy {
		case clusterv1.NewestDeletePolicy:
			if ta, tb := a.CreationTimestamp.Time, b.CreationTimestamp.Time; !ta.Equal(tb) {
				return ta.After(tb)
			}
		case clusterv1.OldestDeletePolicy:
			if ta, tb := a.CreationTimestamp.Time, b.CreationTimestamp.Time; !ta.Equal(tb) {
				return ta.Before(tb)
			}
		default:
			if ha, hb := shuffleKey(a), shuffleKey(b); ha != hb {
				return ha < hb
			}
		}
		return a.Name < b.Name
	})
	return sorted[:min(max(n, 0), len(sorted))]
}

func shuffleKey(m *clusterv1.Machine) uint64 {
	// A cryptographic hash mixes well even for UIDs that differ in one byte.
	sum := sha256.Sum256([]byte(m.UID))
	return binary.BigEndian.Uint64(sum[:8])
}

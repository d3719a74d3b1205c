package safety

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// A Set is what the freeze looks at for one MachineSet.
type Set struct {
	UID types.UID
	// Machines are the set's machines not being deleted: those it
	// controls, and those its selector matches.
	Machines int
	// Bound is the most it may have: replicas, plus the maxSurge of its
	// MachineDeployment during a rollout.
	Bound int
	// Frozen says the set carries the freeze now.
	Frozen bool
}

// Overshoots decides which sets to freeze and which to thaw. A set is
// frozen once it has had more machines than its bound for grace (a set
// lowering its replicas deletes the extra machines at once, so only a
// runaway stays above), and thawed as soon as it is back in bounds. seen
// holds when each set was first seen above; next is what to keep for the
// next look.
func Overshoots(sets []Set, seen map[types.UID]time.Time, now time.Time, grace time.Duration) (freeze, thaw []types.UID, next map[types.UID]time.Time) {
	next = map[types.UID]time.Time{}
	for _, s := range sets {
		over := s.Machines > s.Bound
		switch {
		case !over && s.Frozen:
			thaw = append(thaw, s.UID)
		case !over, s.Frozen:
		default:
			first, ok := seen[s.UID]
			if !ok {
				first = now
			}
			if now.Sub(first) >= grace {
				freeze = append(freeze, s.UID)
				continue
			}
			next[s.UID] = first
		}
	}
	return freeze, thaw, next
}

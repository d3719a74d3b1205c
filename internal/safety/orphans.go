// Package safety decides what the safety controller removes: provider
// machines that no Machine object owns any more (a finalizer stripped by
// hand, a Machine deleted while marina was down and its record lost). It
// is pure: the controller lists, this decides, the controller acts.
package safety

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Orphans returns the provider machines (made) that no Machine (known)
// owns and that have been seen without one for at least grace, oldest
// sighting first, and the sightings to keep for the next look. A machine
// seen with a Machine again is forgotten; a restart forgets every
// sighting, which only delays a removal.
func Orphans(made []types.UID, known map[types.UID]bool, seen map[types.UID]time.Time, now time.Time, grace time.Duration) (remove []types.UID, next map[types.UID]time.Time) {
	next = map[types.UID]time.Time{}
	for _, uid := range made {
		if known[uid] {
			continue
		}
		first, ok := seen[uid]
		if !ok {
			first = now
		}
		if now.Sub(first) >= grace {
			remove = append(remove, uid)
			continue
		}
		next[uid] = first
	}
	return remove, next
}

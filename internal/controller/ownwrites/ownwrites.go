// Package ownwrites remembers the resource version of a controller's last
// write to each object, so that a pass does not act on a cached copy older
// than that write.
//
// An informer's cache lags the API server by the time a watch event takes.
// A controller whose pass writes a Machine is often queued again at once
// (its Node changed, its own spec patch's event), and a pass over the
// stale copy redoes what the last one did: it recomputes the same status
// from the older one, and a merge patch from that base writes it again,
// with new lastTransitionTimes for conditions the stale copy lacked. In a
// fleet benchmark of 101 machines, 196 of 968 machine writes changed
// nothing (issue 37). A pass that finds its copy older than its own last
// write is skipped: the watch event of that write comes after the cache
// has it, and queues the object again.
package ownwrites

import (
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Tracker is safe for concurrent use; the zero value is ready.
type Tracker struct {
	mu      sync.Mutex
	written map[types.UID]uint64
}

// Wrote records obj's resource version, as the write that returned it
// left it.
func (t *Tracker) Wrote(obj client.Object) {
	rv, ok := version(obj)
	if !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.written == nil {
		t.written = map[types.UID]uint64{}
	}
	if rv > t.written[obj.GetUID()] {
		t.written[obj.GetUID()] = rv
	}
}

// Stale reports whether obj, as read from a cache, is older than the last
// write recorded for it. Once a copy is as new, the record is dropped.
// Resource versions that are not integers (an API server not backed by
// etcd) are never stale: the check is an optimisation, never a gate.
func (t *Tracker) Stale(obj client.Object) bool {
	rv, ok := version(obj)
	if !ok {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	want, recorded := t.written[obj.GetUID()]
	if !recorded {
		return false
	}
	if rv < want {
		return true
	}
	delete(t.written, obj.GetUID())
	return false
}

// Forget drops what was recorded for uid (the object is gone).
func (t *Tracker) Forget(uid types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.written, uid)
}

func version(obj client.Object) (uint64, bool) {
	rv, err := strconv.ParseUint(obj.GetResourceVersion(), 10, 64)
	return rv, err == nil && obj.GetUID() != ""
}

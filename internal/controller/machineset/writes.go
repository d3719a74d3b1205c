package machineset

import (
	"strconv"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// writes remembers, per set, the machine writes this process made that its
// informer cache may not show yet: a set's pass trusts the cache only once
// it shows all of them (see doc.go, Crash safety). A set this process has
// not read from the API server yet is not trusted at all: after a restart
// nothing is remembered, so the first pass of every set reads live.
type writes struct {
	mu sync.Mutex
	// sets holds, for each set read live at least once, the machines
	// written since by name: the resourceVersion the write returned, or ""
	// for a deletion.
	sets map[types.UID]map[string]string
}

// read records what a live read of the set's cluster's machines showed:
// the cache is trusted again only once it shows at least as much. Each
// live machine must be cached at its live resourceVersion or later (after
// a restart or a failover the cache may still miss what the last process
// made); a deletion of ours must be cached as deleting or the machine be
// gone live. A pending write whose machine is not live any more is
// dropped, as the cache would never show it. Pending writes are not
// forgotten otherwise: a pass after this one reads the cache again, which
// may still lag (forgetting them made a set of 60 reach 85 in a test).
func (w *writes) read(set types.UID, live []clusterv1.Machine) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sets == nil {
		w.sets = map[types.UID]map[string]string{}
	}
	pending, ok := w.sets[set]
	if !ok {
		pending = map[string]string{}
		w.sets[set] = pending
	}
	exists := make(map[string]bool, len(live))
	for i := range live {
		exists[live[i].Name] = true
	}
	for name := range pending {
		if !exists[name] {
			delete(pending, name)
		}
	}
	for i := range live {
		m := &live[i]
		if rv, ok := pending[m.Name]; ok && rv == "" && m.DeletionTimestamp.IsZero() {
			continue // deleted since the list was served: keep waiting
		}
		pending[m.Name] = m.ResourceVersion
	}
}

// wrote records a write of machine name about set: rv is what the write
// returned, "" for a deletion.
func (w *writes) wrote(set types.UID, name, rv string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if pending, ok := w.sets[set]; ok {
		pending[name] = rv
	}
}

// unsure records that a write about set may have been made though it
// failed (a create that timed out after the API server committed it): the
// set is read live on its next pass, as after a restart, for its cache may
// never have heard of a machine this process does not know it made.
func (w *writes) unsure(set types.UID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.sets, set)
}

// ambiguous reports whether a failed write may have been committed all the
// same: only the API server's own refusals (invalid, forbidden, conflict,
// already exists, throttled ...) say it was not; a timeout, a lost
// connection or an internal error leave it open.
func ambiguous(err error) bool {
	switch {
	case apierrors.IsInvalid(err), apierrors.IsAlreadyExists(err), apierrors.IsForbidden(err),
		apierrors.IsBadRequest(err), apierrors.IsNotFound(err), apierrors.IsConflict(err),
		apierrors.IsUnauthorized(err), apierrors.IsTooManyRequests(err),
		apierrors.IsRequestEntityTooLargeError(err), apierrors.IsMethodNotSupported(err):
		return false
	}
	return true
}

// forget drops a set that is gone.
func (w *writes) forget(set types.UID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.sets, set)
}

// caughtUp reports whether cached, the set's cluster's machines as the
// cache has them, shows every write recorded about the set; the writes it
// shows are forgotten.
func (w *writes) caughtUp(set types.UID, cached []clusterv1.Machine) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	pending, known := w.sets[set]
	if !known {
		return false
	}
	if len(pending) == 0 {
		return true
	}
	byName := make(map[string]*clusterv1.Machine, len(cached))
	for i := range cached {
		byName[cached[i].Name] = &cached[i]
	}
	for name, rv := range pending {
		if shows(byName[name], rv) {
			delete(pending, name)
		}
	}
	return len(pending) == 0
}

// shows reports whether m, a machine as cached (nil: not cached), reflects
// a write that returned rv ("" for a deletion). A deletion is shown by a
// cached machine being deleted: one never cached may be a machine the cache
// has not seen yet, still draining and still counting against replicas
// (read drops the entry once it is gone live). Resource versions are
// compared as numbers, which etcd's are; one that is not never counts as
// caught up, and the pass reads live instead.
func shows(m *clusterv1.Machine, rv string) bool {
	if rv == "" {
		return m != nil && !m.DeletionTimestamp.IsZero()
	}
	if m == nil {
		return false
	}
	if m.ResourceVersion == rv {
		return true
	}
	have, err1 := strconv.ParseUint(m.ResourceVersion, 10, 64)
	want, err2 := strconv.ParseUint(rv, 10, 64)
	return err1 == nil && err2 == nil && have >= want
}

package machineset

import (
	"strconv"
	"sync"

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

// read records that the set's machines were just read from the API
// server, live. The writes still pending stay so until the cache shows
// them: a pass after this one reads the cache again, which may still lag
// (forgetting them here made a lagging cache read as complete, and a set
// made 25 machines too many in a test). A creation whose machine is not
// live any more is dropped, as the cache will never show it.
func (w *writes) read(set types.UID, live []clusterv1.Machine) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sets == nil {
		w.sets = map[types.UID]map[string]string{}
	}
	pending, ok := w.sets[set]
	if !ok {
		w.sets[set] = map[string]string{}
		return
	}
	exists := make(map[string]bool, len(live))
	for i := range live {
		exists[live[i].Name] = true
	}
	for name, rv := range pending {
		if rv != "" && !exists[name] {
			delete(pending, name)
		}
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
// a write that returned rv ("" for a deletion). Resource versions are
// compared as numbers, which etcd's are; one that is not never counts as
// caught up, and the pass reads live instead.
func shows(m *clusterv1.Machine, rv string) bool {
	if rv == "" {
		return m == nil || !m.DeletionTimestamp.IsZero()
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

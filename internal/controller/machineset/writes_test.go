package machineset

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// The cache is trusted for a set only when it shows every machine write
// this process made about the set since it last read the set live.
func TestWritesCaughtUp(t *testing.T) {
	const set = types.UID("set")
	cases := []struct {
		name   string
		read   bool // the set was read live before the writes
		writes map[string]string
		cache  []clusterv1.Machine
		want   bool
	}{
		{name: "never read live in this process", read: false, want: false},
		{name: "read live, nothing written since", read: true, want: true},
		{name: "a creation the cache shows", read: true, writes: map[string]string{"a": "10"}, cache: []clusterv1.Machine{testMachine("a", "10", false)}, want: true},
		{name: "a creation the cache does not show yet", read: true, writes: map[string]string{"a": "10"}, want: false},
		{name: "a later write than ours is shown", read: true, writes: map[string]string{"a": "10"}, cache: []clusterv1.Machine{testMachine("a", "12", false)}, want: true},
		{name: "an older version than our write", read: true, writes: map[string]string{"a": "10"}, cache: []clusterv1.Machine{testMachine("a", "9", false)}, want: false},
		{name: "a resource version that is no number", read: true, writes: map[string]string{"a": "x"}, cache: []clusterv1.Machine{testMachine("a", "y", false)}, want: false},
		{name: "a deletion the cache shows as deleting", read: true, writes: map[string]string{"a": ""}, cache: []clusterv1.Machine{testMachine("a", "10", true)}, want: true},
		{name: "a deletion of a machine the cache never held: it may not have seen it yet", read: true, writes: map[string]string{"a": ""}, want: false},
		{name: "a deletion the cache does not show yet", read: true, writes: map[string]string{"a": ""}, cache: []clusterv1.Machine{testMachine("a", "10", false)}, want: false},
		{name: "one of two writes shown", read: true, writes: map[string]string{"a": "10", "b": "11"}, cache: []clusterv1.Machine{testMachine("a", "10", false)}, want: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var w writes
			if tc.read {
				w.read(set, nil)
			}
			for name, rv := range tc.writes {
				w.wrote(set, name, rv)
			}
			if got := w.caughtUp(set, tc.cache); got != tc.want {
				t.Errorf("caughtUp = %v, want %v", got, tc.want)
			}
		})
	}
}

// A write shown once is forgotten: the cache stays trusted after it.
func TestWritesShownAreForgotten(t *testing.T) {
	const set = types.UID("set")
	var w writes
	w.read(set, nil)
	w.wrote(set, "a", "10")
	a := clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "a", ResourceVersion: "10"}}
	if !w.caughtUp(set, []clusterv1.Machine{a}) {
		t.Fatal("the cache shows the creation, but is not trusted")
	}
	// The machine was deleted by someone else since: nothing of ours is
	// pending, so the cache is still trusted.
	if !w.caughtUp(set, nil) {
		t.Error("a write already shown was remembered")
	}
	w.forget(set)
	if w.caughtUp(set, nil) {
		t.Error("a forgotten set is trusted")
	}
}

// A live read keeps the writes the cache has not shown: the next pass
// reads the cache again, which may still lag. It also asks the cache for
// what the live read showed (after a restart, what the last process made),
// and drops the writes whose machine is gone.
func TestLiveReadKeepsWritesTheCacheHasNotShown(t *testing.T) {
	const set = types.UID("set")
	var w writes
	w.read(set, []clusterv1.Machine{testMachine("x", "7", false)}) // a restart: x was made before
	if w.caughtUp(set, nil) {
		t.Error("after a restart, a cache missing what the live read showed is trusted")
	}
	if !w.caughtUp(set, []clusterv1.Machine{testMachine("x", "7", false)}) {
		t.Error("a cache showing what the live read showed is not trusted")
	}
	w.wrote(set, "a", "10")
	w.wrote(set, "b", "11")
	w.wrote(set, "c", "")
	// b is gone; c's deletion was not served yet.
	w.read(set, []clusterv1.Machine{testMachine("a", "10", false), testMachine("c", "5", false), testMachine("x", "7", false)})
	if w.caughtUp(set, []clusterv1.Machine{testMachine("c", "5", false), testMachine("x", "7", false)}) {
		t.Error("a cache showing none of a's creation is trusted")
	}
	if w.caughtUp(set, []clusterv1.Machine{testMachine("a", "10", false), testMachine("c", "5", false), testMachine("x", "7", false)}) {
		t.Error("a cache showing c not being deleted is trusted")
	}
	if !w.caughtUp(set, []clusterv1.Machine{testMachine("a", "10", false), testMachine("c", "6", true), testMachine("x", "7", false)}) {
		t.Error("a cache showing a, and c being deleted, is not trusted: b's creation was not dropped")
	}
}

// testMachine is a Machine as a cache or a live list holds it.
func testMachine(name, rv string, deleting bool) clusterv1.Machine {
	m := clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv}}
	if deleting {
		m.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	}
	return m
}

// A write that may have been made though it failed makes the set read live
// next, as after a restart; a write the API server refused does not.
func TestAmbiguousWriteMakesTheSetReadLive(t *testing.T) {
	const set = types.UID("set")
	var w writes
	w.read(set, nil)
	if !w.caughtUp(set, nil) {
		t.Fatal("a set read live with nothing written since is not trusted")
	}
	refused := apierrors.NewInvalid(clusterv1.GroupVersion.WithKind("Machine").GroupKind(), "m", nil)
	if ambiguous(refused) {
		t.Errorf("an invalid machine counts as perhaps created")
	}
	timeout := fmt.Errorf("creating a machine: %w", apierrors.NewTimeoutError("request did not complete within 60s", 0))
	if !ambiguous(timeout) || !ambiguous(context.DeadlineExceeded) {
		t.Errorf("a timeout does not count as perhaps created")
	}
	w.unsure(set)
	if w.caughtUp(set, nil) {
		t.Error("after a create that may have been committed, the cache is trusted")
	}
}

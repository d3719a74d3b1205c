package ownwrites

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func obj(uid, rv string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), ResourceVersion: rv}}
}

func TestStale(t *testing.T) {
	for _, tc := range []struct {
		name  string
		wrote []*corev1.ConfigMap
		read  *corev1.ConfigMap
		want  bool
	}{
		{name: "nothing written", read: obj("a", "5")},
		{name: "older than the write", wrote: []*corev1.ConfigMap{obj("a", "7")}, read: obj("a", "5"), want: true},
		{name: "the write itself", wrote: []*corev1.ConfigMap{obj("a", "7")}, read: obj("a", "7")},
		{name: "newer than the write (another writer)", wrote: []*corev1.ConfigMap{obj("a", "7")}, read: obj("a", "9")},
		{name: "another object's write", wrote: []*corev1.ConfigMap{obj("b", "7")}, read: obj("a", "5")},
		{name: "the latest of two writes counts", wrote: []*corev1.ConfigMap{obj("a", "9"), obj("a", "7")}, read: obj("a", "8"), want: true},
		{name: "a version that is not a number is never stale", wrote: []*corev1.ConfigMap{obj("a", "7")}, read: obj("a", "x")},
		{name: "a write whose version is not a number is not recorded", wrote: []*corev1.ConfigMap{obj("a", "x")}, read: obj("a", "1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tr Tracker
			for _, w := range tc.wrote {
				tr.Wrote(w)
			}
			if got := tr.Stale(tc.read); got != tc.want {
				t.Errorf("Stale = %v, want %v", got, tc.want)
			}
		})
	}
}

// A copy as new as the write ends the record: a later, older copy (a
// cache does not go back) is not held against it.
func TestCaughtUpForgets(t *testing.T) {
	var tr Tracker
	tr.Wrote(obj("a", "7"))
	if tr.Stale(obj("a", "7")) {
		t.Fatal("the write itself is stale")
	}
	if tr.Stale(obj("a", "5")) {
		t.Error("the record outlived a copy that caught up")
	}
	tr.Wrote(obj("a", "9"))
	tr.Forget("a")
	if tr.Stale(obj("a", "8")) {
		t.Error("Forget left the record")
	}
}

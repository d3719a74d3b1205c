package machineset

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// Count honours minReadySeconds: a machine Ready for less is ready but not
// yet available, and NextAvailable says when it will be; machines being
// deleted count as replicas only.
func TestCountHonoursMinReadySeconds(t *testing.T) {
	now := epoch.Add(time.Hour)
	readySince := func(name string, ago time.Duration) *clusterv1.Machine {
		m := mach(name, 0, "notready")
		m.Status.Conditions = []metav1.Condition{{Type: clusterv1.ReadyCondition, Status: metav1.ConditionTrue, LastTransitionTime: metav1.NewTime(now.Add(-ago))}}
		return m
	}
	deleting := readySince("gone", time.Hour)
	deleting.DeletionTimestamp = &metav1.Time{Time: now}
	machines := []*clusterv1.Machine{
		readySince("old", time.Minute),
		readySince("fresh", 10*time.Second),
		readySince("fresher", 25*time.Second),
		mach("pending", 0, "notready"),
		deleting,
	}
	got := Count(machines, 30, now)
	want := Counts{Replicas: 5, Deleting: 1, Ready: 3, Available: 1, NextAvailable: 5 * time.Second}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if got := Count(machines, 0, now); got.Available != 3 || got.NextAvailable != 0 {
		t.Errorf("minReadySeconds 0: %+v", got)
	}
}

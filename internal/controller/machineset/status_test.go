package machineset

import (
	"strings"
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

// Machines being deleted are counted apart: not as machines that are not
// Ready (a scale-down is no health problem), not as marked for deletion
// again, and the conditions say they are being deleted.
func TestStatusCountsDeletingMachinesApart(t *testing.T) {
	now := orderNow
	deleting := func(name string, marked bool) *clusterv1.Machine {
		m := mach(name, 0, "ready")
		if marked {
			m.Annotations = map[string]string{clusterv1.DeleteMachineAnnotation: ""}
		}
		m.DeletionTimestamp = &metav1.Time{Time: now}
		return m
	}
	machines := []*clusterv1.Machine{mach("a", 0, "ready"), mach("b", 0, "annotated"), deleting("c", true), deleting("d", false)}
	if c := Count(machines, 0, now); c != (Counts{Replicas: 4, Deleting: 2, Ready: 2, Available: 2, Marked: 1}) {
		t.Errorf("counts %+v", c)
	}
	replicas := int32(2)
	s := &scope{ms: &clusterv1.MachineSet{Spec: clusterv1.MachineSetSpec{Replicas: &replicas}}, now: now, machines: machines, read: true}
	setStatus(s)
	st := s.ms.Status
	if st.Replicas != 4 || st.ReadyReplicas != 2 || st.AvailableReplicas != 2 {
		t.Errorf("status %+v", st)
	}
	if c := condition(st.Conditions, clusterv1.MachinesReadyCondition); !strings.HasPrefix(c, "True/") {
		t.Errorf("MachinesReady %s: machines being deleted count as not Ready", c)
	}
	if c := condition(st.Conditions, clusterv1.ReadyCondition); !strings.HasPrefix(c, "False/"+clusterv1.ScalingReason) || !strings.Contains(c, "2 being deleted") {
		t.Errorf("Ready %s, want Scaling with 2 being deleted", c)
	}
}

package machineset

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// The deletion order is asked at orderNow, with orderMinReady: machines
// Ready since then ("young") are not available yet.
var orderNow = epoch.Add(time.Hour)

const orderMinReady = 30

// mach builds a machine created age minutes after epoch, in the state named
// by kind: "ready", "young" (Ready for less than orderMinReady at orderNow),
// "notready", "failed", "unhealthy", "annotated".
func mach(name string, minute int, kind string) *clusterv1.Machine {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{
		Name: name, UID: types.UID("uid-" + name),
		CreationTimestamp: metav1.NewTime(epoch.Add(time.Duration(minute) * time.Minute)),
	}}
	ready := func() {
		m.Status.NodeRef = &clusterv1.NodeReference{Name: name}
		m.Status.Conditions = append(m.Status.Conditions, metav1.Condition{Type: clusterv1.ReadyCondition, Status: metav1.ConditionTrue})
	}
	switch kind {
	case "ready":
		ready()
	case "young":
		ready()
		m.Status.Conditions[0].LastTransitionTime = metav1.NewTime(orderNow.Add(-10 * time.Second))
	case "notready":
	case "failed":
		m.Status.FailureReason = clusterv1.MachineVanishedReason
	case "unhealthy":
		ready()
		m.Status.Conditions = append(m.Status.Conditions, metav1.Condition{Type: clusterv1.MachineHealthCheckSucceededCondition, Status: metav1.ConditionFalse})
	case "annotated":
		ready()
		m.Annotations = map[string]string{clusterv1.DeleteMachineAnnotation: ""}
	}
	return m
}

func names(ms []*clusterv1.Machine) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Name
	}
	return out
}

func TestDeletionOrder(t *testing.T) {
	tests := []struct {
		name     string
		machines []*clusterv1.Machine
		policy   clusterv1.MachineDeletePolicy
		n        int
		want     []string
	}{
		{"newest first", []*clusterv1.Machine{mach("a", 1, "ready"), mach("b", 3, "ready"), mach("c", 2, "ready")},
			clusterv1.NewestDeletePolicy, 2, []string{"b", "c"}},
		{"oldest first", []*clusterv1.Machine{mach("a", 1, "ready"), mach("b", 3, "ready"), mach("c", 2, "ready")},
			clusterv1.OldestDeletePolicy, 2, []string{"a", "c"}},
		{"annotated beats the policy", []*clusterv1.Machine{mach("a", 1, "ready"), mach("b", 3, "ready"), mach("old", 0, "annotated")},
			clusterv1.NewestDeletePolicy, 1, []string{"old"}},
		{"annotated beats failed", []*clusterv1.Machine{mach("f", 1, "failed"), mach("x", 2, "annotated")},
			clusterv1.OldestDeletePolicy, 1, []string{"x"}},
		{"failed and unhealthy before not ready, before healthy", []*clusterv1.Machine{
			mach("h", 9, "ready"), mach("n", 1, "notready"), mach("u", 5, "unhealthy"), mach("f", 3, "failed")},
			clusterv1.NewestDeletePolicy, 4, []string{"u", "f", "n", "h"}},
		{"Ready but not yet for minReadySeconds: after not Ready, before available, whatever the policy", []*clusterv1.Machine{
			mach("h", 9, "ready"), mach("y", 1, "young"), mach("n", 5, "notready")},
			clusterv1.NewestDeletePolicy, 3, []string{"n", "y", "h"}},
		{"the available machine is kept when one of two goes", []*clusterv1.Machine{mach("old", 1, "ready"), mach("young", 2, "young")},
			clusterv1.OldestDeletePolicy, 1, []string{"young"}},
		{"n larger than the machines", []*clusterv1.Machine{mach("a", 1, "ready")}, clusterv1.RandomDeletePolicy, 3, []string{"a"}},
		{"n zero", []*clusterv1.Machine{mach("a", 1, "ready")}, clusterv1.RandomDeletePolicy, 0, []string{}},
		{"same age: by name", []*clusterv1.Machine{mach("b", 1, "ready"), mach("a", 1, "ready")}, clusterv1.OldestDeletePolicy, 2, []string{"a", "b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := names(DeletionOrder(tt.machines, tt.policy, tt.n, orderMinReady, orderNow))
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// Random is a stable shuffle: the same machines in any order give the same
// pick, so a repeated pass deletes nothing more; and it does not simply
// follow age or name.
func TestDeletionOrderRandomIsStable(t *testing.T) {
	var ms []*clusterv1.Machine
	for i := range 20 {
		ms = append(ms, mach(string(rune('a'+i)), i, "ready"))
	}
	first := names(DeletionOrder(ms, clusterv1.RandomDeletePolicy, 5, orderMinReady, orderNow))
	reversed := slices.Clone(ms)
	slices.Reverse(reversed)
	if again := names(DeletionOrder(reversed, clusterv1.RandomDeletePolicy, 5, orderMinReady, orderNow)); !slices.Equal(first, again) {
		t.Errorf("random pick changed with input order: %v then %v", first, again)
	}
	if byAge := names(DeletionOrder(ms, clusterv1.OldestDeletePolicy, 5, orderMinReady, orderNow)); slices.Equal(first, byAge) {
		t.Errorf("random pick %v is just the oldest", first)
	}
}

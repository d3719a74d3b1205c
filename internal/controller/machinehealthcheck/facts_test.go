package machinehealthcheck

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

func TestFactsOf(t *testing.T) {
	created := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	provisioned := created.Add(time.Minute)
	set := &clusterv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Name: "s", UID: "u"}}
	deployment := &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Name: "d", UID: "v"}}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "c", UID: "w"}}
	base := func() *clusterv1.Machine {
		return &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: "m", CreationTimestamp: metav1.NewTime(created)},
			Spec:       clusterv1.MachineSpec{Roles: []clusterv1.MachineRole{clusterv1.WorkerRole}},
		}
	}
	tests := []struct {
		name   string
		change func(*clusterv1.Machine)
		check  func(t *testing.T, m *clusterv1.Machine)
	}{
		{"not provisioned: the startup clock starts at creation", func(*clusterv1.Machine) {}, func(t *testing.T, m *clusterv1.Machine) {
			if f := factsOf(m); !f.Started.Equal(created) || f.OwnedBySet || f.ControlPlane || f.Failed || f.Deleting || f.HadNode {
				t.Errorf("%+v", f)
			}
		}},
		{"provisioned: the startup clock starts then", func(m *clusterv1.Machine) {
			meta := metav1.Condition{Type: clusterv1.MachineProvisionedCondition, Status: metav1.ConditionTrue, LastTransitionTime: metav1.NewTime(provisioned)}
			m.Status.Conditions = []metav1.Condition{meta}
		}, func(t *testing.T, m *clusterv1.Machine) {
			if f := factsOf(m); !f.Started.Equal(provisioned) {
				t.Errorf("started %v, want %v", f.Started, provisioned)
			}
		}},
		{"owned by a MachineSet", func(m *clusterv1.Machine) {
			m.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(set, clusterv1.GroupVersion.WithKind("MachineSet"))}
		}, func(t *testing.T, m *clusterv1.Machine) {
			if !factsOf(m).OwnedBySet {
				t.Error("not owned by its set")
			}
		}},
		{"owned by something else: not replaced by a set", func(m *clusterv1.Machine) {
			m.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(deployment, clusterv1.GroupVersion.WithKind("MachineDeployment"))}
		}, func(t *testing.T, m *clusterv1.Machine) {
			if factsOf(m).OwnedBySet {
				t.Error("owned by a set")
			}
		}},
		{"a control-plane machine its Cluster does not own is no member: nothing replaces it", func(m *clusterv1.Machine) {
			m.Spec.ClusterName = "c"
			m.Spec.Roles = []clusterv1.MachineRole{clusterv1.ControlPlaneRole}
			m.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(cluster, clusterv1.GroupVersion.WithKind("Cluster"))}
			m.OwnerReferences[0].Controller = nil
		}, func(t *testing.T, m *clusterv1.Machine) {
			if f := factsOf(m); f.ControlPlane || f.OwnedBySet {
				t.Errorf("%+v", f)
			}
		}},
		{"failed, control plane, deleting, had a node", func(m *clusterv1.Machine) {
			m.Status.FailureReason, m.Status.FailureMessage = "X", "broken"
			m.Spec.ClusterName = "c"
			m.Spec.Roles = []clusterv1.MachineRole{clusterv1.ControlPlaneRole}
			m.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(cluster, clusterv1.GroupVersion.WithKind("Cluster"))}
			now := metav1.Now()
			m.DeletionTimestamp = &now
			m.Status.NodeRef = &clusterv1.NodeReference{Name: "n"}
		}, func(t *testing.T, m *clusterv1.Machine) {
			if f := factsOf(m); !f.Failed || f.FailureMessage != "broken" || !f.ControlPlane || !f.Deleting || !f.HadNode {
				t.Errorf("%+v", f)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := base()
			tc.change(m)
			tc.check(t, m)
		})
	}
}

func TestNodeReachable(t *testing.T) {
	node := func(s corev1.ConditionStatus) *corev1.Node {
		return &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: s}}}}
	}
	for _, tc := range []struct {
		node *corev1.Node
		want bool
	}{
		{nil, false},
		{&corev1.Node{}, false},
		{node(corev1.ConditionTrue), true},
		{node(corev1.ConditionFalse), false},
		{node(corev1.ConditionUnknown), false},
	} {
		if got := nodeReachable(tc.node); got != tc.want {
			t.Errorf("nodeReachable(%v) = %v, want %v", tc.node, got, tc.want)
		}
	}
}

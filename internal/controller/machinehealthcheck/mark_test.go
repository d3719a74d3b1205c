package machinehealthcheck

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/health"
	"marina.dev/marina/internal/scheme"
)

// The marks a verdict leaves on a machine: the reason, the condition, and
// a bounded drain for a machine about to be remediated.
func TestMarks(t *testing.T) {
	readyNode := &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	unhealthy := health.Verdict{Name: "m", Reason: clusterv1.MachineUnhealthyNodeConditionReason, Message: "Node n has had Ready=Unknown for 6s"}
	remediate, markOnly := unhealthy, unhealthy
	remediate.Action, markOnly.Action = health.Remediate, health.MarkOnly

	tests := []struct {
		name        string
		annotations map[string]string
		verdict     health.Verdict
		node        *corev1.Node
		allowed     bool
		// want: annotations present (value contains) or absent ("-").
		want       map[string]string
		wantStatus metav1.ConditionStatus
		wantDrain  time.Duration
	}{
		{
			name: "remediated, Node not Ready: the drain is skipped", verdict: remediate, allowed: true,
			want: map[string]string{
				clusterv1.RemediationReasonAnnotation:   "UnhealthyNodeCondition: Node n has had Ready=Unknown",
				clusterv1.ExcludeNodeDrainingAnnotation: "MachineHealthCheck workers",
			},
			wantStatus: metav1.ConditionFalse,
		},
		{
			name: "remediated, Node Ready: the drain is bounded", verdict: remediate, node: readyNode, allowed: true,
			want:       map[string]string{clusterv1.RemediationReasonAnnotation: "UnhealthyNodeCondition", clusterv1.ExcludeNodeDrainingAnnotation: "-"},
			wantStatus: metav1.ConditionFalse, wantDrain: time.Minute,
		},
		{
			name: "marked only", verdict: markOnly, allowed: true,
			want:       map[string]string{clusterv1.RemediationReasonAnnotation: "UnhealthyNodeCondition", clusterv1.ExcludeNodeDrainingAnnotation: "-"},
			wantStatus: metav1.ConditionFalse,
		},
		{
			name: "short-circuited: a condition, no annotation", verdict: unhealthy, allowed: false,
			want:       map[string]string{clusterv1.RemediationReasonAnnotation: "-"},
			wantStatus: metav1.ConditionFalse,
		},
		{
			name:    "healthy again: our marks go, a person's stay",
			verdict: health.Verdict{Name: "m", Healthy: true}, node: readyNode, allowed: true,
			annotations: map[string]string{clusterv1.RemediationReasonAnnotation: "x", clusterv1.ExcludeNodeDrainingAnnotation: skipDrainNote + "workers"},
			want:        map[string]string{clusterv1.RemediationReasonAnnotation: "-", clusterv1.ExcludeNodeDrainingAnnotation: "-"},
			wantStatus:  metav1.ConditionTrue,
		},
		{
			name:    "healthy: a person's exclude-node-draining stays",
			verdict: health.Verdict{Name: "m", Healthy: true}, node: readyNode, allowed: true,
			annotations: map[string]string{clusterv1.ExcludeNodeDrainingAnnotation: "yes"},
			want:        map[string]string{clusterv1.ExcludeNodeDrainingAnnotation: "yes"},
			wantStatus:  metav1.ConditionTrue,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: "ns", UID: "u", Annotations: tc.annotations}}
			c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(m).WithStatusSubresource(&clusterv1.Machine{}).Build()
			r := &Reconciler{client: c, opts: Options{DrainTimeout: time.Minute}}
			s := &scope{
				mhc:      &clusterv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Name: "workers", Namespace: "ns"}},
				machines: []*clusterv1.Machine{m.DeepCopy()},
				facts:    []health.Machine{{Name: "m", Node: tc.node}},
				plan:     health.Plan{Machines: []health.Verdict{tc.verdict}, Allowed: tc.allowed, Expected: 5, MaxUnhealthy: 2},
			}
			if err := r.mark(context.Background(), s); err != nil {
				t.Fatal(err)
			}
			got := &clusterv1.Machine{}
			if err := c.Get(context.Background(), client.ObjectKeyFromObject(m), got); err != nil {
				t.Fatal(err)
			}
			for k, want := range tc.want {
				have, ok := got.Annotations[k]
				if want == "-" && ok || want != "-" && (!ok || !strings.Contains(have, want)) {
					t.Errorf("annotation %s = %q (present %v), want %q", k, have, ok, want)
				}
			}
			cond := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineHealthCheckSucceededCondition)
			if cond == nil || cond.Status != tc.wantStatus {
				t.Errorf("condition %+v, want status %s", cond, tc.wantStatus)
			}
			var drain time.Duration
			if got.Spec.NodeDrainTimeout != nil {
				drain = got.Spec.NodeDrainTimeout.Duration
			}
			if drain != tc.wantDrain {
				t.Errorf("nodeDrainTimeout %v, want %v", drain, tc.wantDrain)
			}
		})
	}
}

package drain

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"marina.dev/marina/internal/testenv"
)

// env is a real API server: the eviction API, PodDisruptionBudgets and
// graceful pod deletion are its own, not a fake's.
var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

func TestDecide(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	grace := 5 * time.Minute
	deleting := func(ago time.Duration) *corev1.Pod {
		ts := metav1.NewTime(now.Add(-ago))
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &ts}}
	}
	yes := true
	tests := []struct {
		name      string
		pod       *corev1.Pod
		nodeReady bool
		want      action
	}{
		{"running pod: evict", &corev1.Pod{}, true, evict},
		{"running pod on a Node not Ready: evict all the same", &corev1.Pod{}, false, evict},
		{"finished pod: ignore", &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}, true, ignore},
		{"DaemonSet pod: ignore", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Controller: &yes}}}}, true, ignore},
		{"mirror pod: ignore", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "x"}}}, true, ignore},
		{"being deleted on a Ready Node: wait, however long", deleting(time.Hour), true, wait},
		{"being deleted on a Node not Ready, within the grace: wait", deleting(4 * time.Minute), false, wait},
		{"being deleted on a Node not Ready, past the grace: skip", deleting(6 * time.Minute), false, skip},
	}
	for _, tc := range tests {
		if got := decide(tc.pod, tc.nodeReady, now, grace); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// world is a Node and a namespace in the test API server.
type world struct {
	t    *testing.T
	cs   kubernetes.Interface
	ns   string
	node *corev1.Node
}

func newWorld(t *testing.T, ready corev1.ConditionStatus) *world {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	w := &world{t: t, cs: cs, ns: env.Namespace(t)}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-" + w.ns}}
	if node, err = cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, LastTransitionTime: metav1.Now(), LastHeartbeatTime: metav1.Now()}}
	if w.node, err = cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return w
}

// runningPod makes a pod bound to the Node and Running, as its kubelet
// would report it (the eviction API lets Pending pods go past any budget).
func (w *world) runningPod(name string, labels map[string]string) {
	w.t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.ns, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: w.node.Name, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/app:1"}}},
	}
	pod, err := w.cs.CoreV1().Pods(w.ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	if _, err := w.cs.CoreV1().Pods(w.ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) pdb(name string, labels map[string]string) {
	w.t.Helper()
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.ns},
		Spec:       policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &one, Selector: &metav1.LabelSelector{MatchLabels: labels}},
	}
	if _, err := w.cs.PolicyV1().PodDisruptionBudgets(w.ns).Create(context.Background(), pdb, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

// A pod under two PodDisruptionBudgets cannot be evicted: the API server
// answers 500 on every pass. The pass reports it, with the error, and
// does not fail, so that the caller's nodeDrainTimeout still runs; the
// other pods are evicted on the same pass.
func TestEvictionThatFailsEveryPassIsReportedNotReturned(t *testing.T) {
	w := newWorld(t, corev1.ConditionTrue)
	w.runningPod("twice", map[string]string{"app": "twice"})
	w.runningPod("free", map[string]string{"app": "free"})
	w.pdb("a", map[string]string{"app": "twice"})
	w.pdb("b", map[string]string{"app": "twice"})

	for pass := 1; pass <= 2; pass++ {
		res, err := Evict(context.Background(), w.cs, w.node, Options{})
		if err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		if len(res.Failed) != 1 || !strings.HasPrefix(res.Failed[0], w.ns+"/twice: ") || !strings.Contains(res.Failed[0], "more than one PodDisruptionBudget") {
			t.Errorf("pass %d: failed %q, want the pod under two budgets with the API server's reason", pass, res.Failed)
		}
		if res.Done() || !strings.Contains(res.String(), "evictions failing: "+w.ns+"/twice") {
			t.Errorf("pass %d: %s; want the pod left and its failure said", pass, res)
		}
	}
	free, err := w.cs.CoreV1().Pods(w.ns).Get(context.Background(), "free", metav1.GetOptions{})
	if err != nil || free.DeletionTimestamp == nil {
		t.Errorf("the free pod was not evicted (err %v)", err)
	}
}

// An evicted pod on a Node that is not Ready stays Terminating: no kubelet
// confirms it gone. Past the grace it is left behind and the drain is
// done; on a Ready Node, or within the grace, the drain waits for it.
func TestPodsOnANodeNotReadyAreLeftBehindAfterTheGrace(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ready corev1.ConditionStatus
		after time.Duration
		done  bool
	}{
		{"Node Unknown, past the grace", corev1.ConditionUnknown, time.Minute, true},
		{"Node Unknown, within the grace", corev1.ConditionUnknown, 0, false},
		{"Node Ready, past the grace", corev1.ConditionTrue, time.Minute, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, tc.ready)
			w.runningPod("web", nil)
			opts := Options{UnreachableGrace: 30 * time.Second}
			res, err := Evict(context.Background(), w.cs, w.node, opts)
			if err != nil {
				t.Fatal(err)
			}
			if res.Done() {
				t.Fatalf("first pass done: %s", res)
			}
			pod, err := w.cs.CoreV1().Pods(w.ns).Get(context.Background(), "web", metav1.GetOptions{})
			if err != nil || pod.DeletionTimestamp == nil {
				t.Fatalf("the evicted pod is not Terminating (err %v)", err)
			}
			// The deletionTimestamp is the end of the pod's grace period.
			opts.Now = pod.DeletionTimestamp.Add(tc.after)
			res, err = Evict(context.Background(), w.cs, w.node, opts)
			if err != nil {
				t.Fatal(err)
			}
			if res.Done() != tc.done {
				t.Errorf("second pass done %v, want %v: %s", res.Done(), tc.done, res)
			}
			if tc.done && (len(res.Skipped) != 1 || !strings.Contains(res.String(), "left behind on the unreachable node: "+w.ns+"/web")) {
				t.Errorf("skipped %v (%s), want the pod named", res.Skipped, res)
			}
		})
	}
}

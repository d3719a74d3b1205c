// Package drain cordons a Node and evicts its pods through the eviction API,
// so PodDisruptionBudgets are honoured exactly as `kubectl drain` honours
// them. One call makes one pass: it evicts what it may and reports what is
// left, and the caller decides when to try again and when to give up. A
// pod whose eviction fails is reported, not returned as an error, so that
// the caller's timeout runs whatever the failure; and, as upstream Cluster
// API does, a pod on a Node that is not Ready is left behind once its
// deletion is older than a grace period: no kubelet will confirm it gone.
package drain

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// DefaultUnreachableGrace is how long a pod's deletion on a Node that is
// not Ready is waited for before the pod is left behind: upstream Cluster
// API's 5 minutes.
const DefaultUnreachableGrace = 5 * time.Minute

// Options tune a drain pass.
type Options struct {
	// UnreachableGrace: on a Node that is not Ready, a pod whose
	// deletionTimestamp is older than this is left behind (Result.Skipped)
	// instead of waited for. 0 means DefaultUnreachableGrace.
	UnreachableGrace time.Duration
	// Now is the current time; zero means time.Now().
	Now time.Time
}

// Result is what one drain pass left behind.
type Result struct {
	// Remaining are the pods still on the node (namespace/name), sorted.
	Remaining []string
	// Blocked are the pods whose eviction a PodDisruptionBudget refused.
	Blocked []string
	// Failed are the pods whose eviction failed otherwise (a pod under two
	// PodDisruptionBudgets answers 500), with the error: "ns/name: error".
	Failed []string
	// Skipped are the pods left behind on a Node that is not Ready: their
	// deletion began longer ago than the grace period, and no kubelet will
	// confirm it. They do not keep the drain open.
	Skipped []string
}

// Done reports whether the node has no pods left to evict.
func (r Result) Done() bool { return len(r.Remaining) == 0 }

// String summarises the result for a condition message.
func (r Result) String() string {
	var msg string
	if r.Done() {
		msg = "no pods left to evict"
	} else {
		msg = fmt.Sprintf("%d pods left on the node (%s)", len(r.Remaining), abbreviate(r.Remaining))
	}
	if len(r.Blocked) > 0 {
		msg += fmt.Sprintf("; evictions refused by a PodDisruptionBudget: %s", abbreviate(r.Blocked))
	}
	if len(r.Failed) > 0 {
		msg += fmt.Sprintf("; evictions failing: %s", abbreviate(r.Failed))
	}
	if len(r.Skipped) > 0 {
		msg += fmt.Sprintf("; left behind on the unreachable node: %s", abbreviate(r.Skipped))
	}
	return msg
}

func abbreviate(names []string) string {
	const max = 5
	if len(names) <= max {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:max], ", ") + fmt.Sprintf(" and %d more", len(names)-max)
}

// Cordon marks the node unschedulable, so no new pods land on it.
func Cordon(ctx context.Context, cs kubernetes.Interface, node string) error {
	patch := []byte(`{"spec":{"unschedulable":true}}`)
	if _, err := cs.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("cordoning node %s: %w", node, err)
	}
	return nil
}

// Evict makes one pass over the node's pods: it asks the eviction API to
// evict each pod that should go and returns what is left. DaemonSet pods and
// static (mirror) pods stay, as with kubectl drain: their controllers would
// put them right back, and they die with the machine. It returns an error
// only when the pods cannot be listed; a failed eviction is in
// Result.Failed.
func Evict(ctx context.Context, cs kubernetes.Interface, node *corev1.Node, opts Options) (Result, error) {
	if opts.UnreachableGrace <= 0 {
		opts.UnreachableGrace = DefaultUnreachableGrace
	}
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	pods, err := cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node.Name).String(),
	})
	if err != nil {
		return Result{}, fmt.Errorf("listing pods on node %s: %w", node.Name, err)
	}
	ready := nodeReady(node)
	var res Result
	for i := range pods.Items {
		pod := &pods.Items[i]
		name := pod.Namespace + "/" + pod.Name
		switch decide(pod, ready, opts.Now, opts.UnreachableGrace) {
		case ignore:
			continue
		case skip:
			res.Skipped = append(res.Skipped, name)
			continue
		case wait:
			res.Remaining = append(res.Remaining, name)
			continue
		}
		res.Remaining = append(res.Remaining, name)
		err := cs.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{
			ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		})
		switch {
		case err == nil, apierrors.IsNotFound(err):
		case apierrors.IsTooManyRequests(err):
			// 429: a PodDisruptionBudget does not allow it right now.
			res.Blocked = append(res.Blocked, name)
		default:
			res.Failed = append(res.Failed, fmt.Sprintf("%s: %v", name, err))
		}
	}
	sort.Strings(res.Remaining)
	sort.Strings(res.Blocked)
	sort.Strings(res.Failed)
	sort.Strings(res.Skipped)
	return res, nil
}

// action is what a drain pass does with one pod.
type action int

const (
	// evict the pod.
	evict action = iota
	// ignore: the pod stays and does not hold the drain (DaemonSet, mirror
	// and finished pods).
	ignore
	// wait: the pod is being deleted; the drain waits for it.
	wait
	// skip: the pod is being deleted on a Node that is not Ready, for
	// longer than the grace period; it is left behind.
	skip
)

// decide is what to do with one pod of the node, at now.
func decide(pod *corev1.Pod, nodeReady bool, now time.Time, grace time.Duration) action {
	switch {
	case !shouldEvict(pod):
		return ignore
	case pod.DeletionTimestamp == nil:
		return evict
	case !nodeReady && now.Sub(pod.DeletionTimestamp.Time) > grace:
		return skip
	default:
		return wait
	}
}

// nodeReady reports whether the node's kubelet reports Ready: only then
// does it confirm a deleted pod gone.
func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func shouldEvict(pod *corev1.Pod) bool {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return false
	}
	if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return false
	}
	for _, ref := range pod.OwnerReferences {
		if ref.Controller != nil && *ref.Controller && ref.Kind == "DaemonSet" {
			return false
		}
	}
	return true
}

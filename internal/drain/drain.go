// Package drain cordons a Node and evicts its pods through the eviction API,
// so PodDisruptionBudgets are honoured exactly as `kubectl drain` honours
// them. One call makes one pass: it evicts what it may and reports what is
// left, and the caller decides when to try again and when to give up.
package drain

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// Result is what one drain pass left behind.
type Result struct {
	// Remaining are the pods still on the node (namespace/name), sorted.
	Remaining []string
	// Blocked are the pods whose eviction a PodDisruptionBudget refused.
	Blocked []string
}

// Done reports whether the node has no pods left to evict.
func (r Result) Done() bool { return len(r.Remaining) == 0 }

// String summarises the result for a condition message.
func (r Result) String() string {
	if r.Done() {
		return "no pods left to evict"
	}
	msg := fmt.Sprintf("%d pods left on the node (%s)", len(r.Remaining), abbreviate(r.Remaining))
	if len(r.Blocked) > 0 {
		msg += fmt.Sprintf("; evictions refused by a PodDisruptionBudget: %s", abbreviate(r.Blocked))
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
// put them right back, and they die with the machine.
func Evict(ctx context.Context, cs kubernetes.Interface, node string) (Result, error) {
	pods, err := cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return Result{}, fmt.Errorf("listing pods on node %s: %w", node, err)
	}
	var res Result
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !shouldEvict(pod) {
			continue
		}
		name := pod.Namespace + "/" + pod.Name
		res.Remaining = append(res.Remaining, name)
		if pod.DeletionTimestamp != nil {
			continue // already going
		}
		err := cs.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{
			ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		})
		switch {
		case err == nil, apierrors.IsNotFound(err):
		case apierrors.IsTooManyRequests(err):
			// 429: a PodDisruptionBudget does not allow it right now.
			res.Blocked = append(res.Blocked, name)
		default:
			return res, fmt.Errorf("evicting pod %s from node %s: %w", name, node, err)
		}
	}
	sort.Strings(res.Remaining)
	sort.Strings(res.Blocked)
	return res, nil
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

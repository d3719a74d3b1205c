package safety

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/rollout"
	"marina.dev/marina/internal/safety"
)

// freeze counts each MachineSet's machines against its bound, past the
// cache, and freezes or thaws sets as safety.Overshoots decides.
func (c *Controller) freeze(ctx context.Context) error {
	var sets clusterv1.MachineSetList
	if err := c.live.List(ctx, &sets); err != nil {
		return err
	}
	if len(sets.Items) == 0 {
		c.over = map[types.UID]time.Time{}
		return nil
	}
	var machines clusterv1.MachineList
	if err := c.live.List(ctx, &machines); err != nil {
		return err
	}
	var deployments clusterv1.MachineDeploymentList
	if err := c.live.List(ctx, &deployments); err != nil {
		return err
	}
	byUID := map[types.UID]*clusterv1.MachineSet{}
	looks := make([]safety.Set, 0, len(sets.Items))
	why := map[types.UID]string{}
	for i := range sets.Items {
		ms := &sets.Items[i]
		byUID[ms.UID] = ms
		n := countMachines(ms, machines.Items)
		replicas, surge := bound(ms, deployments.Items)
		_, frozen := ms.Annotations[clusterv1.FrozenAnnotation]
		looks = append(looks, safety.Set{UID: ms.UID, Machines: n, Bound: int(replicas + surge), Frozen: frozen})
		why[ms.UID] = fmt.Sprintf("%d machines, above replicas %d + maxSurge %d for over %s: no machine is created until the set is back in bounds (delete the extra machines, or find what made them)",
			n, replicas, surge, c.opts.FreezeAfter)
	}
	freeze, thaw, next := safety.Overshoots(looks, c.over, time.Now(), c.opts.FreezeAfter)
	var errs []error
	for _, uid := range freeze {
		ms := byUID[uid]
		if err := c.annotate(ctx, ms, why[uid]); err != nil {
			// A set that changed since it was read (a runaway's status
			// does) is frozen on the next look, without a new grace.
			errs = append(errs, err)
			next[uid] = c.over[uid]
			continue
		}
		c.log.Info("Froze a runaway MachineSet", "machineset", klog.KObj(ms), "why", why[uid])
		c.recorder.Eventf(ms, nil, corev1.EventTypeWarning, clusterv1.TooManyMachinesReason, "Freeze", "%s", why[uid])
	}
	for _, uid := range thaw {
		ms := byUID[uid]
		if err := c.annotate(ctx, ms, ""); err != nil {
			errs = append(errs, err)
			continue
		}
		c.log.Info("Thawed a MachineSet back in bounds", "machineset", klog.KObj(ms))
		c.recorder.Eventf(ms, nil, corev1.EventTypeNormal, "Thawed", "Thaw", "back within replicas + maxSurge: machines are created again")
	}
	c.over = next
	return errors.Join(errs...)
}

// annotate sets the freeze annotation to why, or removes it when why is
// empty. The patch carries the resourceVersion read: a set changed since
// is looked at again on the next pass.
func (c *Controller) annotate(ctx context.Context, ms *clusterv1.MachineSet, why string) error {
	before := ms.DeepCopy()
	if why == "" {
		delete(ms.Annotations, clusterv1.FrozenAnnotation)
	} else {
		metav1.SetMetaDataAnnotation(&ms.ObjectMeta, clusterv1.FrozenAnnotation, why)
	}
	if err := c.client.Patch(ctx, ms, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("patching the freeze of machineset %s: %w", klog.KObj(ms), err)
	}
	return nil
}

// countMachines counts the machines not being deleted that the set
// controls, and the orphans its selector matches in its cluster: a runaway
// may make machines it then loses track of. Machines another set controls
// are that set's, even when the selectors overlap.
func countMachines(ms *clusterv1.MachineSet, machines []clusterv1.Machine) int {
	sel, err := metav1.LabelSelectorAsSelector(&ms.Spec.Selector)
	if err != nil || sel.Empty() {
		sel = labels.Nothing()
	}
	n := 0
	for i := range machines {
		m := &machines[i]
		if m.Namespace != ms.Namespace || !m.DeletionTimestamp.IsZero() {
			continue
		}
		ref := metav1.GetControllerOf(m)
		if (ref != nil && ref.UID == ms.UID) || (ref == nil && m.Spec.ClusterName == ms.Spec.ClusterName && sel.Matches(labels.Set(m.Labels))) {
			n++
		}
	}
	return n
}

// bound is the set's replicas and the surge its deployment allows it
// above them (none for a set on its own).
func bound(ms *clusterv1.MachineSet, deployments []clusterv1.MachineDeployment) (replicas, surge int32) {
	replicas = 1
	if ms.Spec.Replicas != nil {
		replicas = *ms.Spec.Replicas
	}
	ref := metav1.GetControllerOf(ms)
	if ref == nil || ref.Kind != "MachineDeployment" {
		return replicas, 0
	}
	for i := range deployments {
		md := &deployments[i]
		if md.UID != ref.UID {
			continue
		}
		ru := md.Spec.Strategy.RollingUpdate
		if ru == nil || ru.MaxSurge == nil {
			return replicas, 1
		}
		want := int32(1)
		if md.Spec.Replicas != nil {
			want = *md.Spec.Replicas
		}
		s, _, err := rollout.Bounds(want, *ru.MaxSurge, intstr.FromInt32(0))
		if err != nil {
			return replicas, 1
		}
		return replicas, s
	}
	return replicas, 0
}

package machineset

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/autoscaling"
	"marina.dev/marina/internal/controller/index"
)

// ScaleDownOnlyAnnotation on a MachineSet stops it from creating machines:
// it only removes them when it shrinks. The MachineDeployment controller puts
// it on the old sets of an OnDelete deployment, so that a machine a user
// deletes is replaced from the current template by the current set, and
// never, in a race with the deployment lowering the old set's replicas,
// from the old template. Set by the controller; do not edit.
const ScaleDownOnlyAnnotation = clusterv1.GroupName + "/scale-down-only"

// matches reports whether machine m belongs to set ms by its labels and
// cluster.
func matches(ms *clusterv1.MachineSet, m *clusterv1.Machine) bool {
	sel, err := metav1.LabelSelectorAsSelector(&ms.Spec.Selector)
	if err != nil || sel.Empty() {
		return false
	}
	return m.Spec.ClusterName == ms.Spec.ClusterName && sel.Matches(labels.Set(m.Labels))
}

// checkBlocked finds whatever forbids creating or deleting machines now:
// the set's paused annotation, a missing, paused or deleted Cluster, or a
// template its own selector does not match.
func (r *Reconciler) checkBlocked(ctx context.Context, s *scope) error {
	ms := s.ms
	block := func(reason, msg string) { s.blockedReason, s.blockedMessage = reason, msg }
	if _, ok := ms.Annotations[clusterv1.PausedAnnotation]; ok {
		block(clusterv1.PausedReason, "the set has the "+clusterv1.PausedAnnotation+" annotation: remove it to resume")
		return nil
	}
	sel, err := metav1.LabelSelectorAsSelector(&ms.Spec.Selector)
	switch {
	case err != nil:
		block(clusterv1.SelectorMismatchReason, fmt.Sprintf("spec.selector is invalid: %v", err))
		return nil
	case !sel.Matches(labels.Set(ms.Spec.Template.ObjectMeta.Labels)):
		block(clusterv1.SelectorMismatchReason, fmt.Sprintf(
			"spec.template.metadata.labels %v do not match spec.selector %q, so machines made from the template would not belong to the set: make the template's labels match the selector",
			ms.Spec.Template.ObjectMeta.Labels, sel.String()))
		return nil
	}
	cluster := &clusterv1.Cluster{}
	err = r.client.Get(ctx, types.NamespacedName{Namespace: ms.Namespace, Name: ms.Spec.ClusterName}, cluster)
	switch {
	case apierrors.IsNotFound(err):
		block(clusterv1.WaitingForClusterReason, fmt.Sprintf("Cluster %s does not exist: create it, or fix spec.clusterName", ms.Spec.ClusterName))
	case err != nil:
		return fmt.Errorf("reading cluster %s: %w", ms.Spec.ClusterName, err)
	case !cluster.DeletionTimestamp.IsZero():
		block(clusterv1.DeletingReason, fmt.Sprintf("Cluster %s is being deleted: no machine is created or deleted by the set", ms.Spec.ClusterName))
	case cluster.Spec.Paused:
		block(clusterv1.ClusterPausedReason, fmt.Sprintf("Cluster %s is paused (spec.paused): no machine is created or deleted until it is resumed", ms.Spec.ClusterName))
	}
	return nil
}

// readMachines lists the machines the set owns, and adopts orphans that
// match its selector and releases owned machines that stopped matching, as
// a ReplicaSet does (not while blocked).
func (r *Reconciler) readMachines(ctx context.Context, s *scope) error {
	ms := s.ms
	list, err := r.listMachines(ctx, ms)
	if err != nil {
		return err
	}
	for i := range list {
		m := &list[i]
		ref := metav1.GetControllerOf(m)
		switch {
		case ref != nil && ref.UID == ms.UID:
			if !matches(ms, m) && m.DeletionTimestamp.IsZero() && s.blockedReason == "" {
				if err := r.release(ctx, ms, m.DeepCopy()); err != nil {
					return err
				}
				continue
			}
			s.machines = append(s.machines, m)
		case ref != nil && ref.Kind == "MachineSet" && matches(ms, m):
			if !slices.Contains(s.overlaps, ref.Name) {
				s.overlaps = append(s.overlaps, ref.Name)
			}
		case ref == nil && m.DeletionTimestamp.IsZero() && matches(ms, m) && s.blockedReason == "":
			m = m.DeepCopy() // the cache's own, see listMachines
			adopted, err := r.adopt(ctx, ms, m)
			if err != nil {
				return err
			}
			if adopted {
				s.machines = append(s.machines, m)
			}
		}
	}
	s.read = true
	return nil
}

// listMachines reads the machines of the set's cluster (all a set may own
// or adopt: a machine's cluster is its set's, and never changes) from the
// cache when it shows every machine write this process made about the set,
// else from the API server (doc.go, Crash safety). Cached machines are the
// cache's own, not copies (a set's pass comes with every change of its
// machines, and copying a hundred each time was an eighth of all marina
// allocated in a fleet run): only adopt and release change a machine, and
// they are given a copy.
func (r *Reconciler) listMachines(ctx context.Context, ms *clusterv1.MachineSet) ([]clusterv1.Machine, error) {
	cached := &clusterv1.MachineList{}
	if err := r.client.List(ctx, cached, client.InNamespace(ms.Namespace), client.MatchingFields{index.MachineCluster: ms.Spec.ClusterName},
		client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing machines of machineset %s: %w", klog.KObj(ms), err)
	}
	if r.writes.caughtUp(ms.UID, cached.Items) {
		return cached.Items, nil
	}
	// The API server selects the cluster's machines itself (the CRD's
	// selectable field): a fleet's namespace holds every cluster's.
	live := &clusterv1.MachineList{}
	if err := r.live.List(ctx, live, client.InNamespace(ms.Namespace), client.MatchingFields{index.MachineCluster: ms.Spec.ClusterName}); err != nil {
		return nil, fmt.Errorf("listing machines of machineset %s: %w", klog.KObj(ms), err)
	}
	r.writes.read(ms.UID, live.Items)
	r.liveLists.Add(1)
	return live.Items, nil
}

// adopt makes the set the machine's controller. The optimistic lock makes
// two sets racing for one machine safe: the loser gets a conflict and
// looks again on its next pass.
func (r *Reconciler) adopt(ctx context.Context, ms *clusterv1.MachineSet, m *clusterv1.Machine) (bool, error) {
	before := m.DeepCopy()
	if err := controllerutil.SetControllerReference(ms, m, r.client.Scheme()); err != nil {
		return false, nil // another controller owns it after all
	}
	if err := r.client.Patch(ctx, m, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		// A conflict too: the cached copy was stale, and counting without
		// this machine would make the pass create one in its place.
		return false, fmt.Errorf("adopting machine %s: %w", klog.KObj(m), err)
	}
	r.writes.wrote(ms.UID, m.Name, m.ResourceVersion)
	ctrl.LoggerFrom(ctx).Info("Adopted machine", "machine", klog.KObj(m))
	return true, nil
}

func (r *Reconciler) release(ctx context.Context, ms *clusterv1.MachineSet, m *clusterv1.Machine) error {
	before := m.DeepCopy()
	refs := m.OwnerReferences[:0:0]
	for _, ref := range m.OwnerReferences {
		if ref.UID != ms.UID {
			refs = append(refs, ref)
		}
	}
	m.OwnerReferences = refs
	if err := r.client.Patch(ctx, m, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		// A conflict too, as for adopt: look again before counting.
		return fmt.Errorf("releasing machine %s: %w", klog.KObj(m), err)
	}
	r.writes.wrote(ms.UID, m.Name, m.ResourceVersion)
	ctrl.LoggerFrom(ctx).Info("Released machine: its labels no longer match the selector", "machine", klog.KObj(m))
	return nil
}

// syncAnnotations keeps the scale-from-zero annotations of the set in line
// with the MachineClass of its template (docs/autoscaling.md).
func (r *Reconciler) syncAnnotations(ctx context.Context, s *scope) error {
	ms := s.ms
	ref := ms.Spec.Template.Spec.ClassRef
	if ref == nil {
		return nil
	}
	mc := &clusterv1.MachineClass{}
	if err := r.client.Get(ctx, types.NamespacedName{Name: ref.Name}, mc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil // the machines report the missing class
		}
		return fmt.Errorf("reading MachineClass %q: %w", ref.Name, err)
	}
	derived, ok, err := autoscaling.Capacity(mc, &ms.Spec.Template.Spec)
	if err != nil || !ok {
		// A template that does not fit its class is reported by each
		// machine's ProviderSpecResolved condition.
		return nil
	}
	annotations, changed := autoscaling.Apply(ms.Annotations, derived)
	if !changed {
		return nil
	}
	before := ms.DeepCopy()
	ms.Annotations = annotations
	if err := r.client.Patch(ctx, ms, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("writing capacity annotations of machineset %s: %w", klog.KObj(ms), err)
	}
	return nil
}

// syncReplicas creates or deletes machines until the set has spec.replicas.
func (r *Reconciler) syncReplicas(ctx context.Context, s *scope) error {
	ms := s.ms
	want := int(ptrOr(ms.Spec.Replicas, 1))
	var active []*clusterv1.Machine
	for _, m := range s.machines {
		if m.DeletionTimestamp.IsZero() {
			active = append(active, m)
		}
	}
	_, scaleDownOnly := ms.Annotations[ScaleDownOnlyAnnotation]
	_, frozen := ms.Annotations[clusterv1.FrozenAnnotation]
	switch {
	case len(s.machines) < want && scaleDownOnly:
		// An old revision of an OnDelete deployment: a machine someone
		// deleted is replaced by the deployment's current set, never here.
	case len(s.machines) < want && frozen:
		// The safety controller saw a runaway: nothing is created until
		// it has seen the set back in bounds.
	case len(s.machines) < want:
		return r.createMachines(ctx, s, want-len(s.machines))
	case len(active) > want:
		for _, m := range DeletionOrder(active, ms.Spec.DeletePolicy, len(active)-want, ms.Spec.MinReadySeconds, s.now) {
			uid := m.UID
			if err := r.client.Delete(ctx, m, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting machine %s of machineset %s: %w", klog.KObj(m), klog.KObj(ms), err)
			}
			r.writes.wrote(ms.UID, m.Name, "")
			ctrl.LoggerFrom(ctx).Info("Deleting machine", "machine", klog.KObj(m), "priority", deletePriority(m, ms.Spec.MinReadySeconds, s.now))
			now := metav1.NewTime(s.now)
			m.DeletionTimestamp = &now
			if r.crashed("after-delete") {
				return errCrash
			}
		}
	}
	return nil
}

// createMachines creates n machines in batches of 1, 2, 4, … as a
// ReplicaSet does: a set of hundreds is made in a few round trips of
// parallel creates, while a template the API refuses costs one failed
// request, not n. It stops at the first batch with a failure.
func (r *Reconciler) createMachines(ctx context.Context, s *scope, n int) error {
	for batch := 1; n > 0; batch *= 2 {
		size := min(batch, n)
		made := make([]*clusterv1.Machine, size)
		errs := make([]error, size)
		var wg sync.WaitGroup
		for i := range size {
			wg.Go(func() { made[i], errs[i] = r.createMachine(ctx, s.ms) })
		}
		wg.Wait()
		for i, m := range made {
			switch {
			case errs[i] == nil:
				r.writes.wrote(s.ms.UID, m.Name, m.ResourceVersion)
				s.machines = append(s.machines, m)
			case ambiguous(errs[i]):
				// Perhaps made after all: the next pass lists live rather
				// than trust a cache that may never show it to have been.
				r.writes.unsure(s.ms.UID)
			}
		}
		if err := errors.Join(errs...); err != nil {
			s.createErr = err
			return err
		}
		if r.crashed("after-create") {
			return errCrash
		}
		n -= size
	}
	return nil
}

// createMachine creates one machine from the template, owned by the set in
// the same request.
func (r *Reconciler) createMachine(ctx context.Context, ms *clusterv1.MachineSet) (*clusterv1.Machine, error) {
	tmpl := ms.Spec.Template
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: ms.Name + "-",
			Namespace:    ms.Namespace,
			Labels:       maps.Clone(tmpl.ObjectMeta.Labels),
			Annotations:  maps.Clone(tmpl.ObjectMeta.Annotations),
		},
		Spec: *tmpl.Spec.DeepCopy(),
	}
	if m.Labels == nil {
		m.Labels = map[string]string{}
	}
	m.Labels[clusterv1.ClusterNameLabel] = ms.Spec.ClusterName
	m.Spec.ProviderID = "" // each machine's own, never the template's
	if err := controllerutil.SetControllerReference(ms, m, r.client.Scheme()); err != nil {
		return nil, fmt.Errorf("setting owner of a new machine: %w", err)
	}
	if err := r.client.Create(ctx, m); err != nil {
		r.recorder.Eventf(ms, nil, corev1.EventTypeWarning, clusterv1.MachineCreationFailedReason, "Create", "creating a machine: %v", err)
		return nil, fmt.Errorf("creating a machine for machineset %s: %w", klog.KObj(ms), err)
	}
	ctrl.LoggerFrom(ctx).Info("Created machine", "machine", klog.KObj(m))
	return m, nil
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

package machinedeployment

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/autoscaling"
	"marina.dev/marina/internal/controller/index"
	"marina.dev/marina/internal/controller/machineset"
	"marina.dev/marina/internal/rollout"
)

// scope is what one pass learns about a deployment.
type scope struct {
	md  *clusterv1.MachineDeployment
	now time.Time
	// hash of spec.template; newSet is its set, nil until created.
	hash   string
	newSet *clusterv1.MachineSet
	// sets the deployment owns, new one included, by ascending revision.
	sets []*clusterv1.MachineSet
	// machines of each set, by the set's UID; nil until read, and then no
	// status is written.
	machines map[types.UID][]*clusterv1.Machine
	// blocked says why no set may be scaled now (a condition reason and
	// message); empty when they may.
	blockedReason, blockedMessage string
	// rollbackProblem explains a rollback annotation that cannot be obeyed.
	rollbackProblem string
	// acted is true when this pass created or scaled a set: progress.
	acted bool
	// requeueAfter brings the deployment back for minReadySeconds or the
	// progress deadline.
	requeueAfter time.Duration
}

func (s *scope) requeueIn(d time.Duration) {
	if d > 0 && (s.requeueAfter == 0 || d < s.requeueAfter) {
		s.requeueAfter = d
	}
}

func revision(o metav1.Object) int64 {
	n, _ := strconv.ParseInt(o.GetAnnotations()[clusterv1.RevisionAnnotation], 10, 64)
	return n
}

// checkBlocked finds whatever forbids scaling now: the paused annotation, a
// missing, paused or deleted Cluster, or a template its selector does not
// match.
func (r *Reconciler) checkBlocked(ctx context.Context, s *scope) error {
	md := s.md
	block := func(reason, msg string) { s.blockedReason, s.blockedMessage = reason, msg }
	if _, ok := md.Annotations[clusterv1.PausedAnnotation]; ok {
		block(clusterv1.PausedReason, "the deployment has the "+clusterv1.PausedAnnotation+" annotation: remove it to resume")
		return nil
	}
	sel, err := metav1.LabelSelectorAsSelector(&md.Spec.Selector)
	switch {
	case err != nil:
		block(clusterv1.SelectorMismatchReason, fmt.Sprintf("spec.selector is invalid: %v", err))
		return nil
	case !sel.Matches(labels.Set(md.Spec.Template.ObjectMeta.Labels)):
		block(clusterv1.SelectorMismatchReason, fmt.Sprintf(
			"spec.template.metadata.labels %v do not match spec.selector %q: make the template's labels match the selector; no machine is created or deleted until then",
			md.Spec.Template.ObjectMeta.Labels, sel.String()))
		return nil
	}
	cluster := &clusterv1.Cluster{}
	err = r.client.Get(ctx, types.NamespacedName{Namespace: md.Namespace, Name: md.Spec.ClusterName}, cluster)
	switch {
	case apierrors.IsNotFound(err):
		block(clusterv1.WaitingForClusterReason, fmt.Sprintf("Cluster %s does not exist: create it, or fix spec.clusterName", md.Spec.ClusterName))
	case err != nil:
		return fmt.Errorf("reading cluster %s: %w", md.Spec.ClusterName, err)
	case !cluster.DeletionTimestamp.IsZero():
		block(clusterv1.DeletingReason, fmt.Sprintf("Cluster %s is being deleted: nothing is rolled", md.Spec.ClusterName))
	case cluster.Spec.Paused:
		block(clusterv1.ClusterPausedReason, fmt.Sprintf("Cluster %s is paused (spec.paused): nothing is rolled until it is resumed", md.Spec.ClusterName))
	}
	return nil
}

// readSets reads the deployment's sets and their machines from the cache.
func (r *Reconciler) readSets(ctx context.Context, s *scope) error {
	md := s.md
	var err error
	if s.hash, err = TemplateHash(&md.Spec.Template); err != nil {
		return err
	}
	sets := &clusterv1.MachineSetList{}
	if err := r.client.List(ctx, sets, client.InNamespace(md.Namespace)); err != nil {
		return fmt.Errorf("listing machinesets: %w", err)
	}
	for i := range sets.Items {
		ms := &sets.Items[i]
		if ref := metav1.GetControllerOf(ms); ref == nil || ref.UID != md.UID {
			continue
		}
		s.sets = append(s.sets, ms)
		if ms.Labels[clusterv1.MachineTemplateHashLabel] == s.hash && ms.DeletionTimestamp.IsZero() {
			s.newSet = ms
		}
	}
	sort.SliceStable(s.sets, func(i, j int) bool { return revision(s.sets[i]) < revision(s.sets[j]) })

	// Only the deployment's cluster's machines can be its sets', and they
	// are only read here: not copied out of the cache (a fleet's namespace
	// holds a thousand machines, and every machine change of the
	// deployment's sets brings it back).
	machines := &clusterv1.MachineList{}
	if err := r.client.List(ctx, machines, client.InNamespace(md.Namespace), client.MatchingFields{index.MachineCluster: md.Spec.ClusterName},
		client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing machines: %w", err)
	}
	s.machines = map[types.UID][]*clusterv1.Machine{}
	for i := range machines.Items {
		m := &machines.Items[i]
		if ref := metav1.GetControllerOf(m); ref != nil {
			s.machines[ref.UID] = append(s.machines[ref.UID], m)
		}
	}
	return nil
}

// input is the planner's view of the sets.
func (s *scope) input() rollout.Input {
	md := s.md
	in := rollout.Input{Replicas: ptrOr(md.Spec.Replicas, 1), MaxSurge: intstr.FromInt32(1), MaxUnavailable: intstr.FromInt32(0)}
	if st := md.Spec.Strategy; st != nil && st.RollingUpdate != nil {
		if st.RollingUpdate.MaxSurge != nil {
			in.MaxSurge = *st.RollingUpdate.MaxSurge
		}
		if st.RollingUpdate.MaxUnavailable != nil {
			in.MaxUnavailable = *st.RollingUpdate.MaxUnavailable
		}
	}
	for _, ms := range s.sets {
		c := machineset.Count(s.machines[ms.UID], md.Spec.MinReadySeconds, s.now)
		s.requeueIn(c.NextAvailable)
		scaledFor, _ := strconv.ParseInt(ms.Annotations[clusterv1.DesiredReplicasAnnotation], 10, 32)
		set := rollout.Set{
			Name: ms.Name, Replicas: ptrOr(ms.Spec.Replicas, 1), Revision: revision(ms),
			Actual: c.Replicas, Deleting: c.Deleting, Available: c.Available,
			Marked: c.Marked, ScaledFor: int32(scaledFor),
		}
		if ms == s.newSet {
			in.New = &set
		} else {
			in.Old = append(in.Old, set)
		}
	}
	return in
}

// syncSets creates the current template's set when missing, and writes the
// replicas the planner chose to every set.
func (r *Reconciler) syncSets(ctx context.Context, s *scope) error {
	md := s.md
	in := s.input()
	var plan rollout.Plan
	if md.Spec.Strategy != nil && md.Spec.Strategy.Type == clusterv1.OnDeleteStrategy {
		plan = rollout.OnDelete(in)
	} else {
		// A change of replicas is spread over the sets first; the rollout
		// goes on from there on the next pass.
		scaled, ok, err := rollout.Scale(in)
		if err == nil && !ok {
			scaled, err = rollout.RollingUpdate(in)
		}
		if err != nil {
			return fmt.Errorf("planning the rollout of machinedeployment %s: %w", klog.KObj(md), err)
		}
		plan = scaled
	}
	var maxRevision int64
	for _, ms := range s.sets {
		maxRevision = max(maxRevision, revision(ms))
	}
	if s.newSet == nil {
		ms, err := r.createSet(ctx, s, plan.NewReplicas, maxRevision+1)
		if err != nil || ms == nil {
			return err
		}
		s.newSet = ms
		s.sets = append(s.sets, ms)
		s.acted = true
		if r.crashed("after-create-set") {
			return errCrash
		}
	} else {
		rev := revision(s.newSet)
		if rev < maxRevision || rev == 0 {
			// A template that came back (a rollback) is the newest revision.
			rev = maxRevision + 1
		}
		if err := r.updateSet(ctx, s, s.newSet, plan.NewReplicas, rev, false); err != nil {
			return err
		}
	}
	for _, ms := range s.sets {
		if ms == s.newSet {
			continue
		}
		replicas := ptrOr(ms.Spec.Replicas, 1)
		if v, ok := plan.Old[ms.Name]; ok {
			replicas = v
		}
		onDelete := md.Spec.Strategy != nil && md.Spec.Strategy.Type == clusterv1.OnDeleteStrategy
		if err := r.updateSet(ctx, s, ms, replicas, revision(ms), onDelete); err != nil {
			return err
		}
		if r.crashed("after-scale-old") {
			return errCrash
		}
	}
	return nil
}

// setLabels are the labels of the set of the current template.
func (s *scope) setLabels() map[string]string {
	l := maps.Clone(s.md.Spec.Template.ObjectMeta.Labels)
	if l == nil {
		l = map[string]string{}
	}
	l[clusterv1.MachineTemplateHashLabel] = s.hash
	l[clusterv1.MachineDeploymentNameLabel] = s.md.Name
	l[clusterv1.ClusterNameLabel] = s.md.Spec.ClusterName
	return l
}

// createSet creates the set for the current template. Its name is derived
// from the template's hash, so a repeated create (after a crash, or from a
// stale cache) fails with AlreadyExists instead of making a second set.
func (r *Reconciler) createSet(ctx context.Context, s *scope, replicas int32, rev int64) (*clusterv1.MachineSet, error) {
	md := s.md
	tmpl := md.Spec.Template.DeepCopy()
	if tmpl.ObjectMeta.Labels == nil {
		tmpl.ObjectMeta.Labels = map[string]string{}
	}
	tmpl.ObjectMeta.Labels[clusterv1.MachineTemplateHashLabel] = s.hash
	sel := md.Spec.Selector.DeepCopy()
	if sel.MatchLabels == nil {
		sel.MatchLabels = map[string]string{}
	}
	sel.MatchLabels[clusterv1.MachineTemplateHashLabel] = s.hash
	annotations := map[string]string{
		clusterv1.RevisionAnnotation:         strconv.FormatInt(rev, 10),
		clusterv1.UpstreamRevisionAnnotation: strconv.FormatInt(rev, 10),
		clusterv1.DesiredReplicasAnnotation:  strconv.FormatInt(int64(ptrOr(md.Spec.Replicas, 1)), 10),
	}
	if derived, err := r.capacity(ctx, md); err != nil {
		return nil, err
	} else if derived != nil {
		annotations, _ = autoscaling.Apply(annotations, derived)
	}
	name := md.Name
	if len(name) > 240 {
		name = name[:240]
	}
	ms := &clusterv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{
			Name: name + "-" + s.hash, Namespace: md.Namespace,
			Labels: s.setLabels(), Annotations: annotations,
		},
		Spec: clusterv1.MachineSetSpec{
			ClusterName:     md.Spec.ClusterName,
			Replicas:        &replicas,
			MinReadySeconds: md.Spec.MinReadySeconds,
			DeletePolicy:    md.Spec.DeletePolicy,
			Selector:        *sel,
			Template:        *tmpl,
		},
	}
	if err := controllerutil.SetControllerReference(md, ms, r.client.Scheme()); err != nil {
		return nil, fmt.Errorf("setting owner of a new machineset: %w", err)
	}
	if err := r.client.Create(ctx, ms); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// Made by an earlier pass (perhaps of a process since killed)
			// that this cache has not seen yet: the set's own event brings
			// the deployment back to scale it. Never a second set.
			ctrl.LoggerFrom(ctx).V(1).Info("Machineset exists but is not in the cache yet", "machineset", klog.KObj(ms))
			return nil, nil
		}
		return nil, fmt.Errorf("creating machineset for revision %d of machinedeployment %s: %w", rev, klog.KObj(md), err)
	}
	ctrl.LoggerFrom(ctx).Info("Created machineset", "machineset", klog.KObj(ms), "revision", rev, "replicas", replicas)
	return ms, nil
}

// updateSet writes what the deployment decides about one of its sets:
// replicas, revision, whether it may only shrink (an old set of an OnDelete
// deployment), and the settings it passes on. Nothing when nothing changed.
func (r *Reconciler) updateSet(ctx context.Context, s *scope, ms *clusterv1.MachineSet, replicas int32, rev int64, scaleDownOnly bool) error {
	md := s.md
	before := ms.DeepCopy()
	ms.Spec.Replicas = &replicas
	ms.Spec.MinReadySeconds = md.Spec.MinReadySeconds
	ms.Spec.DeletePolicy = md.Spec.DeletePolicy
	if ms.Annotations == nil {
		ms.Annotations = map[string]string{}
	}
	if rev != revision(ms) {
		ms.Annotations[clusterv1.RevisionAnnotation] = strconv.FormatInt(rev, 10)
	}
	ms.Annotations[clusterv1.UpstreamRevisionAnnotation] = ms.Annotations[clusterv1.RevisionAnnotation]
	// The replicas written are those of this spec.replicas (see Scale).
	ms.Annotations[clusterv1.DesiredReplicasAnnotation] = strconv.FormatInt(int64(ptrOr(md.Spec.Replicas, 1)), 10)
	if scaleDownOnly {
		ms.Annotations[machineset.ScaleDownOnlyAnnotation] = "true"
	} else {
		delete(ms.Annotations, machineset.ScaleDownOnlyAnnotation)
	}
	if ptrOr(before.Spec.Replicas, 1) == replicas && before.Spec.MinReadySeconds == ms.Spec.MinReadySeconds &&
		before.Spec.DeletePolicy == ms.Spec.DeletePolicy && maps.Equal(before.Annotations, ms.Annotations) {
		return nil
	}
	if err := r.client.Patch(ctx, ms, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("scaling machineset %s to %d: %w", klog.KObj(ms), replicas, err)
	}
	if ptrOr(before.Spec.Replicas, 1) != replicas {
		s.acted = true
		ctrl.LoggerFrom(ctx).Info("Scaled machineset", "machineset", klog.KObj(ms), "from", ptrOr(before.Spec.Replicas, 1), "to", replicas)
	}
	return nil
}

// cleanupHistory deletes the oldest scaled-down sets beyond
// revisionHistoryLimit. A set with machines left is never deleted.
func (r *Reconciler) cleanupHistory(ctx context.Context, s *scope) error {
	limit := int(ptrOr(s.md.Spec.RevisionHistoryLimit, 1))
	var idle []*clusterv1.MachineSet
	for _, ms := range s.sets {
		if ms != s.newSet && ptrOr(ms.Spec.Replicas, 1) == 0 && len(s.machines[ms.UID]) == 0 && ms.DeletionTimestamp.IsZero() {
			idle = append(idle, ms)
		}
	}
	for _, ms := range idle[:max(len(idle)-limit, 0)] {
		uid := ms.UID
		if err := r.client.Delete(ctx, ms, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting old machineset %s: %w", klog.KObj(ms), err)
		}
		ctrl.LoggerFrom(ctx).Info("Deleted machineset beyond revisionHistoryLimit", "machineset", klog.KObj(ms), "revision", revision(ms))
	}
	return nil
}

// capacity derives the scale-from-zero annotations from the template's
// class; nil when the template names none or the class is missing.
func (r *Reconciler) capacity(ctx context.Context, md *clusterv1.MachineDeployment) (map[string]string, error) {
	ref := md.Spec.Template.Spec.ClassRef
	if ref == nil {
		return nil, nil
	}
	mc := &clusterv1.MachineClass{}
	if err := r.client.Get(ctx, types.NamespacedName{Name: ref.Name}, mc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading MachineClass %q: %w", ref.Name, err)
	}
	derived, ok, err := autoscaling.Capacity(mc, &md.Spec.Template.Spec)
	if err != nil || !ok {
		return nil, nil // the machines report a template that does not fit its class
	}
	return derived, nil
}

// syncMetadata keeps the deployment's revision and capacity annotations
// current, in one patch.
func (r *Reconciler) syncMetadata(ctx context.Context, s *scope) error {
	md := s.md
	before := md.DeepCopy()
	annotations := maps.Clone(md.Annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	if s.newSet != nil {
		annotations[clusterv1.RevisionAnnotation] = s.newSet.Annotations[clusterv1.RevisionAnnotation]
		annotations[clusterv1.UpstreamRevisionAnnotation] = s.newSet.Annotations[clusterv1.RevisionAnnotation]
	}
	derived, err := r.capacity(ctx, md)
	if err != nil {
		return err
	}
	if derived != nil {
		annotations, _ = autoscaling.Apply(annotations, derived)
	}
	if maps.Equal(annotations, before.Annotations) {
		return nil
	}
	md.Annotations = annotations
	if err := r.client.Patch(ctx, md, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("writing annotations of machinedeployment %s: %w", klog.KObj(md), err)
	}
	return nil
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

package move

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// ErrStopped is returned when Options.StopAfterWrites ends a move early,
// as a kill would.
var ErrStopped = errors.New("move stopped after the requested number of writes")

// Options configure a move.
type Options struct {
	// Source and Target are the two management planes.
	Source, Target client.Client
	// Namespace whose clusters move.
	Namespace string
	// Out receives a line per step.
	Out io.Writer
	// Timeout bounds each wait for the controllers of either plane (the
	// source's to stop, the target's to take over); 5 minutes when zero.
	Timeout time.Duration
	// StopAfterWrites, when positive, ends the move with ErrStopped after
	// that many writes to either plane: how tests kill it at each point.
	StopAfterWrites int
	// SkipControllerWaits skips the waits for controllers, for tests of
	// the API traffic alone where no controller runs.
	SkipControllerWaits bool
	// Providers say, per providerSpec kind, which objects a provider's
	// spec names and whether its machines may move at all.
	Providers Providers

	// afterList, in tests, runs after the first list of the source: what a
	// controller does before the pause reaches it.
	afterList func()
}

// settleRounds bounds how often a move lists the source again for objects
// made before its pause reached their makers.
const settleRounds = 5

var (
	nsKinds = []schema.GroupVersionKind{
		clusterv1.GroupVersion.WithKind("Cluster"),
		clusterv1.GroupVersion.WithKind("MachineDeployment"),
		clusterv1.GroupVersion.WithKind("MachineSet"),
		clusterv1.GroupVersion.WithKind("Machine"),
		clusterv1.GroupVersion.WithKind("MachineHealthCheck"),
		{Version: "v1", Kind: "Secret"},
		{Version: "v1", Kind: "ConfigMap"},
	}
	classKind = clusterv1.GroupVersion.WithKind("MachineClass")
)

type mover struct {
	Options
	writes int
}

// Run moves every marina object of Options.Namespace from Source to
// Target. Run again after any failure or kill, it finishes what was begun.
func Run(ctx context.Context, opts Options) error {
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Minute
	}
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	m := &mover{Options: opts}
	// The plan first: what cannot move is refused without the target.
	plan, err := m.plan(ctx)
	if err != nil {
		return err
	}
	if err := m.checkTarget(ctx); err != nil {
		return err
	}
	if m.afterList != nil {
		m.afterList()
	}
	if _, err := m.findCopies(ctx, plan); err != nil {
		return err
	}
	if err := m.pauseSource(ctx, plan); err != nil {
		return err
	}
	plan, existing, err := m.settle(ctx, plan)
	if err != nil {
		return err
	}
	if err := m.create(ctx, plan, existing); err != nil {
		return err
	}
	if err := m.unpauseTarget(ctx); err != nil {
		return err
	}
	if err := m.allCopied(ctx, plan); err != nil {
		return err
	}
	if err := m.deleteSource(ctx, plan); err != nil {
		return err
	}
	fmt.Fprintf(m.Out, "Moved %d objects of namespace %s\n", len(plan.Items), m.Namespace)
	return nil
}

// plan lists the source and plans the move of what it holds.
func (m *mover) plan(ctx context.Context) (*Plan, error) {
	objs, err := m.list(ctx, m.Source)
	if err != nil {
		return nil, fmt.Errorf("listing the source's objects: %w", err)
	}
	return BuildPlan(objs, m.Providers)
}

// settle lists the source again once its controllers stopped: a Machine a
// MachineSet made between the first list and the pause is in no plan, and
// left behind unpaused it would be provisioned on the source while the
// target makes a replacement, then deleted there with a real drain once
// its owners are gone. What is new is paused in turn, until a list finds
// nothing new.
func (m *mover) settle(ctx context.Context, plan *Plan) (*Plan, map[types.UID]*unstructured.Unstructured, error) {
	for range settleRounds {
		again, err := m.plan(ctx)
		if err != nil {
			return nil, nil, err
		}
		existing, err := m.findCopies(ctx, again)
		if err != nil {
			return nil, nil, err
		}
		added := newIn(again, plan)
		if len(added) == 0 {
			return again, existing, nil
		}
		fmt.Fprintf(m.Out, "Found %d objects made before the pause: %s\n", len(added), strings.Join(added, ", "))
		if err := m.pauseSource(ctx, again); err != nil {
			return nil, nil, err
		}
		plan = again
	}
	return nil, nil, fmt.Errorf("objects kept appearing on the source after %d lists: is something other than marina's controllers creating them in namespace %s?", settleRounds, m.Namespace)
}

// newIn names the objects of plan that were not in before.
func newIn(plan, before *Plan) []string {
	had := map[types.UID]bool{}
	for _, it := range before.Items {
		had[it.Object.GetUID()] = true
	}
	var out []string
	for _, it := range plan.Items {
		if !had[it.Object.GetUID()] {
			out = append(out, Key(it.Object))
		}
	}
	return out
}

// allCopied refuses to delete the source while it holds a marina object
// the plan did not copy: deleting the owners would leave it to garbage
// collection, a real deletion on the source.
func (m *mover) allCopied(ctx context.Context, plan *Plan) error {
	objs, err := m.list(ctx, m.Source)
	if err != nil {
		return fmt.Errorf("listing the source's objects: %w", err)
	}
	copied := map[types.UID]bool{}
	for _, it := range plan.Items {
		copied[it.Object.GetUID()] = true
	}
	var left []string
	for _, o := range objs {
		if IsMarinaKind(o.GetKind()) && !copied[o.GetUID()] {
			left = append(left, Key(o))
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("the source holds objects made after the pause that were not copied: %s; nothing was deleted from the source: run marina move again", strings.Join(left, ", "))
	}
	return nil
}

// write counts a write to either plane, for StopAfterWrites.
func (m *mover) write(f func() error) error {
	if m.StopAfterWrites > 0 && m.writes >= m.StopAfterWrites {
		return ErrStopped
	}
	m.writes++
	return f()
}

func (m *mover) checkTarget(ctx context.Context) error {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(clusterv1.GroupVersion.WithKind("ClusterList"))
	err := m.Target.List(ctx, list, client.InNamespace(m.Namespace), client.Limit(1))
	if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
		return fmt.Errorf("the target has no marina CRDs: run marina init there first (marina init --kubeconfig PATH): %w", err)
	}
	if err != nil {
		return fmt.Errorf("reaching the target: %w", err)
	}
	return nil
}

// list reads the namespace's objects of every kind that may move, and the
// MachineClasses.
func (m *mover) list(ctx context.Context, c client.Client) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, gvk := range append(slices.Clone(nsKinds), classKind) {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		var opts []client.ListOption
		if gvk != classKind {
			opts = append(opts, client.InNamespace(m.Namespace))
		}
		if err := c.List(ctx, list, opts...); err != nil {
			return nil, fmt.Errorf("listing %ss: %w", gvk.Kind, err)
		}
		for i := range list.Items {
			o := &list.Items[i]
			o.SetGroupVersionKind(gvk)
			out = append(out, o)
		}
	}
	return out, nil
}

// get reads the object named like o on c; nil when there is none.
func get(ctx context.Context, c client.Client, o *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(o.GroupVersionKind())
	err := c.Get(ctx, client.ObjectKeyFromObject(o), got)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", Key(o), err)
	}
	return got, nil
}

// findCopies finds, by name, what an earlier run created on the target,
// and refuses a name the target holds for something else.
func (m *mover) findCopies(ctx context.Context, plan *Plan) (map[types.UID]*unstructured.Unstructured, error) {
	existing := map[types.UID]*unstructured.Unstructured{}
	var conflicts []string
	for _, it := range plan.Items {
		src := it.Object
		got, err := get(ctx, m.Target, src)
		if err != nil || got == nil {
			if err != nil {
				return nil, err
			}
			continue
		}
		switch {
		case got.GetAnnotations()[clusterv1.MovedFromAnnotation] == string(src.GetUID()):
			existing[src.GetUID()] = got
		case src.GetKind() == "MachineClass" && equality.Semantic.DeepEqual(got.Object["spec"], src.Object["spec"]):
			existing[src.GetUID()] = got // the same class, made on both
		default:
			conflicts = append(conflicts, Key(src))
		}
	}
	if len(conflicts) > 0 {
		return nil, fmt.Errorf("the target already has objects of these names that this move did not make: %s; rename or delete them there, then move again",
			strings.Join(conflicts, ", "))
	}
	return existing, nil
}

// pauseSource puts the paused annotation on each marina object of the
// source and waits until each controller shows (a Paused condition) that it
// stopped acting on it.
func (m *mover) pauseSource(ctx context.Context, plan *Plan) error {
	var paused []*unstructured.Unstructured
	for _, it := range plan.Items {
		o := it.Object
		if !IsMarinaKind(o.GetKind()) {
			continue
		}
		paused = append(paused, o)
		if _, ok := o.GetAnnotations()[clusterv1.PausedAnnotation]; ok {
			continue
		}
		patch := []byte(`{"metadata":{"annotations":{"` + clusterv1.PausedAnnotation + `":"` + PausedValue + `"}}}`)
		if err := m.write(func() error { return m.Source.Patch(ctx, o, client.RawPatch(types.MergePatchType, patch)) }); err != nil {
			return fmt.Errorf("pausing %s on the source: %w", Key(o), err)
		}
	}
	fmt.Fprintf(m.Out, "Paused %d objects on the source\n", len(paused))
	if m.SkipControllerWaits {
		return nil
	}
	return m.waitFor(ctx, m.Source, paused, "the source's controllers to stop acting on", stoppedActing)
}

// stoppedActing: the controller wrote the Paused condition True. Objects
// being deleted by an earlier run are no longer looked at.
func stoppedActing(o *unstructured.Unstructured) bool {
	return o.GetDeletionTimestamp() != nil || condition(o, clusterv1.PausedCondition) == string(metav1.ConditionTrue)
}

// tookOver: the target's controller looked at the unpaused copy: its
// Paused condition is no longer True, and its status says it saw this
// generation.
func tookOver(o *unstructured.Unstructured) bool {
	if condition(o, clusterv1.PausedCondition) == string(metav1.ConditionTrue) {
		return false
	}
	seen, _, _ := unstructured.NestedInt64(o.Object, "status", "observedGeneration")
	return seen == o.GetGeneration()
}

func condition(o *unstructured.Unstructured, t string) string {
	conds, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == t {
			s, _ := m["status"].(string)
			return s
		}
	}
	return ""
}

// waitFor polls the objects on c until ok holds for each (or it is gone).
func (m *mover) waitFor(ctx context.Context, c client.Client, objs []*unstructured.Unstructured, what string, ok func(*unstructured.Unstructured) bool) error {
	var waiting []string
	err := wait.PollUntilContextTimeout(ctx, time.Second, m.Timeout, true, func(ctx context.Context) (bool, error) {
		waiting = waiting[:0]
		for _, o := range objs {
			got, err := get(ctx, c, o)
			if err != nil {
				return false, err
			}
			if got != nil && !ok(got) {
				waiting = append(waiting, Key(o))
			}
		}
		return len(waiting) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s %s: %w (is marina's controller running there?)", what, strings.Join(waiting, ", "), err)
	}
	return nil
}

// create makes the copies on the target in order, paused, and copies
// their status while they are.
func (m *mover) create(ctx context.Context, plan *Plan, existing map[types.UID]*unstructured.Unstructured) error {
	uids := map[types.UID]types.UID{}
	made := 0
	for _, it := range plan.Items {
		src := it.Object
		if _, dropped := RebuildOwners(src.GetOwnerReferences(), uids); len(dropped) > 0 && it.Delete {
			fmt.Fprintf(m.Out, "%s: owner references to objects that do not move are dropped: %v\n", Key(src), ownerNames(dropped))
		}
		tgt := existing[src.GetUID()]
		if tgt == nil {
			c := TargetCopy(src, uids)
			if err := m.write(func() error { return m.Target.Create(ctx, c) }); err != nil {
				return fmt.Errorf("creating %s on the target: %w", Key(src), err)
			}
			tgt, made = c, made+1
		}
		uids[src.GetUID()] = tgt.GetUID()
		if err := m.copyStatus(ctx, src, tgt); err != nil {
			return err
		}
	}
	fmt.Fprintf(m.Out, "Created %d objects on the target (%d there already)\n", made, len(plan.Items)-made)
	return nil
}

// copyStatus writes src's status on its paused copy tgt, unless it holds
// it already; an unpaused copy's status is its controller's.
func (m *mover) copyStatus(ctx context.Context, src, tgt *unstructured.Unstructured) error {
	st, ok := TargetStatus(src)
	if !ok || tgt.GetAnnotations()[clusterv1.PausedAnnotation] != PausedValue {
		return nil
	}
	have, _, _ := unstructured.NestedMap(tgt.Object, "status")
	delete(have, "observedGeneration")
	if equality.Semantic.DeepEqual(have, st) {
		return nil
	}
	// A merge patch, not an update: the target's controller writes the
	// paused copy's Paused condition meanwhile, and the source's status
	// (paused too) is what the copy should say.
	patch, err := json.Marshal(map[string]any{"status": st})
	if err != nil {
		return err
	}
	if err := m.write(func() error { return m.Target.Status().Patch(ctx, tgt, client.RawPatch(types.MergePatchType, patch)) }); err != nil {
		return fmt.Errorf("copying the status of %s to the target: %w", Key(src), err)
	}
	return nil
}

// unpauseTarget takes the move's paused annotation off every copy on the
// target and waits until its controllers took them over.
func (m *mover) unpauseTarget(ctx context.Context) error {
	objs, err := m.list(ctx, m.Target)
	if err != nil {
		return fmt.Errorf("listing the target's objects: %w", err)
	}
	var moved []*unstructured.Unstructured
	for _, o := range objs {
		if !IsMarinaKind(o.GetKind()) || o.GetAnnotations()[clusterv1.MovedFromAnnotation] == "" {
			continue
		}
		moved = append(moved, o)
		if o.GetAnnotations()[clusterv1.PausedAnnotation] != PausedValue {
			continue
		}
		patch := []byte(`{"metadata":{"annotations":{"` + clusterv1.PausedAnnotation + `":null}}}`)
		if err := m.write(func() error { return m.Target.Patch(ctx, o, client.RawPatch(types.MergePatchType, patch)) }); err != nil {
			return fmt.Errorf("unpausing %s on the target: %w", Key(o), err)
		}
	}
	fmt.Fprintf(m.Out, "Unpaused %d objects on the target\n", len(moved))
	if m.SkipControllerWaits {
		return nil
	}
	return m.waitFor(ctx, m.Target, moved, "the target's controllers to take over", tookOver)
}

// deleteSource deletes the source's objects, what they own first, and
// takes marina's finalizers off them: paused, no controller runs their
// deletion, so no machine, Node, etcd member or endpoint goes with them.
func (m *mover) deleteSource(ctx context.Context, plan *Plan) error {
	n := 0
	for i := len(plan.Items) - 1; i >= 0; i-- {
		it := plan.Items[i]
		if !it.Delete {
			continue
		}
		o, err := get(ctx, m.Source, it.Object)
		if err != nil {
			return err
		}
		if o == nil || o.GetUID() != it.Object.GetUID() {
			continue
		}
		if o.GetDeletionTimestamp() == nil {
			if err := m.write(func() error {
				return client.IgnoreNotFound(m.Source.Delete(ctx, o, client.Preconditions{UID: ptr(o.GetUID())}))
			}); err != nil {
				return fmt.Errorf("deleting %s from the source: %w", Key(o), err)
			}
		}
		kept := slices.DeleteFunc(slices.Clone(o.GetFinalizers()), func(f string) bool { return strings.Contains(f, clusterv1.GroupName) })
		if len(kept) != len(o.GetFinalizers()) {
			patch := client.MergeFrom(o.DeepCopy())
			o.SetFinalizers(kept)
			if err := m.write(func() error { return client.IgnoreNotFound(m.Source.Patch(ctx, o, patch)) }); err != nil {
				return fmt.Errorf("removing marina's finalizers from %s on the source: %w", Key(o), err)
			}
		}
		n++
	}
	fmt.Fprintf(m.Out, "Deleted %d objects from the source\n", n)
	return nil
}

func ownerNames(refs []metav1.OwnerReference) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.Kind+" "+r.Name)
	}
	return out
}

func ptr[T any](v T) *T { return &v }

package machineset

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/controller/index"
)

// Options configure the controller.
type Options struct {
	// MaxConcurrentReconciles bounds parallel reconciles (of different sets).
	MaxConcurrentReconciles int
	// StatusInterval spaces out status writes that only move counts (see
	// Throttle); 0 means one second, a negative value writes every change
	// at once.
	StatusInterval time.Duration
	// crashAt, in tests only, aborts a reconcile at a named step, as if the
	// process had been killed there.
	crashAt func(step string) bool
	// cacheLag, in tests only, stands between the controller and its
	// cache, to show a cache that lags behind the API server.
	cacheLag func(client.Client) client.Client
}

// Reconciler reconciles MachineSets.
type Reconciler struct {
	client client.Client
	// live reads from the API server, bypassing the cache (see doc.go).
	live     client.Reader
	recorder recorder.EventRecorder
	opts     Options
	now      func() time.Time
	// statusThrottle spaces out status writes that only move counts.
	statusThrottle *Throttle
	// writes are the machine writes the cache may not show yet.
	writes writes
	// liveLists counts the passes that read from the API server.
	liveLists atomic.Int64
}

// errCrash is what a test crash hook returns.
var errCrash = errors.New("simulated crash")

// What the MachineSet controller may do in the management plane (config/rbac).
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machinesets,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machinesets/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machines,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machineclasses;clusters,verbs=get;list;watch

// SetupWithManager builds the controller and its watches.
func SetupWithManager(mgr ctrl.Manager, opts Options) (*Reconciler, error) {
	r := &Reconciler{
		client:         mgr.GetClient(),
		live:           mgr.GetAPIReader(),
		recorder:       mgr.GetEventRecorder("machineset-controller"),
		opts:           opts,
		now:            time.Now,
		statusThrottle: NewThrottle(opts.StatusInterval),
	}
	if opts.cacheLag != nil {
		r.client = opts.cacheLag(r.client)
	}
	if err := index.AddMachineCluster(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return nil, err
	}
	err := ctrl.NewControllerManagedBy(mgr).
		For(&clusterv1.MachineSet{}).
		Named("machineset").
		WithOptions(controller.Options{MaxConcurrentReconciles: max(opts.MaxConcurrentReconciles, 1)}).
		Owns(&clusterv1.Machine{}).
		// Orphans that match a set's selector are adopted.
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.setsForOrphan)).
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(r.setsForCluster)).
		Watches(&clusterv1.MachineClass{}, handler.EnqueueRequestsFromMapFunc(r.setsForClass)).
		Complete(r)
	if err != nil {
		return nil, fmt.Errorf("building machineset controller: %w", err)
	}
	return r, nil
}

// Reconcile makes one set's machines match its spec.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	ms := &clusterv1.MachineSet{}
	if err := r.client.Get(ctx, req.NamespacedName, ms); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !ms.DeletionTimestamp.IsZero() {
		r.writes.forget(ms.UID)
		// The garbage collector deletes the machines through their owner
		// references; each goes through its own drain.
		return ctrl.Result{}, nil
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("machineset", klog.KObj(ms)))
	before := ms.DeepCopy()
	s := &scope{ms: ms, now: r.now()}
	defer func() {
		if errors.Is(retErr, errCrash) {
			return
		}
		if err := r.patchStatus(ctx, before, s); err != nil {
			retErr = errors.Join(retErr, err)
		}
		// The status says when to look again (minReadySeconds, the
		// progress deadline); errors retry with backoff instead.
		if retErr == nil && s.requeueAfter > 0 {
			res.RequeueAfter = s.requeueAfter
		}
	}()

	if err := r.checkBlocked(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.readMachines(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.syncAnnotations(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if s.blockedReason != "" {
		return ctrl.Result{}, nil
	}
	if err := r.syncReplicas(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// scope is what one pass learns about a set.
type scope struct {
	ms  *clusterv1.MachineSet
	now time.Time
	// machines the set owns, those being deleted included.
	machines []*clusterv1.Machine
	// read is true once machines were listed; before, no status is written.
	read bool
	// overlaps names the other sets controlling machines this set's
	// selector matches.
	overlaps []string
	// blocked says why the set may not create or delete machines now, as a
	// condition reason and message; empty when it may.
	blockedReason, blockedMessage string
	// createErr is the last machine creation's error, for the conditions.
	createErr error
	// requeueAfter is when to look again: the next Ready machine becoming
	// available (minReadySeconds), or a status write held back; 0 for never.
	requeueAfter time.Duration
}

func (s *scope) requeueIn(d time.Duration) {
	if d > 0 && (s.requeueAfter == 0 || d < s.requeueAfter) {
		s.requeueAfter = d
	}
}

// patchStatus computes and writes the status once, and only when it changed.
func (r *Reconciler) patchStatus(ctx context.Context, before *clusterv1.MachineSet, s *scope) error {
	if !s.read {
		return nil // nothing was observed: keep the last status
	}
	setStatus(s)
	if equality.Semantic.DeepEqual(before.Status, s.ms.Status) {
		return nil
	}
	// Only the first status is written at once: a set's status is for
	// people and autoscalers, and a deployment scaling its set in steps
	// would otherwise cost a status write per step (each is a new
	// generation).
	if before.Status.ObservedGeneration != 0 {
		if wait := r.statusThrottle.Wait(s.ms.UID, s.now); wait > 0 {
			s.requeueIn(wait)
			return nil
		}
	}
	if err := r.client.Status().Patch(ctx, s.ms, client.MergeFrom(before)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("writing status of machineset %s: %w", klog.KObj(s.ms), err)
	}
	r.statusThrottle.Wrote(s.ms.UID, s.now)
	return nil
}

func (r *Reconciler) crashed(step string) bool {
	return r.opts.crashAt != nil && r.opts.crashAt(step)
}

func (r *Reconciler) setsForOrphan(ctx context.Context, o client.Object) []reconcile.Request {
	if metav1.GetControllerOf(o) != nil {
		return nil // its owner is queued by Owns
	}
	m := o.(*clusterv1.Machine)
	list := &clusterv1.MachineSetList{}
	if err := r.client.List(ctx, list, client.InNamespace(m.Namespace)); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing machinesets for an orphan machine", "machine", klog.KObj(m))
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		if matches(&list.Items[i], m) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return out
}

func (r *Reconciler) setsForCluster(ctx context.Context, o client.Object) []reconcile.Request {
	return r.setsWhere(ctx, o.GetNamespace(), func(ms *clusterv1.MachineSet) bool { return ms.Spec.ClusterName == o.GetName() })
}

func (r *Reconciler) setsForClass(ctx context.Context, o client.Object) []reconcile.Request {
	return r.setsWhere(ctx, "", func(ms *clusterv1.MachineSet) bool {
		ref := ms.Spec.Template.Spec.ClassRef
		return ref != nil && ref.Name == o.GetName()
	})
}

func (r *Reconciler) setsWhere(ctx context.Context, ns string, pred func(*clusterv1.MachineSet) bool) []reconcile.Request {
	list := &clusterv1.MachineSetList{}
	if err := r.client.List(ctx, list, client.InNamespace(ns)); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing machinesets to enqueue")
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		if pred(&list.Items[i]) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return out
}

package machinedeployment

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/controller/index"
	"marina.dev/marina/internal/controller/machineset"
)

// Options configure the controller.
type Options struct {
	// MaxConcurrentReconciles bounds parallel reconciles (of different
	// deployments).
	MaxConcurrentReconciles int
	// StatusInterval spaces out status writes that only move counts (see
	// machineset.Throttle); 0 means one second, negative writes every change
	// at once.
	StatusInterval time.Duration
	// ScaleInterval is the least time between two scaling steps of one
	// deployment while its template is unchanged: machines that become ready
	// or go within it are acted on together. 0 means one second, negative
	// acts on every change at once.
	ScaleInterval time.Duration
	// crashAt, in tests only, aborts a reconcile at a named step, as if the
	// process had been killed there.
	crashAt func(step string) bool
}

// errCrash is what a test crash hook returns.
var errCrash = errors.New("simulated crash")

func (r *Reconciler) crashed(step string) bool {
	return r.opts.crashAt != nil && r.opts.crashAt(step)
}

// Reconciler reconciles MachineDeployments.
type Reconciler struct {
	client   client.Client
	recorder recorder.EventRecorder
	opts     Options
	now      func() time.Time
	// statusThrottle spaces out status writes that only move counts;
	// scaleThrottle spaces out scaling steps, so that a rollout of many
	// machines moves in batches rather than one machine per write.
	statusThrottle, scaleThrottle *machineset.Throttle
}

// What the MachineDeployment controller may do in the management plane (config/rbac).
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machinedeployments,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machinedeployments/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machinesets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machines;machineclasses;clusters,verbs=get;list;watch

// SetupWithManager builds the controller and its watches.
func SetupWithManager(mgr ctrl.Manager, opts Options) (*Reconciler, error) {
	r := &Reconciler{
		client:         mgr.GetClient(),
		recorder:       mgr.GetEventRecorder("machinedeployment-controller"),
		opts:           opts,
		now:            time.Now,
		statusThrottle: machineset.NewThrottle(opts.StatusInterval),
		scaleThrottle:  machineset.NewThrottle(opts.ScaleInterval),
	}
	if err := index.AddMachineCluster(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return nil, err
	}
	err := ctrl.NewControllerManagedBy(mgr).
		For(&clusterv1.MachineDeployment{}).
		Named("machinedeployment").
		WithOptions(controller.Options{MaxConcurrentReconciles: max(opts.MaxConcurrentReconciles, 1)}).
		Owns(&clusterv1.MachineSet{}).
		// The planner counts machines, so their readiness moves the rollout.
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.deploymentForMachine)).
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(r.deploymentsForCluster)).
		Watches(&clusterv1.MachineClass{}, handler.EnqueueRequestsFromMapFunc(r.deploymentsForClass)).
		Complete(r)
	if err != nil {
		return nil, fmt.Errorf("building machinedeployment controller: %w", err)
	}
	return r, nil
}

// Reconcile moves one deployment's machines towards its template.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	md := &clusterv1.MachineDeployment{}
	if err := r.client.Get(ctx, req.NamespacedName, md); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !md.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // the garbage collector removes its sets
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("machinedeployment", klog.KObj(md)))
	before := md.DeepCopy()
	s := &scope{md: md, now: r.now()}
	defer func() {
		if errors.Is(retErr, errCrash) {
			return // a killed process writes nothing more
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
	if err := r.readSets(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if s.blockedReason != "" {
		return ctrl.Result{}, nil
	}
	if done, err := r.rollback(ctx, s); done || err != nil {
		return ctrl.Result{}, err
	}
	// A changed spec is acted on at once; further steps of the same rollout
	// wait for the scale interval.
	if wait := r.scaleThrottle.Wait(md.UID, s.now); wait > 0 && md.Status.ObservedGeneration == md.Generation {
		s.requeueIn(wait)
		return ctrl.Result{}, nil
	}
	if err := r.syncSets(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if s.acted {
		r.scaleThrottle.Wrote(md.UID, s.now)
	}
	if err := r.cleanupHistory(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.syncMetadata(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// patchStatus computes and writes the status once, and only when it changed.
func (r *Reconciler) patchStatus(ctx context.Context, before *clusterv1.MachineDeployment, s *scope) error {
	if s.machines == nil {
		return nil // nothing was observed: keep the last status
	}
	setStatus(s)
	if equality.Semantic.DeepEqual(before.Status, s.md.Status) {
		return nil
	}
	if before.Status.ObservedGeneration == s.md.Status.ObservedGeneration {
		if wait := r.statusThrottle.Wait(s.md.UID, s.now); wait > 0 {
			s.requeueIn(wait)
			return nil
		}
	}
	if err := r.client.Status().Patch(ctx, s.md, client.MergeFrom(before)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("writing status of machinedeployment %s: %w", klog.KObj(s.md), err)
	}
	r.statusThrottle.Wrote(s.md.UID, s.now)
	return nil
}

// deploymentForMachine maps a machine to the deployment owning its set.
func (r *Reconciler) deploymentForMachine(ctx context.Context, o client.Object) []reconcile.Request {
	ref := metav1.GetControllerOf(o)
	if ref == nil || ref.Kind != "MachineSet" {
		return nil
	}
	ms := &clusterv1.MachineSet{}
	if err := r.client.Get(ctx, types.NamespacedName{Namespace: o.GetNamespace(), Name: ref.Name}, ms); err != nil {
		return nil
	}
	mdRef := metav1.GetControllerOf(ms)
	if mdRef == nil || mdRef.Kind != "MachineDeployment" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: mdRef.Name}}}
}

func (r *Reconciler) deploymentsForCluster(ctx context.Context, o client.Object) []reconcile.Request {
	return r.deploymentsWhere(ctx, o.GetNamespace(), func(md *clusterv1.MachineDeployment) bool { return md.Spec.ClusterName == o.GetName() })
}

func (r *Reconciler) deploymentsForClass(ctx context.Context, o client.Object) []reconcile.Request {
	return r.deploymentsWhere(ctx, "", func(md *clusterv1.MachineDeployment) bool {
		ref := md.Spec.Template.Spec.ClassRef
		return ref != nil && ref.Name == o.GetName()
	})
}

func (r *Reconciler) deploymentsWhere(ctx context.Context, ns string, pred func(*clusterv1.MachineDeployment) bool) []reconcile.Request {
	list := &clusterv1.MachineDeploymentList{}
	if err := r.client.List(ctx, list, client.InNamespace(ns)); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing machinedeployments to enqueue")
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

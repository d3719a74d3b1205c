package machinehealthcheck

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/health"
	"marina.dev/marina/internal/remote"
)

// Options configure the controller.
type Options struct {
	// MaxConcurrentReconciles bounds parallel reconciles (of different
	// health checks).
	MaxConcurrentReconciles int
	// DrainTimeout bounds the drain of a remediated machine whose Node is
	// Ready and whose spec sets no nodeDrainTimeout; 0 means 5 minutes.
	DrainTimeout time.Duration
	// UnreachableRetry is how soon a check whose workload cluster does not
	// answer looks again; 0 means 10 seconds.
	UnreachableRetry time.Duration
	// crashAt, in tests only, aborts a reconcile at a named step, as if the
	// process had been killed there.
	crashAt func(step string) bool
}

// Reconciler reconciles MachineHealthChecks.
type Reconciler struct {
	client   client.Client
	clusters *remote.Cache
	recorder recorder.EventRecorder
	opts     Options
	now      func() time.Time
	// nodeEvents carries Node changes from workload clusters to the queue.
	nodeEvents chan event.TypedGenericEvent[*clusterv1.MachineHealthCheck]
	// done ends blocked sends to nodeEvents when the manager stops.
	done <-chan struct{}
}

// errCrash is what a test crash hook returns.
var errCrash = errors.New("simulated crash")

// What the MachineHealthCheck controller may do in the management plane
// (config/rbac).
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machinehealthchecks,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machinehealthchecks/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machines,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machines/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=clusters,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch

// SetupWithManager builds the controller and its watches.
func SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts Options) (*Reconciler, error) {
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 5 * time.Minute
	}
	if opts.UnreachableRetry <= 0 {
		opts.UnreachableRetry = 10 * time.Second
	}
	r := &Reconciler{
		client:     mgr.GetClient(),
		recorder:   mgr.GetEventRecorder("machinehealthcheck-controller"),
		opts:       opts,
		now:        time.Now,
		nodeEvents: make(chan event.TypedGenericEvent[*clusterv1.MachineHealthCheck], 1024),
		done:       ctx.Done(),
	}
	// One Node informer per workload cluster. A cluster is probed often: a
	// Node cache that stopped updating must not be read as the truth for
	// long, in either direction.
	r.clusters = remote.NewCache(mgr.GetClient(), mgr.GetScheme(), remote.Options{
		SyncTimeout:    10 * time.Second,
		HealthInterval: 10 * time.Second,
		OnNodeEvent:    r.nodeChanged,
		Live:           mgr.GetAPIReader(),
	})
	if err := mgr.Add(stopOnExit{r.clusters}); err != nil {
		return nil, err
	}
	err := ctrl.NewControllerManagedBy(mgr).
		For(&clusterv1.MachineHealthCheck{}).
		Named("machinehealthcheck").
		WithOptions(controller.Options{MaxConcurrentReconciles: max(opts.MaxConcurrentReconciles, 1)}).
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.checksForMachine)).
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(r.checksForCluster)).
		WatchesRawSource(source.Channel(r.nodeEvents, &handler.TypedEnqueueRequestForObject[*clusterv1.MachineHealthCheck]{})).
		Complete(r)
	if err != nil {
		return nil, fmt.Errorf("building machinehealthcheck controller: %w", err)
	}
	return r, nil
}

// Reconcile judges one health check's machines and remediates what it may.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	mhc := &clusterv1.MachineHealthCheck{}
	if err := r.client.Get(ctx, req.NamespacedName, mhc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !mhc.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // it owns nothing to clean up
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("machinehealthcheck", klog.KObj(mhc)))
	before := mhc.DeepCopy()
	s := &scope{mhc: mhc, now: r.now()}
	defer func() {
		if errors.Is(retErr, errCrash) {
			return // a killed process writes nothing more
		}
		if err := r.patchStatus(ctx, before, s); err != nil {
			retErr = errors.Join(retErr, err)
		}
		if retErr == nil {
			res.RequeueAfter = s.requeueAfter
		}
	}()

	if err := r.checkBlocked(ctx, s); err != nil || s.blocked {
		return ctrl.Result{}, err
	}
	if err := r.readMachines(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.readNodes(ctx, s); err != nil || s.blocked {
		return ctrl.Result{}, err
	}
	r.decide(s)
	if err := r.mark(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, r.remediate(ctx, s)
}

// scope is what one pass learns about a health check.
type scope struct {
	mhc *clusterv1.MachineHealthCheck
	now time.Time
	// machines are the selected machines of the check's cluster, and facts
	// what was observed about each, in the same order.
	machines []*clusterv1.Machine
	facts    []health.Machine
	// plan is the decision; planErr is set when maxUnhealthy is unreadable.
	plan    health.Plan
	planErr error
	decided bool
	// records are the remediations to keep in status.recentRemediations:
	// the plan's, and those of this pass once recorded.
	records []health.Remediation
	// blocked is set when nothing may be remediated for a reason other than
	// the plan's; reason and message then say why, for RemediationAllowed.
	blocked         bool
	reason, message string
	// requeueAfter is when to look again; 0 for on the next change only.
	requeueAfter time.Duration
}

func (s *scope) block(reason, message string) { s.blocked, s.reason, s.message = true, reason, message }

// patchStatus computes and writes the status once, and only when it changed.
func (r *Reconciler) patchStatus(ctx context.Context, before *clusterv1.MachineHealthCheck, s *scope) error {
	if r.setStatus(ctx, before, s); equality.Semantic.DeepEqual(before.Status, s.mhc.Status) {
		return nil
	}
	if err := r.client.Status().Patch(ctx, s.mhc, client.MergeFrom(before)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("writing status of machinehealthcheck %s: %w", klog.KObj(s.mhc), err)
	}
	return nil
}

func (r *Reconciler) crashed(step string) bool {
	return r.opts.crashAt != nil && r.opts.crashAt(step)
}

// stopOnExit drops every workload cluster's informers when the manager stops.
type stopOnExit struct{ c *remote.Cache }

func (s stopOnExit) Start(ctx context.Context) error {
	<-ctx.Done()
	s.c.Stop()
	return nil
}

package machine

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/provider"
)

// Options configure the controller.
type Options struct {
	// Providers are the providers this controller dispatches to. It acts only
	// on machines whose providerSpec kind one of them owns (M2).
	Providers *provider.Registry
	// ReportUnowned makes this controller tell, in a condition, that no
	// provider owns a machine's kind. Exactly one controller per management
	// plane should do it (marina's own); provider processes leave it off.
	ReportUnowned bool
	// ExternalKinds are kinds owned by providers in other processes: the
	// reporting controller leaves their machines alone.
	ExternalKinds []schema.GroupVersionKind
	// MaxConcurrentReconciles bounds parallel reconciles.
	MaxConcurrentReconciles int
	// ControlPlaneBootstrap returns the control-plane document
	// (provider.Bootstrap.ControlPlane) of a machine with the ControlPlane
	// role. Nil: such machines are bootstrapped as workers, with a
	// bootstrap token of a cluster someone else made.
	ControlPlaneBootstrap func(ctx context.Context, m *clusterv1.Machine) ([]byte, error)
	// UnreachablePodGrace: while draining a Node that is not Ready, a pod
	// whose deletion is older than this is left behind; 0 means
	// drain.DefaultUnreachableGrace (5 minutes, as upstream Cluster API).
	UnreachablePodGrace time.Duration
	// crashAt, in tests only, aborts a reconcile at a named step, as if the
	// process had been killed there.
	crashAt func(step string) bool
	// clusterHealthInterval, in tests only, replaces how often a cached
	// workload cluster is probed (remote.Options.HealthInterval), so that
	// a test can hold a cluster that answered its last probe.
	clusterHealthInterval time.Duration
}

// Reconciler reconciles Machines.
type Reconciler struct {
	client client.Client
	// live reads from the API server, bypassing the cache.
	live     client.Reader
	clusters *remote.Cache
	recorder recorder.EventRecorder
	opts     Options
	// nodeEvents carries Node changes from workload clusters, and machines
	// a provider saw stop or start, to the queue.
	nodeEvents chan event.TypedGenericEvent[*clusterv1.Machine]
	// done ends blocked sends to nodeEvents when the manager stops.
	done <-chan struct{}
	// bootstrapRBAC: the clusters where TLS bootstrap is allowed.
	bootstrapRBAC identityCache
}

// Field indexes on Machines in the management cache.
const (
	classNameIndex  = "spec.classRef.name"
	providerIDIndex = "status.providerID"
	uidIndex        = "instanceKey"
	// bootstrapUserIndex is the user the machine's bootstrap token
	// authenticates as, which its certificate requests carry.
	bootstrapUserIndex = "bootstrapUser"
)

// errCrash is what a test crash hook returns.
var errCrash = errors.New("simulated crash")

// What the machine controller may do in the management plane (config/rbac).
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machines,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machines/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machineclasses;clusters,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get

// SetupWithManager builds the controller and its watches.
func SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts Options) (*Reconciler, error) {
	if opts.Providers == nil {
		opts.Providers, _ = provider.NewRegistry()
	}
	r := &Reconciler{
		client:     mgr.GetClient(),
		live:       mgr.GetAPIReader(),
		recorder:   mgr.GetEventRecorder("machine-controller"),
		opts:       opts,
		nodeEvents: make(chan event.TypedGenericEvent[*clusterv1.Machine], 1024),
		done:       ctx.Done(),
	}
	r.clusters = remote.NewCache(mgr.GetClient(), mgr.GetScheme(), remote.Options{
		SyncTimeout:    10 * time.Second,
		HealthInterval: opts.clusterHealthInterval,
		Live:           mgr.GetAPIReader(),
		OnNodeEvent:    r.nodeChanged,
		OnCSREvent:     r.csrChanged,
	})
	if err := indexMachines(ctx, mgr); err != nil {
		return nil, err
	}
	if err := mgr.Add(stopOnExit{r.clusters}); err != nil {
		return nil, err
	}
	for _, p := range opts.Providers.Providers() {
		if w, ok := p.(provider.StateWatcher); ok {
			if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
				w.WatchStates(ctx, r.instanceChanged)
				return nil
			})); err != nil {
				return nil, err
			}
		}
	}
	err := ctrl.NewControllerManagedBy(mgr).
		For(&clusterv1.Machine{}).
		Named("machine").
		WithOptions(controller.Options{MaxConcurrentReconciles: max(opts.MaxConcurrentReconciles, 1)}).
		Watches(&clusterv1.MachineClass{}, handler.EnqueueRequestsFromMapFunc(r.machinesForClass)).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.machinesForKubeconfig),
			builder.WithPredicates(predicate.ResourceVersionChangedPredicate{})).
		// A machine deleted while it waited for its cluster's kubeconfig
		// must learn when the Cluster goes: then there is no Node to drain.
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(r.machinesForCluster),
			builder.WithPredicates(clusterGoingPredicate)).
		WatchesRawSource(source.Channel(r.nodeEvents, &handler.TypedEnqueueRequestForObject[*clusterv1.Machine]{})).
		Complete(r)
	if err != nil {
		return nil, fmt.Errorf("building machine controller: %w", err)
	}
	return r, nil
}

// Reconcile makes one machine's world match its spec.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	m := &clusterv1.Machine{}
	if err := r.client.Get(ctx, req.NamespacedName, m); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !m.DeletionTimestamp.IsZero() {
		// A machine being deleted is read again from the API server: its
		// Node's deletion, our own last step, often queues it again before
		// the cache has seen the finalizer go, and a pass over that stale
		// copy would repeat the provider delete, its event and the
		// finalizer patch (a benchmark counted 0.6 extra writes per
		// machine). A read is cheaper than those writes.
		if err := r.live.Get(ctx, req.NamespacedName, m); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
		if !machineFinalizer.Held(m) {
			return ctrl.Result{}, nil
		}
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("machine", klog.KObj(m)))

	kind, kindErr := r.kindOf(ctx, m)
	prov := r.opts.Providers.For(kind)
	if prov == nil {
		return r.reconcileUnowned(ctx, m, kind, kindErr)
	}

	before := m.DeepCopy()
	defer func() {
		if errors.Is(retErr, errCrash) {
			return // a killed process writes nothing more
		}
		if err := r.patchStatus(ctx, before, m); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()
	if why, err := r.pausedBy(ctx, m); err != nil || why != "" {
		// Nothing is done, not even a deletion: marina move hands paused
		// machines to another management plane, and removes them here
		// without their machines being deleted.
		return ctrl.Result{}, err
	}
	if !m.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, m, prov)
	}
	if err := r.ensureMetadata(ctx, m, kind); err != nil {
		return ctrl.Result{}, err
	}
	if r.crashed("after-metadata") {
		return ctrl.Result{}, errCrash
	}
	return r.reconcileNormal(ctx, before, m, prov)
}

// patchStatus writes the status when it changed since before, and then
// makes before's status m's, so that a later call writes only what changed
// after this one (the deferred write of a pass that reported a stopped
// machine before starting it).
func (r *Reconciler) patchStatus(ctx context.Context, before, m *clusterv1.Machine) error {
	m.Status.Phase = phaseOf(m)
	m.Status.ObservedGeneration = m.Generation
	if equality.Semantic.DeepEqual(before.Status, m.Status) || (!m.DeletionTimestamp.IsZero() && len(m.Finalizers) == 0) {
		return nil
	}
	if err := r.client.Status().Patch(ctx, m, client.MergeFrom(before)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil // the finalizer is gone and the machine with it
		}
		return fmt.Errorf("writing status of machine %s: %w", klog.KObj(m), err)
	}
	m.Status.DeepCopyInto(&before.Status)
	return nil
}

func (r *Reconciler) crashed(step string) bool {
	return r.opts.crashAt != nil && r.opts.crashAt(step)
}

// pausedBy says why m is paused (its paused annotation, or its Cluster's
// spec.paused or annotation), and sets its Paused condition; "" when it is
// not. The condition, written at the machine's generation, is how marina move
// sees that this controller stopped acting on the machine.
func (r *Reconciler) pausedBy(ctx context.Context, m *clusterv1.Machine) (string, error) {
	why := ""
	if _, ok := m.Annotations[clusterv1.PausedAnnotation]; ok {
		why = "the machine has the " + clusterv1.PausedAnnotation + " annotation: marina changes nothing of it until it is removed"
	} else {
		cluster := &clusterv1.Cluster{}
		err := r.client.Get(ctx, clusterKey(m), cluster)
		if err != nil && !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("reading cluster %s: %w", m.Spec.ClusterName, err)
		}
		_, annotated := cluster.Annotations[clusterv1.PausedAnnotation]
		if err == nil && (cluster.Spec.Paused || annotated) {
			why = "its cluster " + cluster.Name + " is paused: marina changes nothing of the machine until the cluster is unpaused"
		}
	}
	if why == "" {
		if meta.IsStatusConditionTrue(m.Status.Conditions, clusterv1.PausedCondition) {
			setCondition(m, clusterv1.PausedCondition, metav1.ConditionFalse, clusterv1.NotPausedReason, "")
		}
		return "", nil
	}
	setCondition(m, clusterv1.PausedCondition, metav1.ConditionTrue, clusterv1.PausedReason, why)
	return why, nil
}

func clusterKey(m *clusterv1.Machine) types.NamespacedName {
	return types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.ClusterName}
}

// stopOnExit drops every workload cluster's informers when the manager stops.
type stopOnExit struct{ c *remote.Cache }

func (s stopOnExit) Start(ctx context.Context) error {
	<-ctx.Done()
	s.c.Stop()
	return nil
}

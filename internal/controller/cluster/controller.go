// Package cluster is the Cluster controller: it turns a Cluster into a
// running control plane (M8): key material, the control-plane endpoint, the
// admin kubeconfig, and, through package controlplane, the control-plane
// machines; and it takes a deleted cluster apart in order (workers, control
// plane, endpoint) before letting it go.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
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
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/controller/controlplane"
	"marina.dev/marina/provider"
)

// Options configure the controller.
type Options struct {
	// Providers make the control-plane machines and, where they can, the
	// endpoint (provider.EndpointProvider).
	Providers *provider.Registry
	// Etcd reaches a cluster's etcd.
	Etcd controlplane.EtcdDialer
	// MaxConcurrentReconciles bounds parallel reconciles.
	MaxConcurrentReconciles int
}

// Reconciler reconciles Clusters.
type Reconciler struct {
	client client.Client
	// live reads Secrets a user names, uncached.
	live     client.Reader
	recorder recorder.EventRecorder
	opts     Options
	cp       *controlplane.ControlPlane
	now      func() time.Time
}

// Periods of looking again without an event: etcd health and certificate
// expiry produce none.
const (
	recheckReady   = 30 * time.Second
	recheckWaiting = 5 * time.Second
	// recheckInitializing: how often the endpoint is asked whether the
	// first API server answers.
	recheckInitializing = time.Second
)

// What the Cluster controller may do in the management plane (config/rbac).
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=clusters,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=clusters/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machines;machinesets;machinedeployments,verbs=get;list;watch;create;update;patch;delete;deletecollection
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machineclasses,verbs=get;list;watch
//
// Secrets: marina creates and renews its own (CAs, keys, kubeconfigs) and
// never patches or deletes one (a deleted Cluster's go with it, by owner
// reference). list and watch must be cluster-wide, since clusters live in
// any namespace, and RBAC cannot select by label: the manager's cache is
// what limits them to the Secrets marina labels (manager.CacheOptions).
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update

// SetupWithManager builds the controller and its watches. It returns the
// control plane, whose Bootstrap the machine controller needs.
func SetupWithManager(mgr ctrl.Manager, opts Options) (*Reconciler, error) {
	r := New(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder("cluster-controller"), opts)
	err := ctrl.NewControllerManagedBy(mgr).
		For(&clusterv1.Cluster{}).
		Named("cluster").
		WithOptions(controller.Options{MaxConcurrentReconciles: max(opts.MaxConcurrentReconciles, 1)}).
		// Every machine of a cluster, control plane or worker, matters: to
		// count ready replicas and to know when a deletion may go on.
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(clusterOfMachine)).
		Complete(r)
	if err != nil {
		return nil, fmt.Errorf("building cluster controller: %w", err)
	}
	return r, nil
}

// New returns a Reconciler (SetupWithManager registers it).
func New(c client.Client, live client.Reader, rec recorder.EventRecorder, opts Options) *Reconciler {
	return &Reconciler{
		client: c, live: live, recorder: rec, opts: opts, now: time.Now,
		cp: &controlplane.ControlPlane{Client: c, Live: live, Etcd: opts.Etcd, Recorder: rec, Started: time.Now()},
	}
}

// ControlPlaneBootstrap is the machine controller's hook for control-plane
// machines.
func (r *Reconciler) ControlPlaneBootstrap(ctx context.Context, m *clusterv1.Machine) ([]byte, error) {
	return r.cp.Bootstrap(ctx, m)
}

func clusterOfMachine(_ context.Context, o client.Object) []reconcile.Request {
	m, ok := o.(*clusterv1.Machine)
	if !ok || m.Spec.ClusterName == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.ClusterName}}}
}

// Reconcile makes one cluster real, or takes it apart.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	cluster := &clusterv1.Cluster{}
	if err := r.client.Get(ctx, req.NamespacedName, cluster); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if cluster.Annotations[clusterv1.ExternalControlPlaneAnnotation] == "true" {
		return ctrl.Result{}, nil // someone else runs it
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("cluster", klog.KObj(cluster)))
	before := cluster.DeepCopy()
	defer func() {
		if err := r.patchStatus(ctx, before, cluster); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()

	// A paused cluster is left alone even when it is deleted: marina move
	// deletes the copies it handed to another management plane that way,
	// their endpoint and machines running on.
	if paused(cluster) {
		setCondition(cluster, clusterv1.PausedCondition, metav1.ConditionTrue, clusterv1.ClusterPausedReason,
			"spec.paused or the "+clusterv1.PausedAnnotation+" annotation is set: marina changes nothing of this cluster until it is unset")
		return ctrl.Result{}, nil
	}
	if !cluster.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, cluster)
	}
	if err := r.ensureFinalizer(ctx, cluster); err != nil {
		return ctrl.Result{}, err
	}
	meta.RemoveStatusCondition(&cluster.Status.Conditions, clusterv1.PausedCondition)

	// A step that cannot go on says why in a condition and is looked at
	// again (what would fix it, a Secret or a class, is not watched).
	set, ok, err := r.certificates(ctx, cluster)
	if !ok {
		return waitOn(cluster, err)
	}
	prov, ok, err := r.provider(ctx, cluster)
	if !ok {
		return waitOn(cluster, err)
	}
	if ok, err := r.versionAvailable(cluster, prov); !ok {
		return waitOn(cluster, err)
	}
	if ok, err := r.endpoint(ctx, cluster, prov, set); !ok {
		return waitOn(cluster, err)
	}
	if err := r.kubeconfig(ctx, cluster, set); err != nil {
		return ctrl.Result{}, err
	}
	result, err := r.cp.Reconcile(ctx, cluster, set)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.endpointBackends(ctx, cluster, prov, set, result.Machines); err != nil {
		return ctrl.Result{}, err
	}
	switch {
	case result.RequeueAfter > 0:
		setReady(cluster)
		return ctrl.Result{RequeueAfter: result.RequeueAfter}, nil
	case setReady(cluster):
		return ctrl.Result{RequeueAfter: recheckReady}, nil
	case result.Step.RequeueAfter > 0:
		return ctrl.Result{RequeueAfter: result.Step.RequeueAfter}, nil
	case !meta.IsStatusConditionTrue(cluster.Status.Conditions, clusterv1.ClusterControlPlaneInitializedCondition):
		// Its first answer is awaited by every machine of the cluster.
		return ctrl.Result{RequeueAfter: recheckInitializing}, nil
	}
	return ctrl.Result{RequeueAfter: recheckWaiting}, nil
}

// waitOn ends a pass that could not go on: an error retries with backoff,
// a condition waits a while.
func waitOn(cluster *clusterv1.Cluster, err error) (ctrl.Result, error) {
	setReady(cluster)
	if err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: recheckWaiting}, nil
}

func paused(cluster *clusterv1.Cluster) bool {
	_, annotated := cluster.Annotations[clusterv1.PausedAnnotation]
	return cluster.Spec.Paused || annotated
}

func (r *Reconciler) ensureFinalizer(ctx context.Context, cluster *clusterv1.Cluster) error {
	if clusterFinalizer.Set(cluster) {
		return nil
	}
	patch := client.MergeFrom(cluster.DeepCopy())
	clusterFinalizer.Add(cluster)
	if err := r.client.Patch(ctx, cluster, patch); err != nil {
		return fmt.Errorf("adding the finalizer: %w", err)
	}
	return nil
}

// certificates loads or makes the cluster's key material (M15). A user CA
// that cannot be used stops everything, with a condition naming the problem.
func (r *Reconciler) certificates(ctx context.Context, cluster *clusterv1.Cluster) (*clusterpki.Set, bool, error) {
	set, err := clusterpki.Ensure(ctx, r.client, r.live, cluster, r.now())
	var invalid *clusterpki.InvalidCAError
	var lost *clusterpki.LostError
	switch {
	case errors.As(err, &invalid):
		setCondition(cluster, clusterv1.ClusterCertificatesAvailableCondition, metav1.ConditionFalse, clusterv1.ClusterCASecretInvalidReason, invalid.Error())
		cluster.Status.Phase = clusterv1.ClusterPhaseFailed
		// Fixing the Secret is an event we do not watch: look again.
		return nil, false, nil
	case errors.As(err, &lost):
		if !meta.IsStatusConditionPresentAndEqual(cluster.Status.Conditions, clusterv1.ClusterCertificatesAvailableCondition, metav1.ConditionFalse) {
			r.recorder.Eventf(cluster, nil, corev1.EventTypeWarning, clusterv1.ClusterCertificatesLostReason, "LoadCertificates", "%s", lost.Error())
		}
		setCondition(cluster, clusterv1.ClusterCertificatesAvailableCondition, metav1.ConditionFalse, clusterv1.ClusterCertificatesLostReason, lost.Error())
		cluster.Status.Phase = clusterv1.ClusterPhaseFailed
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("cluster certificates: %w", err)
	}
	if expires := set.CA.Cert.NotAfter; expires.Sub(r.now()) < clusterpki.CAExpiryWarning {
		setCondition(cluster, clusterv1.ClusterCertificatesAvailableCondition, metav1.ConditionTrue, clusterv1.ClusterCAExpiringSoonReason,
			fmt.Sprintf("the cluster CA expires on %s, and marina cannot rotate a CA in place yet: every machine trusts the certificate it was given, so create a new cluster and move the workloads to it before then",
				expires.UTC().Format(time.RFC3339)))
	} else {
		setCondition(cluster, clusterv1.ClusterCertificatesAvailableCondition, metav1.ConditionTrue, clusterv1.ClusterCertificatesAvailableReason, "")
	}
	if cluster.Status.Phase == clusterv1.ClusterPhaseFailed {
		cluster.Status.Phase = clusterv1.ClusterPhaseProvisioning // the CA was fixed
	}
	return set, true, nil
}

// patchStatus writes the status when it changed.
func (r *Reconciler) patchStatus(ctx context.Context, before, cluster *clusterv1.Cluster) error {
	cluster.Status.ObservedGeneration = cluster.Generation
	if cluster.Status.Phase == "" {
		cluster.Status.Phase = clusterv1.ClusterPhasePending
	}
	if equality.Semantic.DeepEqual(before.Status, cluster.Status) {
		return nil
	}
	if err := r.client.Status().Patch(ctx, cluster, client.MergeFrom(before)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("writing the status of cluster %s: %w", cluster.Name, err)
	}
	return nil
}

func setCondition(cluster *clusterv1.Cluster, t string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&cluster.Status.Conditions, metav1.Condition{
		Type: t, Status: status, Reason: reason, Message: msg, ObservedGeneration: cluster.Generation,
	})
}

package cluster

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/controller/controlplane"
	"marina.dev/marina/internal/controller/finalizer"
	"marina.dev/marina/internal/controller/index"
	"marina.dev/marina/provider"
)

// clusterFinalizer is the cluster controller's finalizer, under its name or
// its legacy one.
var clusterFinalizer = finalizer.Name{Current: clusterv1.ClusterFinalizer, Legacy: clusterv1.LegacyClusterFinalizer}

// reconcileDelete takes the cluster apart in order: its worker fleets and
// workers (drained while the control plane still answers), then its
// control-plane machines, then its endpoint; the Secrets it owns go with
// it (owner references). Each step is idempotent and waits for the one
// before, so a restart anywhere resumes it.
func (r *Reconciler) reconcileDelete(ctx context.Context, cluster *clusterv1.Cluster) (ctrl.Result, error) {
	if !clusterFinalizer.Held(cluster) {
		return ctrl.Result{}, nil
	}
	cluster.Status.Phase = clusterv1.ClusterPhaseDeleting
	workers, controlPlane, err := r.machinesOf(ctx, cluster)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.deleteFleets(ctx, cluster); err != nil {
		return ctrl.Result{}, err
	}
	if len(workers) > 0 {
		setCondition(cluster, clusterv1.ReadyCondition, metav1.ConditionFalse, "Deleting",
			fmt.Sprintf("deleting %d worker machines", len(workers)))
		return ctrl.Result{}, r.deleteAll(ctx, workers) // their deletions bring the cluster back
	}
	if len(controlPlane) > 0 {
		setCondition(cluster, clusterv1.ReadyCondition, metav1.ConditionFalse, "Deleting",
			fmt.Sprintf("deleting %d control-plane machines", len(controlPlane)))
		// The whole etcd goes: no member is removed first, no quorum is kept.
		for i := range controlPlane {
			if err := controlplane.RemoveHook(ctx, r.client, &controlPlane[i]); err != nil {
				return ctrl.Result{}, err
			}
		}
		return ctrl.Result{}, r.deleteAll(ctx, controlPlane)
	}
	if err := r.deleteEndpoint(ctx, cluster); err != nil {
		return ctrl.Result{}, err
	}
	patch := client.MergeFrom(cluster.DeepCopy())
	clusterFinalizer.Remove(cluster)
	if err := r.client.Patch(ctx, cluster, patch); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, fmt.Errorf("removing the finalizer: %w", err)
	}
	return ctrl.Result{}, nil
}

// machinesOf lists the cluster's machines by spec.clusterName, control
// plane apart. The list is live, not from the cache, as the control plane
// lists before it creates a machine: a machine created just before the
// deletion that the cache has not seen yet would otherwise keep its etcd
// hook and its sandbox after the Cluster is gone (issue 22, finding 8).
func (r *Reconciler) machinesOf(ctx context.Context, cluster *clusterv1.Cluster) (workers, controlPlane []clusterv1.Machine, err error) {
	var list clusterv1.MachineList
	reader := client.Reader(r.client)
	if r.cp.Live != nil {
		reader = r.cp.Live
	}
	if err := reader.List(ctx, &list, client.InNamespace(cluster.Namespace), client.MatchingFields{index.MachineCluster: cluster.Name}); err != nil {
		return nil, nil, fmt.Errorf("listing machines: %w", err)
	}
	for _, m := range list.Items {
		if m.Spec.ClusterName != cluster.Name {
			continue
		}
		// A labelled machine the Cluster does not own is no member: it
		// goes with the workers, before the control plane.
		if _, ok := m.Labels[clusterv1.ControlPlaneLabel]; ok && controlplane.Owns(cluster, &m) {
			controlPlane = append(controlPlane, m)
		} else {
			workers = append(workers, m)
		}
	}
	return workers, controlPlane, nil
}

// deleteFleets deletes the cluster's MachineDeployments and MachineSets, so
// that none replaces a worker being deleted.
func (r *Reconciler) deleteFleets(ctx context.Context, cluster *clusterv1.Cluster) error {
	var mds clusterv1.MachineDeploymentList
	if err := r.client.List(ctx, &mds, client.InNamespace(cluster.Namespace)); err != nil {
		return fmt.Errorf("listing machine deployments: %w", err)
	}
	for i := range mds.Items {
		if md := &mds.Items[i]; md.Spec.ClusterName == cluster.Name && md.DeletionTimestamp.IsZero() {
			if err := r.client.Delete(ctx, md); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("deleting machine deployment %s: %w", md.Name, err)
			}
		}
	}
	var sets clusterv1.MachineSetList
	if err := r.client.List(ctx, &sets, client.InNamespace(cluster.Namespace)); err != nil {
		return fmt.Errorf("listing machine sets: %w", err)
	}
	for i := range sets.Items {
		if ms := &sets.Items[i]; ms.Spec.ClusterName == cluster.Name && ms.DeletionTimestamp.IsZero() {
			if err := r.client.Delete(ctx, ms); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("deleting machine set %s: %w", ms.Name, err)
			}
		}
	}
	return nil
}

func (r *Reconciler) deleteAll(ctx context.Context, machines []clusterv1.Machine) error {
	for i := range machines {
		m := &machines[i]
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		if err := r.client.Delete(ctx, m); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting machine %s: %w", m.Name, err)
		}
	}
	return nil
}

// deleteEndpoint removes an endpoint marina made. The provider is found
// as when it was made; a provider no longer running here leaves the
// cluster waiting rather than leaking its endpoint.
func (r *Reconciler) deleteEndpoint(ctx context.Context, cluster *clusterv1.Cluster) error {
	if cluster.Annotations[clusterv1.ManagedEndpointAnnotation] != "true" {
		return nil
	}
	prov, ok, err := r.provider(ctx, cluster)
	if !ok {
		if err == nil {
			err = fmt.Errorf("no provider here can delete the control-plane endpoint of cluster %s", cluster.Name)
		}
		return err
	}
	eps, ok := prov.(provider.EndpointProvider)
	if !ok {
		return nil
	}
	if err := eps.DeleteEndpoint(ctx, clusterv1.InstanceKey(cluster)); err != nil {
		return fmt.Errorf("deleting the control-plane endpoint: %w", err)
	}
	return nil
}

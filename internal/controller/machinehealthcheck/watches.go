package machinehealthcheck

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/remote"
)

// checksForMachine queues the checks that select the machine.
func (r *Reconciler) checksForMachine(ctx context.Context, o client.Object) []reconcile.Request {
	m := o.(*clusterv1.Machine)
	var out []reconcile.Request
	for _, mhc := range r.checksOf(ctx, m.Namespace, m.Spec.ClusterName) {
		if selects(&mhc, m) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&mhc)})
		}
	}
	return out
}

// checksForCluster queues the checks of a cluster (paused, deleted).
func (r *Reconciler) checksForCluster(ctx context.Context, o client.Object) []reconcile.Request {
	var out []reconcile.Request
	for _, mhc := range r.checksOf(ctx, o.GetNamespace(), o.GetName()) {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&mhc)})
	}
	return out
}

func (r *Reconciler) checksOf(ctx context.Context, ns, cluster string) []clusterv1.MachineHealthCheck {
	list := &clusterv1.MachineHealthCheckList{}
	if err := r.client.List(ctx, list, client.InNamespace(ns)); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing machinehealthchecks to enqueue")
		return nil
	}
	out := list.Items[:0]
	for _, mhc := range list.Items {
		if mhc.Spec.ClusterName == cluster {
			out = append(out, mhc)
		}
	}
	return out
}

// nodeChanged runs on a workload cluster's informer goroutine: it queues
// every check of that cluster. Mapping the Node to its machine first would
// save little: a cluster has few checks, and the queue merges repeats.
func (r *Reconciler) nodeChanged(e remote.NodeEvent) {
	for _, mhc := range r.checksOf(context.Background(), e.Cluster.Namespace, e.Cluster.Name) {
		select {
		case r.nodeEvents <- event.TypedGenericEvent[*clusterv1.MachineHealthCheck]{Object: &mhc}:
		case <-r.done:
			return
		}
	}
}

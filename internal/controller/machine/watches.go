package machine

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/bootstraptoken"
	"marina.dev/marina/internal/controller/index"
	"marina.dev/marina/internal/nodecsr"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/provider"
)

func indexMachines(ctx context.Context, mgr ctrl.Manager) error {
	indexes := map[string]client.IndexerFunc{
		classNameIndex: func(o client.Object) []string {
			if ref := o.(*clusterv1.Machine).Spec.ClassRef; ref != nil {
				return []string{ref.Name}
			}
			return nil
		},
		uidIndex: func(o client.Object) []string { return []string{string(clusterv1.InstanceKey(o))} },
		bootstrapUserIndex: func(o client.Object) []string {
			return []string{bootstraptoken.Username(clusterv1.InstanceKey(o))}
		},
		providerIDIndex: func(o client.Object) []string {
			if id := o.(*clusterv1.Machine).Status.ProviderID; id != "" {
				return []string{id}
			}
			return nil
		},
	}
	if err := index.AddMachineCluster(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	for name, fn := range indexes {
		if err := mgr.GetFieldIndexer().IndexField(ctx, &clusterv1.Machine{}, name, fn); err != nil {
			return fmt.Errorf("indexing machines by %s: %w", name, err)
		}
	}
	return nil
}

func (r *Reconciler) machinesForClass(ctx context.Context, o client.Object) []reconcile.Request {
	return r.requestsFor(ctx, client.MatchingFields{classNameIndex: o.GetName()})
}

func (r *Reconciler) machinesForKubeconfig(ctx context.Context, o client.Object) []reconcile.Request {
	cluster, ok := strings.CutSuffix(o.GetName(), "-kubeconfig")
	if !ok {
		return nil
	}
	return r.requestsFor(ctx, client.InNamespace(o.GetNamespace()), client.MatchingFields{index.MachineCluster: cluster})
}

func (r *Reconciler) machinesForCluster(ctx context.Context, o client.Object) []reconcile.Request {
	return r.requestsFor(ctx, client.InNamespace(o.GetNamespace()), client.MatchingFields{index.MachineCluster: o.GetName()})
}

// clusterGoingPredicate passes a Cluster's deletion, and the moment its
// control plane first answers (machines wait for it without retrying):
// its other changes mean nothing to its machines.
var clusterGoingPredicate = predicate.Funcs{
	CreateFunc: func(event.CreateEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		if e.ObjectOld.GetDeletionTimestamp() == nil && e.ObjectNew.GetDeletionTimestamp() != nil {
			return true
		}
		old, ok1 := e.ObjectOld.(*clusterv1.Cluster)
		cur, ok2 := e.ObjectNew.(*clusterv1.Cluster)
		return ok1 && ok2 && !controlPlaneInitialized(old) && controlPlaneInitialized(cur)
	},
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

func (r *Reconciler) requestsFor(ctx context.Context, opts ...client.ListOption) []reconcile.Request {
	list := &clusterv1.MachineList{}
	if err := r.client.List(ctx, list, opts...); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing machines to enqueue")
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

// nodeChanged runs on a workload cluster's informer goroutine: it queues the
// machine whose providerID the Node carries.
func (r *Reconciler) nodeChanged(e remote.NodeEvent) {
	if e.Node.Spec.ProviderID == "" {
		return
	}
	r.enqueue("a node event", nil, client.InNamespace(e.Cluster.Namespace), client.MatchingFields{providerIDIndex: e.Node.Spec.ProviderID})
}

// csrChanged runs on a workload cluster's informer goroutine: it queues the
// machine whose bootstrap token made a certificate request marina has not
// answered yet.
func (r *Reconciler) csrChanged(e remote.CSREvent) {
	if !strings.HasPrefix(e.CSR.Spec.Username, "system:bootstrap:") || nodecsr.Decided(e.CSR) {
		return
	}
	r.enqueue("a certificate request", func(m *clusterv1.Machine) bool { return m.Spec.ClusterName == e.Cluster.Name },
		client.InNamespace(e.Cluster.Namespace), client.MatchingFields{bootstrapUserIndex: e.CSR.Spec.Username})
}

// instanceChanged runs on a provider's StateWatcher goroutine: it queues
// the machine the provider saw stop or start.
func (r *Reconciler) instanceChanged(uid types.UID) {
	r.enqueue("a provider's state change", nil, client.MatchingFields{uidIndex: string(uid)})
}

// enqueue queues, from an informer or watcher goroutine, the machines the
// cache lists with opts that keep passes (nil: all); what names the event
// for a log.
func (r *Reconciler) enqueue(what string, keep func(*clusterv1.Machine) bool, opts ...client.ListOption) {
	list := &clusterv1.MachineList{}
	if err := r.client.List(context.Background(), list, opts...); err != nil {
		ctrl.Log.WithName("machine").Error(err, "Listing machines for "+what)
		return
	}
	for i := range list.Items {
		if keep != nil && !keep(&list.Items[i]) {
			continue
		}
		select {
		case r.nodeEvents <- event.TypedGenericEvent[*clusterv1.Machine]{Object: &list.Items[i]}:
		case <-r.done:
			return
		}
	}
}

// kindOf says which providerSpec kind a machine has: from its own
// providerSpec when it names one (overrides name the class's kind too), else
// from its class.
func (r *Reconciler) kindOf(ctx context.Context, m *clusterv1.Machine) (schema.GroupVersionKind, error) {
	// Once a provider has taken the machine, the kind is recorded on it, so
	// that deleting its class can never orphan it.
	if recorded, ok := m.Annotations[clusterv1.ProviderKindAnnotation]; ok {
		if gvk, err := provider.ParseKind(recorded); err == nil {
			return gvk, nil
		}
	}
	if m.Spec.ProviderSpec != nil {
		if gvk := gvkOf(m.Spec.ProviderSpec.Raw); gvk.Kind != "" {
			return gvk, nil
		}
	}
	if m.Spec.ClassRef == nil {
		return schema.GroupVersionKind{}, fmt.Errorf("machine has neither a providerSpec with apiVersion and kind nor a classRef")
	}
	class := &clusterv1.MachineClass{}
	if err := r.client.Get(ctx, types.NamespacedName{Name: m.Spec.ClassRef.Name}, class); err != nil {
		return schema.GroupVersionKind{}, fmt.Errorf("reading MachineClass %q: %w", m.Spec.ClassRef.Name, err)
	}
	return gvkOf(class.Spec.ProviderSpec.Raw), nil
}

// gvkOf reads apiVersion and kind from a serialized object; empty when the
// blob has none.
func gvkOf(raw []byte) schema.GroupVersionKind {
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &tm) != nil {
		return schema.GroupVersionKind{}
	}
	return schema.FromAPIVersionAndKind(tm.APIVersion, tm.Kind)
}

// controlPlaneInitialized: the cluster's control plane has answered once,
// or someone else runs it.
func controlPlaneInitialized(c *clusterv1.Cluster) bool {
	return c.Annotations[clusterv1.ExternalControlPlaneAnnotation] == "true" ||
		meta.IsStatusConditionTrue(c.Status.Conditions, clusterv1.ClusterControlPlaneInitializedCondition)
}

package nodeagent

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// keepLease creates and renews the Node's Lease in kube-node-lease, the
// signal kube-controller-manager's node lifecycle controller watches: when
// renewals stop for leaseDurationSeconds, the Node goes NotReady.
func (a *agent) keepLease(ctx context.Context, node nodeRef) {
	var lease *coordinationv1.Lease
	renew := func(ctx context.Context) {
		l, err := a.renewLease(ctx, lease, node)
		if err != nil {
			if ctx.Err() == nil {
				a.log.Error(err, "Renewing node lease failed")
			}
			lease = nil // read it again next time
			return
		}
		lease = l
	}
	renew(ctx)
	every(ctx, a.t.leaseRenew, 0.04, renew)
}

// renewLease sets the Lease's renewTime to now. With the Lease from the
// last renewal it is a single update, as the kubelet's; otherwise (first
// time, conflict, Lease deleted) it reads the Lease, or creates it.
func (a *agent) renewLease(ctx context.Context, last *coordinationv1.Lease, node nodeRef) (*coordinationv1.Lease, error) {
	leases := a.cs.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	if last != nil {
		l, err := leases.Update(ctx, a.desiredLease(last, node), metav1.UpdateOptions{FieldManager: fieldManager})
		if err == nil {
			return l, nil
		}
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("renewing lease %s/%s: %w", corev1.NamespaceNodeLease, node.Name, err)
		}
	}
	cur, err := leases.Get(ctx, node.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l, err := leases.Create(ctx, a.desiredLease(&coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: node.Name, Namespace: corev1.NamespaceNodeLease},
		}, node), metav1.CreateOptions{FieldManager: fieldManager})
		if err != nil {
			return nil, fmt.Errorf("creating lease %s/%s: %w", corev1.NamespaceNodeLease, node.Name, err)
		}
		return l, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading lease %s/%s: %w", corev1.NamespaceNodeLease, node.Name, err)
	}
	l, err := leases.Update(ctx, a.desiredLease(cur, node), metav1.UpdateOptions{FieldManager: fieldManager})
	if err != nil {
		return nil, fmt.Errorf("renewing lease %s/%s: %w", corev1.NamespaceNodeLease, node.Name, err)
	}
	return l, nil
}

// desiredLease is base renewed now, held by the node and owned by the Node
// (so that deleting the Node deletes its Lease).
func (a *agent) desiredLease(base *coordinationv1.Lease, node nodeRef) *coordinationv1.Lease {
	l := base.DeepCopy()
	now := metav1.NowMicro()
	l.Spec.HolderIdentity = ptr.To(node.Name)
	l.Spec.LeaseDurationSeconds = ptr.To(a.t.leaseDuration)
	l.Spec.RenewTime = &now
	l.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: "v1",
		Kind:       "Node",
		Name:       node.Name,
		UID:        node.UID,
	}}
	return l
}

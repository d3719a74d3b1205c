package machine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/controller/finalizer"
	"marina.dev/marina/internal/drain"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/provider"
)

// drainRetry is how often a blocked drain is tried again. Evictions refused
// by a PodDisruptionBudget produce no event we could wait for.
const drainRetry = 5 * time.Second

// reconcileDelete drains the Node, deletes the real machine, removes the
// Node, and only then lets the Machine go. Each step is idempotent, so a
// controller killed anywhere in between resumes where it stopped.
func (r *Reconciler) reconcileDelete(ctx context.Context, m *clusterv1.Machine, prov provider.Provider) (ctrl.Result, error) {
	if !machineFinalizer.Held(m) {
		return ctrl.Result{}, nil
	}
	made, err := r.everMade(ctx, m, prov)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !made {
		// No Node can exist: nothing to drain, no cluster to wait for.
		return ctrl.Result{}, r.removeFinalizer(ctx, m)
	}
	gone, err := r.clusterGoing(ctx, m)
	if err != nil {
		return ctrl.Result{}, err
	}
	var cl *remote.Cluster
	if !gone {
		// The whole cluster going, no Node is drained or removed: its
		// API server may go before this machine does (the last
		// control-plane machine holds it).
		cl, err = r.clusters.Get(ctx, clusterKey(m))
	}
	if err != nil {
		now := time.Now()
		if why := withoutCluster(m, now); why != "" {
			// Deleted without draining or removing the Node: the real
			// machine must not wait for good on a cluster that is gone.
			r.nodeNotDeleted(m, fmt.Sprintf("cluster %s does not answer (%v), and %s", m.Spec.ClusterName, err, why))
		} else {
			return r.waitForCluster(ctx, m, err, now)
		}
	}
	node, err := r.nodeForDeletion(ctx, m, prov, cl)
	if err == nil && node != nil {
		var res ctrl.Result
		var done bool
		if res, done, err = r.drain(ctx, m, cl, node); err == nil && !done {
			return res, nil
		}
	}
	if err != nil {
		// The cluster answered the lookup, then failed the Node's
		// lookup or its drain (its API server went down behind its
		// balancer): spec.nodeDeletionTimeout bounds that as it bounds
		// the lookup.
		if _, bounded := deletionDeadline(m); !bounded {
			return ctrl.Result{}, err
		}
		now := time.Now()
		why := withoutCluster(m, now)
		if why == "" {
			return r.waitForCluster(ctx, m, err, now)
		}
		r.nodeNotDeleted(m, fmt.Sprintf("cluster %s fails to drain or find the node (%v), and %s", m.Spec.ClusterName, err, why))
		node = nil
	}
	if r.crashed("after-drain") {
		return ctrl.Result{}, errCrash
	}
	if hook := preTerminateHook(m); hook != "" {
		setCondition(m, clusterv1.MachineNodeReadyCondition, metav1.ConditionUnknown, clusterv1.MachineWaitingForHookReason,
			fmt.Sprintf("waiting for pre-terminate hook %s to be removed before deleting the machine", hook))
		return ctrl.Result{}, nil // removing the annotation is an update: it brings the machine back
	}
	if err := prov.Delete(ctx, clusterv1.InstanceKey(m)); err != nil {
		if res, goOn, err := r.providerDeleteFailed(ctx, m, prov, err, time.Now()); !goOn {
			return res, err
		}
	} else {
		r.recorder.Eventf(m, nil, corev1.EventTypeNormal, "MachineDeleted", "Delete", "provider %s deleted the machine", prov.Name())
	}
	if r.crashed("after-provider-delete") {
		return ctrl.Result{}, errCrash
	}
	if node != nil {
		if err := cl.Client.Delete(ctx, node); err != nil && !apierrors.IsNotFound(err) {
			deadline, ok := deletionDeadline(m)
			if !ok || time.Now().Before(deadline) {
				return ctrl.Result{}, fmt.Errorf("deleting node %s: %w", node.Name, err)
			}
			r.nodeNotDeleted(m, fmt.Sprintf("removing it from cluster %s still fails past spec.nodeDeletionTimeout (%s): %v",
				m.Spec.ClusterName, m.Spec.NodeDeletionTimeout.Duration, err))
		}
	}
	if r.crashed("after-node-delete") {
		return ctrl.Result{}, errCrash
	}
	return ctrl.Result{}, r.removeFinalizer(ctx, m)
}

// providerDeleteFailed says on the machine why its provider could not
// delete the real machine (the error names what it could not reach: an
// SSH host that is gone for good). The controller retries with backoff;
// past spec.nodeDeletionTimeout the deletion ends without it, with a
// warning event naming what is left behind, so that a namespace's
// deletion is not held for good by a host nobody can reach. What is left
// is still the provider's: the safety controller's orphan sweep keeps
// asking it to delete the machine. goOn: the deletion goes on without it.
func (r *Reconciler) providerDeleteFailed(ctx context.Context, m *clusterv1.Machine, prov provider.Provider, err error, now time.Time) (res ctrl.Result, goOn bool, _ error) {
	deadline, bounded := deletionDeadline(m)
	if bounded && !now.Before(deadline) {
		msg := fmt.Sprintf("provider %s could not delete the machine within spec.nodeDeletionTimeout (%s): %v; the machine is deleted without it, and what it holds is left behind until the safety controller's orphan sweep deletes it",
			prov.Name(), m.Spec.NodeDeletionTimeout.Duration, err)
		r.recorder.Eventf(m, nil, corev1.EventTypeWarning, clusterv1.MachineLeftBehindReason, "Delete", "%s", msg)
		setCondition(m, clusterv1.MachineInstanceRunningCondition, metav1.ConditionUnknown, clusterv1.MachineLeftBehindReason, msg)
		return ctrl.Result{}, true, nil
	}
	until := ""
	if bounded {
		until = fmt.Sprintf("; at %s (spec.nodeDeletionTimeout after the deletion) the machine is deleted without it", deadline.UTC().Format(time.RFC3339))
	}
	setCondition(m, clusterv1.MachineInstanceRunningCondition, metav1.ConditionUnknown, clusterv1.MachineDeletionFailedReason,
		fmt.Sprintf("provider %s could not delete the machine (retrying with backoff%s): %v", prov.Name(), until, err))
	if bounded {
		// Backoff would grow past the deadline; a steady retry keeps it.
		ctrl.LoggerFrom(ctx).Info("Provider could not delete the machine; retrying", "provider", prov.Name(), "deadline", deadline, "error", err.Error())
		return ctrl.Result{RequeueAfter: min(deadline.Sub(now)+10*time.Millisecond, clusterRetry)}, false, nil
	}
	return ctrl.Result{}, false, fmt.Errorf("deleting machine with provider %s: %w", prov.Name(), err)
}

// waitForCluster says, in the NodeReady condition, that the deletion waits
// for the workload cluster, and when it will stop waiting if
// spec.nodeDeletionTimeout is set; it comes back by then.
func (r *Reconciler) waitForCluster(ctx context.Context, m *clusterv1.Machine, err error, now time.Time) (ctrl.Result, error) {
	var until string
	deadline, bounded := deletionDeadline(m)
	if bounded {
		until = fmt.Sprintf("; at %s (spec.nodeDeletionTimeout %s after the deletion) the machine is deleted without them",
			deadline.UTC().Format(time.RFC3339), m.Spec.NodeDeletionTimeout.Duration)
	}
	retry := ctrl.Result{RequeueAfter: min(deadline.Sub(now)+10*time.Millisecond, clusterRetry)}
	if errors.Is(err, remote.ErrKubeconfigMissing) {
		setCondition(m, clusterv1.MachineNodeReadyCondition, metav1.ConditionUnknown, clusterv1.MachineWaitingForControlPlaneReason,
			fmt.Sprintf("waiting for the kubeconfig Secret %s to drain and remove the node before deleting the machine%s", remote.KubeconfigSecretName(m.Spec.ClusterName), until))
		if bounded {
			return retry, nil
		}
		return ctrl.Result{}, nil // the Secret watch brings the machine back
	}
	setCondition(m, clusterv1.MachineNodeReadyCondition, metav1.ConditionUnknown, clusterv1.MachineClusterUnreachableReason,
		fmt.Sprintf("cannot reach cluster %s to drain and remove the node (retrying): %v%s", m.Spec.ClusterName, err, until))
	if bounded {
		// Backoff would grow past the deadline; a steady retry keeps it.
		ctrl.LoggerFrom(ctx).Info("Waiting for the workload cluster to delete the machine's Node", "cluster", m.Spec.ClusterName, "deadline", deadline, "error", err.Error())
		return retry, nil
	}
	return ctrl.Result{}, fmt.Errorf("reaching cluster %s: %w", m.Spec.ClusterName, err)
}

// clusterRetry is how often a deletion bounded by spec.nodeDeletionTimeout
// tries an unreachable workload cluster again.
const clusterRetry = 10 * time.Second

// withoutCluster says why the machine may be deleted without its workload
// cluster (its Node neither drained nor removed), or "" when it must wait:
// the machine has the exclude-node-draining annotation, or
// spec.nodeDeletionTimeout has passed since the deletion was requested.
func withoutCluster(m *clusterv1.Machine, now time.Time) string {
	if _, ok := m.Annotations[clusterv1.ExcludeNodeDrainingAnnotation]; ok {
		return "the machine has the " + clusterv1.ExcludeNodeDrainingAnnotation + " annotation"
	}
	if deadline, ok := deletionDeadline(m); ok && !now.Before(deadline) {
		return fmt.Sprintf("spec.nodeDeletionTimeout (%s) has passed since the deletion at %s",
			m.Spec.NodeDeletionTimeout.Duration, m.DeletionTimestamp.UTC().Format(time.RFC3339))
	}
	return ""
}

// deletionDeadline is when a deletion stops waiting for the workload
// cluster: spec.nodeDeletionTimeout after the deletion was requested; ok is
// false when no timeout is set.
func deletionDeadline(m *clusterv1.Machine) (deadline time.Time, ok bool) {
	t := m.Spec.NodeDeletionTimeout
	if t == nil || t.Duration <= 0 || m.DeletionTimestamp == nil {
		return time.Time{}, false
	}
	return m.DeletionTimestamp.Add(t.Duration), true
}

// nodeNotDeleted records, in the Drained condition and once in a warning
// event, that the machine goes without draining or removing its Node.
func (r *Reconciler) nodeNotDeleted(m *clusterv1.Machine, why string) {
	node := "of the machine"
	if m.Status.NodeRef != nil {
		node = m.Status.NodeRef.Name
	}
	msg := fmt.Sprintf("Node %s could not be removed: %s; the machine is deleted without it: delete the Node by hand once the cluster answers", node, why)
	if c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineDrainedCondition); c == nil || c.Reason != clusterv1.MachineNodeNotDeletedReason {
		r.recorder.Eventf(m, nil, corev1.EventTypeWarning, clusterv1.MachineNodeNotDeletedReason, "Delete", "%s", msg)
	}
	setCondition(m, clusterv1.MachineDrainedCondition, metav1.ConditionFalse, clusterv1.MachineNodeNotDeletedReason, msg)
}

func (r *Reconciler) removeFinalizer(ctx context.Context, m *clusterv1.Machine) error {
	before := m.DeepCopy()
	machineFinalizer.Remove(m)
	if err := r.client.Patch(ctx, m, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing finalizer: %w", err)
	}
	return nil
}

// machineFinalizer is the machine controller's finalizer, under its name
// or its legacy one.
var machineFinalizer = finalizer.Name{Current: clusterv1.MachineFinalizer, Legacy: clusterv1.LegacyMachineFinalizer}

// everMade reports whether the provider ever made this machine: it has a
// providerID, or the provider knows its UID (a controller killed after
// Create, before recording it). A machine deleted while it still waited for
// its cluster was never made. The provider's answer is recorded in the
// status (providerID, addresses), as provision records it: the control
// plane waits for it before it lets a control-plane machine go, since a
// machine made runs an etcd member that must be removed first.
func (r *Reconciler) everMade(ctx context.Context, m *clusterv1.Machine, prov provider.Provider) (bool, error) {
	if m.Status.ProviderID != "" {
		return true, nil
	}
	inst, err := prov.Get(ctx, clusterv1.InstanceKey(m))
	switch {
	case provider.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("describing machine with provider %s: %w", prov.Name(), err)
	}
	m.Status.ProviderID, m.Status.Addresses = inst.ProviderID, inst.Addresses
	return true, nil
}

// clusterGoing reports whether the machine's Cluster is deleted or being
// deleted: then its Nodes go with it and need no drain.
func (r *Reconciler) clusterGoing(ctx context.Context, m *clusterv1.Machine) (bool, error) {
	cluster := &clusterv1.Cluster{}
	err := r.client.Get(ctx, clusterKey(m), cluster)
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("reading cluster %s: %w", m.Spec.ClusterName, err)
	}
	return !cluster.DeletionTimestamp.IsZero(), nil
}

// nodeForDeletion finds the machine's Node, even when the controller died
// before it recorded nodeRef or providerID: the provider still knows the
// providerID of the machine it made for this UID.
func (r *Reconciler) nodeForDeletion(ctx context.Context, m *clusterv1.Machine, prov provider.Provider, cl *remote.Cluster) (*corev1.Node, error) {
	if cl == nil {
		return nil, nil
	}
	providerID := m.Status.ProviderID
	if providerID == "" {
		inst, err := prov.Get(ctx, clusterv1.InstanceKey(m))
		if provider.IsNotFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("describing machine with provider %s: %w", prov.Name(), err)
		}
		providerID = inst.ProviderID
		// Recorded so that a later pass still finds the Node after the
		// provider has forgotten the machine.
		m.Status.ProviderID = providerID
	}
	return cl.NodeByProviderID(ctx, providerID)
}

// drain cordons the node and evicts its pods, honouring PodDisruptionBudgets.
// It reports done when the node is empty (pods left behind on a Node that
// is not Ready aside, see drain.Evict), when draining is skipped by the
// machine's annotation, or when spec.nodeDrainTimeout has passed, whatever
// made the drain fail meanwhile.
func (r *Reconciler) drain(ctx context.Context, m *clusterv1.Machine, cl *remote.Cluster, node *corev1.Node) (ctrl.Result, bool, error) {
	if _, skip := m.Annotations[clusterv1.ExcludeNodeDrainingAnnotation]; skip {
		setCondition(m, clusterv1.MachineDrainedCondition, metav1.ConditionTrue, clusterv1.MachineDrainSkippedReason,
			"draining skipped: the machine has the "+clusterv1.ExcludeNodeDrainingAnnotation+" annotation")
		return ctrl.Result{}, true, nil
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineDrainedCondition); c != nil &&
		(c.Status == metav1.ConditionTrue || c.Reason == clusterv1.MachineDrainTimeoutReason) {
		return ctrl.Result{}, true, nil
	}
	// The timeout is checked before anything that can fail: an eviction
	// or a cordon that fails the same way on every pass must not keep the
	// machine for good.
	if r.drainTimedOut(m, node.Name) {
		return ctrl.Result{}, true, nil
	}
	if err := drain.Cordon(ctx, cl.Clientset, node.Name); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, true, nil
		}
		r.draining(m, node.Name, clusterv1.MachineDrainingReason, err.Error())
		return ctrl.Result{}, false, err
	}
	res, err := drain.Evict(ctx, cl.Clientset, node, drain.Options{UnreachableGrace: r.opts.UnreachablePodGrace})
	if err != nil {
		r.draining(m, node.Name, clusterv1.MachineDrainingReason, err.Error())
		return ctrl.Result{}, false, err
	}
	if res.Done() {
		setCondition(m, clusterv1.MachineDrainedCondition, metav1.ConditionTrue, clusterv1.MachineDrainedReason, res.String())
		return ctrl.Result{}, true, nil
	}
	reason := clusterv1.MachineDrainingReason
	if len(res.Blocked) > 0 || len(res.Failed) > 0 {
		reason = clusterv1.MachineDrainBlockedReason
	}
	r.draining(m, node.Name, reason, res.String())
	if r.drainTimedOut(m, node.Name) {
		return ctrl.Result{}, true, nil
	}
	retry := drainRetry
	if timeout := m.Spec.NodeDrainTimeout; timeout != nil && timeout.Duration > 0 {
		started := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineDrainedCondition).LastTransitionTime.Time
		retry = min(retry, time.Until(started.Add(timeout.Duration))+10*time.Millisecond)
	}
	return ctrl.Result{RequeueAfter: retry}, false, nil
}

// draining records a drain in progress: the Drained condition stays False
// while draining, so its lastTransitionTime is when the drain started,
// across restarts of the controller and whatever failed on the way.
func (r *Reconciler) draining(m *clusterv1.Machine, node, reason, detail string) {
	if meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineDrainedCondition) == nil {
		r.recorder.Eventf(m, nil, corev1.EventTypeNormal, clusterv1.MachineDrainingReason, "Drain", "draining node %s: %s", node, detail)
	}
	setCondition(m, clusterv1.MachineDrainedCondition, metav1.ConditionFalse, reason, "draining node "+node+": "+detail)
}

// drainTimedOut gives up the drain, with a condition and a warning event,
// once spec.nodeDrainTimeout has passed since it started.
func (r *Reconciler) drainTimedOut(m *clusterv1.Machine, node string) bool {
	c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineDrainedCondition)
	timeout := m.Spec.NodeDrainTimeout
	if c == nil || c.Status != metav1.ConditionFalse || timeout == nil || timeout.Duration <= 0 || time.Since(c.LastTransitionTime.Time) < timeout.Duration {
		return false
	}
	detail := strings.TrimPrefix(c.Message, "draining node "+node+": ")
	msg := fmt.Sprintf("gave up draining node %s after spec.nodeDrainTimeout (%s); deleting the machine anyway: %s", node, timeout.Duration, detail)
	setCondition(m, clusterv1.MachineDrainedCondition, metav1.ConditionFalse, clusterv1.MachineDrainTimeoutReason, msg)
	r.recorder.Eventf(m, nil, corev1.EventTypeWarning, clusterv1.MachineDrainTimeoutReason, "Drain", "%s", msg)
	return true
}

// preTerminateHook names a hook that holds the machine's deletion, if any.
func preTerminateHook(m *clusterv1.Machine) string {
	for k := range m.Annotations {
		if strings.HasPrefix(k, clusterv1.PreTerminateHookPrefix) {
			return k
		}
	}
	return ""
}

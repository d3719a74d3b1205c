package machinehealthcheck

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/health"
	"marina.dev/marina/internal/remote"
)

// defaultNodeStartupTimeout is the CRD's default, for an object written
// before the default existed.
const defaultNodeStartupTimeout = 10 * time.Minute

// checkBlocked finds whatever forbids remediation before any machine is
// read: the check's paused annotation, or a missing, paused or deleted
// Cluster.
func (r *Reconciler) checkBlocked(ctx context.Context, s *scope) error {
	mhc := s.mhc
	if _, ok := mhc.Annotations[clusterv1.PausedAnnotation]; ok {
		s.block(clusterv1.PausedReason, "the health check has the "+clusterv1.PausedAnnotation+" annotation: nothing is remediated until it is removed")
		return nil
	}
	cluster := &clusterv1.Cluster{}
	err := r.client.Get(ctx, types.NamespacedName{Namespace: mhc.Namespace, Name: mhc.Spec.ClusterName}, cluster)
	switch {
	case apierrors.IsNotFound(err):
		s.block(clusterv1.WaitingForClusterReason, fmt.Sprintf("Cluster %s does not exist: create it, or fix spec.clusterName", mhc.Spec.ClusterName))
	case err != nil:
		return fmt.Errorf("reading cluster %s: %w", mhc.Spec.ClusterName, err)
	case !cluster.DeletionTimestamp.IsZero():
		s.block(clusterv1.DeletingReason, fmt.Sprintf("Cluster %s is being deleted: nothing is remediated", mhc.Spec.ClusterName))
	case cluster.Spec.Paused:
		s.block(clusterv1.ClusterPausedReason, fmt.Sprintf("Cluster %s is paused (spec.paused): nothing is remediated until it is resumed", mhc.Spec.ClusterName))
	}
	return nil
}

// readMachines lists the machines of the check's cluster its selector
// picks. The informer cache is enough: see "Crash safety" in doc.go.
func (r *Reconciler) readMachines(ctx context.Context, s *scope) error {
	sel, err := metav1.LabelSelectorAsSelector(&s.mhc.Spec.Selector)
	if err != nil {
		// The API rejects such selectors; one written before that is a
		// user's mistake, not something to retry.
		s.block(clusterv1.SelectorMismatchReason, fmt.Sprintf("spec.selector is invalid: %v", err))
		return nil
	}
	list := &clusterv1.MachineList{}
	if err := r.client.List(ctx, list, client.InNamespace(s.mhc.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return fmt.Errorf("listing machines: %w", err)
	}
	for i := range list.Items {
		m := &list.Items[i]
		if m.Spec.ClusterName != s.mhc.Spec.ClusterName {
			continue
		}
		s.machines = append(s.machines, m)
		s.facts = append(s.facts, factsOf(m))
	}
	return nil
}

// readNodes finds each machine's Node in the workload cluster. When the
// cluster does not answer, the check is blocked: a partition makes every
// Node look dead.
func (r *Reconciler) readNodes(ctx context.Context, s *scope) error {
	if len(s.machines) == 0 {
		return nil
	}
	key := types.NamespacedName{Namespace: s.mhc.Namespace, Name: s.mhc.Spec.ClusterName}
	cl, err := r.clusters.Get(ctx, key)
	if err != nil {
		msg := fmt.Sprintf("cannot read the Nodes of cluster %s, so nothing is remediated (the network, not the machines, may be down); retrying every %s: %v",
			key.Name, r.opts.UnreachableRetry, err)
		if errors.Is(err, remote.ErrKubeconfigMissing) {
			msg = fmt.Sprintf("the kubeconfig Secret %s does not exist yet, so the Nodes of cluster %s cannot be read and nothing is remediated",
				remote.KubeconfigSecretName(key.Name), key.Name)
		}
		s.block(clusterv1.RemediationClusterUnreachableReason, msg)
		s.requeueAfter = r.opts.UnreachableRetry
		return nil
	}
	for i, m := range s.machines {
		if m.Status.ProviderID == "" {
			continue
		}
		node, err := cl.NodeByProviderID(ctx, m.Status.ProviderID)
		if err != nil {
			return fmt.Errorf("finding the node of machine %s: %w", m.Name, err)
		}
		s.facts[i].Node = node
	}
	return nil
}

// factsOf is what the plan needs to know about a machine, short of its Node.
func factsOf(m *clusterv1.Machine) health.Machine {
	started := m.CreationTimestamp.Time
	if c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineProvisionedCondition); c != nil && c.Status == metav1.ConditionTrue {
		started = c.LastTransitionTime.Time
	}
	return health.Machine{
		Name:           m.Name,
		Failed:         m.Status.Phase == clusterv1.MachinePhaseFailed || m.Status.FailureReason != "",
		FailureMessage: m.Status.FailureMessage,
		Deleting:       !m.DeletionTimestamp.IsZero(),
		ControlPlane:   hasRole(m, clusterv1.ControlPlaneRole) && controlledByCluster(m),
		OwnedBySet:     ownedBySet(m),
		HadNode:        m.Status.NodeRef != nil,
		Started:        started,
	}
}

func hasRole(m *clusterv1.Machine, role clusterv1.MachineRole) bool {
	for _, r := range m.Spec.Roles {
		if r == role {
			return true
		}
	}
	return false
}

// ownedBySet reports whether a MachineSet controls the machine, so that
// deleting it makes the set create a replacement.
func ownedBySet(m *clusterv1.Machine) bool {
	ref := metav1.GetControllerOf(m)
	if ref == nil || ref.Kind != "MachineSet" {
		return false
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	return err == nil && gv.Group == clusterv1.GroupVersion.Group
}

// controlledByCluster: m's controller is its Cluster, whose control plane
// replaces it (controlplane.Owns, short of the Cluster's UID). A
// control-plane machine it does not own is no member: the control plane
// would never replace it, so remediation only marks it as any machine that
// nothing replaces.
func controlledByCluster(m *clusterv1.Machine) bool {
	ref := metav1.GetControllerOf(m)
	if ref == nil || ref.Kind != "Cluster" || ref.Name != m.Spec.ClusterName {
		return false
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	return err == nil && gv.Group == clusterv1.GroupVersion.Group
}

// decide runs the plan over the facts.
func (r *Reconciler) decide(s *scope) {
	spec := health.Spec{NodeStartupTimeout: defaultNodeStartupTimeout, MaxUnhealthy: s.mhc.Spec.MaxUnhealthy}
	if t := s.mhc.Spec.NodeStartupTimeout; t != nil {
		spec.NodeStartupTimeout = t.Duration
	}
	for _, c := range s.mhc.Spec.UnhealthyConditions {
		spec.Conditions = append(spec.Conditions, health.Condition{Type: c.Type, Status: c.Status, Timeout: c.Timeout.Duration})
	}
	// Remediation resumes on this pass if it was stopped on the last one.
	if prev := meta.FindStatusCondition(s.mhc.Status.Conditions, clusterv1.RemediationAllowedCondition); prev != nil {
		spec.Resumed = prev.LastTransitionTime.Time
		if prev.Status != metav1.ConditionTrue {
			spec.Resumed = s.now
		}
	}
	for _, rec := range s.mhc.Status.RecentRemediations {
		spec.Remediations = append(spec.Remediations, health.Remediation{Machine: rec.Machine, At: rec.Time.Time})
	}
	s.plan, s.planErr = health.Decide(spec, s.facts, s.now)
	s.decided = true
	s.records = s.plan.Remediations
	if !s.plan.RequeueAt.IsZero() {
		// A few milliseconds late rather than early: a pass that comes back
		// before the timeout expires would only schedule itself again.
		s.requeueAfter = s.plan.RequeueAt.Sub(s.now) + 10*time.Millisecond
	}
}

// nodeReachable reports whether the kubelet of a Node still reports to its
// API server: the Node exists and its Ready condition is True. A drain of
// any other Node would wait on a kubelet that never confirms.
func nodeReachable(n *corev1.Node) bool {
	if n == nil {
		return false
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// selects reports whether the check picks the machine.
func selects(mhc *clusterv1.MachineHealthCheck, m client.Object) bool {
	sel, err := metav1.LabelSelectorAsSelector(&mhc.Spec.Selector)
	return err == nil && !sel.Empty() && sel.Matches(labels.Set(m.GetLabels()))
}

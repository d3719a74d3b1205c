// Package controlplane makes a Cluster's control-plane Machines match
// spec.controlPlane (M9, M10, M14): the first machine starts the cluster,
// the others join it one at a time, a machine's etcd member is removed
// before the machine, and never when that would lose quorum. The cluster
// controller calls it; it writes Machines and the Cluster's status in
// memory, never the Cluster itself.
package controlplane

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/names"
	"marina.dev/marina/internal/upgrade"
)

// ControlPlane reconciles the control planes of Clusters.
type ControlPlane struct {
	// Client writes Machines; Live lists them past the cache, so that a
	// machine just created is never created twice.
	Client client.Client
	Live   client.Reader
	// Etcd reaches a cluster's etcd.
	Etcd EtcdDialer
	// Recorder, if set, gets an event at each upgrade step.
	Recorder recorder.EventRecorder
	// Started is when this controller started: an upgrade step's drain
	// wait counts from it at the earliest (see drain).
	Started time.Time
	// Probe, if set, replaces the probes of the machines' components
	// (probeMachines) in tests.
	Probe func(ctx context.Context, set *clusterpki.Set, machines []clusterv1.Machine) map[string]string
	// Now, if set, replaces time.Now in tests (how long a machine has been
	// deleted).
	Now func() time.Time
}

// Result says what the step did, for the cluster controller's conditions.
type Result struct {
	// Step is what was planned.
	Step Step
	// Machines are the control plane's machines, oldest first.
	Machines []clusterv1.Machine
	// RequeueAfter: look again this soon (an upgrade is under way).
	RequeueAfter time.Duration
}

// mayUpgrade: the control plane has its machines and none is being
// deleted, so the upgrade may take the next step. A Replace upgrade's
// extra machine makes the scale planner want a Delete; the upgrade decides
// which machine goes.
func mayUpgrade(step Step, f Facts) bool {
	if !f.Initialized || len(f.Machines) < f.Replicas {
		return false
	}
	for _, m := range f.Machines {
		if m.Deleting {
			return false
		}
	}
	return step.Action == Done || step.Action == Wait || step.Action == Delete
}

// Reconcile takes one step towards spec.controlPlane and updates
// cluster.Status.ControlPlane and the control-plane conditions in memory.
func (cp *ControlPlane) Reconcile(ctx context.Context, cluster *clusterv1.Cluster, set *clusterpki.Set) (*Result, error) {
	labelled, err := cp.labelled(ctx, cluster)
	if err != nil {
		return nil, err
	}
	machines, unowned := splitOwned(cluster, labelled)
	cp.reportUnowned(cluster, unowned)
	etcd := cp.observeEtcd(ctx, cluster, set, machines)
	if err := cp.recordMembers(ctx, machines, etcd); err != nil {
		return nil, err
	}
	now := time.Now
	if cp.Now != nil {
		now = cp.Now
	}
	facts := factsOf(cluster, machines, etcd, now())
	if !facts.Initialized && len(machines) > 0 {
		facts.Initialized = endpointReady(ctx, cluster, set)
	}
	if facts.Initialized {
		setCondition(cluster, clusterv1.ClusterControlPlaneInitializedCondition, metav1.ConditionTrue, clusterv1.ClusterControlPlaneInitializedReason, "")
	} else {
		setCondition(cluster, clusterv1.ClusterControlPlaneInitializedCondition, metav1.ConditionFalse, clusterv1.ClusterWaitingForControlPlaneReason,
			"waiting for the first control-plane machine's Node to be Ready")
	}
	setStatus(cluster, machines)
	setEtcdCondition(cluster, etcd)

	step := Plan(facts)
	if mayUpgrade(step, facts) {
		upgrading, err := cp.upgrade(ctx, cluster, set, machines, etcd)
		// A halted, refused or rolled-back upgrade holds nothing: the
		// user may still scale the control plane (or delete the cluster).
		if err != nil || (upgrading && !upgradeStopped(cluster)) {
			if step.Action == Delete {
				// Replace's surplus machine is the upgrade's to remove.
				step = Step{Action: Wait, Reason: "a Replace upgrade runs one control-plane machine more than asked until it removes an old one"}
			}
			setReadyCondition(cluster, step)
			return &Result{Step: step, Machines: machines, RequeueAfter: upgradeRecheck}, err
		}
		if upgrading && step.Action == Delete && surge(cluster, facts) {
			// A stopped Replace upgrade keeps the machine it added (the
			// halt says what to do with it): deleting it here would only
			// have the next try add another.
			step = Step{Action: Wait, Reason: "the stopped Replace upgrade keeps the control-plane machine it added: " + conditionMessage(cluster, clusterv1.ClusterUpgradeProgressingCondition)}
		}
	}
	switch step.Action {
	case Create:
		_, err = cp.create(ctx, cluster, machines, step.Init, nil)
	case Delete:
		err = cp.deleteMachine(ctx, cluster, machines, step.Machine)
	case Remediate:
		if err = cp.deleteMachine(ctx, cluster, machines, step.Machine); err == nil {
			cp.event(cluster, corev1.EventTypeNormal, "Remediating", "Delete",
				fmt.Sprintf("deleting unhealthy control-plane machine %s; a new one replaces it", step.Machine))
		}
	case Release:
		err = cp.release(ctx, cluster, set, machines, step.Machine)
	case RemoveMember:
		if err = cp.removeOrphan(ctx, cluster, set, machines, step.MemberID); err == nil {
			cp.event(cluster, corev1.EventTypeNormal, "EtcdMemberRemoved", "RemoveMember", step.Reason+": removed")
		}
	}
	setReadyCondition(cluster, step)
	return &Result{Step: step, Machines: machines}, err
}

// surge: a Replace upgrade's one machine more than spec.controlPlane.replicas.
func surge(cluster *clusterv1.Cluster, f Facts) bool {
	return cluster.Spec.ControlPlane.UpgradeStrategy.Type == clusterv1.ControlPlaneUpgradeStrategyType(upgrade.Replace) && len(f.Machines) == f.Replicas+1
}

func conditionMessage(cluster *clusterv1.Cluster, t string) string {
	if c := meta.FindStatusCondition(cluster.Status.Conditions, t); c != nil {
		return c.Message
	}
	return ""
}

// upgradeStopped: the upgrade takes no step until the user acts: halted
// after a step's timeout, refused by the version rules, or rolled back.
func upgradeStopped(cluster *clusterv1.Cluster) bool {
	c := meta.FindStatusCondition(cluster.Status.Conditions, clusterv1.ClusterUpgradeProgressingCondition)
	if c == nil || c.Status != metav1.ConditionFalse {
		return false
	}
	switch c.Reason {
	case clusterv1.ClusterUpgradeStepTimeoutReason, clusterv1.ClusterUnsupportedUpgradeReason, clusterv1.ClusterUpgradeRolledBackReason:
		return true
	}
	return false
}

// Machines lists the control plane's machines, those the Cluster owns
// (Owns), oldest first, from the API server itself.
func (cp *ControlPlane) Machines(ctx context.Context, cluster *clusterv1.Cluster) ([]clusterv1.Machine, error) {
	labelled, err := cp.labelled(ctx, cluster)
	if err != nil {
		return nil, err
	}
	owned, _ := splitOwned(cluster, labelled)
	return owned, nil
}

// labelled lists the machines labelled as the cluster's control plane,
// owned or not, oldest first.
func (cp *ControlPlane) labelled(ctx context.Context, cluster *clusterv1.Cluster) ([]clusterv1.Machine, error) {
	var list clusterv1.MachineList
	if err := cp.Live.List(ctx, &list, client.InNamespace(cluster.Namespace),
		client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name}, client.HasLabels{clusterv1.ControlPlaneLabel}); err != nil {
		return nil, fmt.Errorf("listing the control-plane machines of %s: %w", cluster.Name, err)
	}
	ms := slices.DeleteFunc(list.Items, func(m clusterv1.Machine) bool { return m.Spec.ClusterName != cluster.Name })
	slices.SortFunc(ms, func(a, b clusterv1.Machine) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return ms, nil
}

func deletingFor(m *clusterv1.Machine, now time.Time) time.Duration {
	if m.DeletionTimestamp.IsZero() {
		return 0
	}
	return now.Sub(m.DeletionTimestamp.Time)
}

func factsOf(cluster *clusterv1.Cluster, machines []clusterv1.Machine, etcd *etcdState, now time.Time) Facts {
	f := Facts{
		Replicas:    int(cluster.Spec.ControlPlane.Replicas),
		Stacked:     stacked(cluster),
		Initialized: meta.IsStatusConditionTrue(cluster.Status.Conditions, clusterv1.ClusterControlPlaneInitializedCondition),
	}
	if f.Replicas == 0 {
		f.Replicas = 1
	}
	if etcd.err == nil {
		f.EtcdKnown, f.Members, f.Voters, f.HealthyMembers = true, len(etcd.members), etcd.voters(), etcd.healthy()
		for _, o := range etcd.orphans {
			f.Orphans = append(f.Orphans, Member{ID: o.ID, Name: o.Name, Healthy: o.healthyVoter(), Votes: o.votes()})
		}
	}
	for i := range machines {
		m := &machines[i]
		mf := Machine{
			Name:        m.Name,
			Ready:       machineReady(m),
			Deleting:    !m.DeletionTimestamp.IsZero(),
			DeletingFor: deletingFor(m, now),
			Made:        made(m),
			Hook:        hasHook(m),
			Unhealthy:   m.Annotations[clusterv1.RemediationReasonAnnotation] != "",
			Drained:     Drained(m),
		}
		_, recorded := recordedMember(m)
		mf.Known = recorded || address(m) != ""
		if member := etcd.memberOf(m); member != nil {
			mf.Member, mf.MemberHealthy, mf.MemberVotes, mf.Known = true, member.healthyVoter(), member.votes(), true
		} else if recorded && etcd.err == nil && stacked(cluster) {
			mf.MemberGone = true
		}
		f.Initialized = f.Initialized || mf.Ready
		f.Machines = append(f.Machines, mf)
	}
	return f
}

func stacked(cluster *clusterv1.Cluster) bool {
	return cluster.Spec.ControlPlane.Etcd.Type != clusterv1.EtcdExternal
}

func machineReady(m *clusterv1.Machine) bool {
	return meta.IsStatusConditionTrue(m.Status.Conditions, clusterv1.MachineNodeReadyCondition)
}

func hasHook(m *clusterv1.Machine) bool {
	_, ok := m.Annotations[clusterv1.EtcdMemberHook]
	return ok
}

// made: the machine controller recorded the provider's answer on m: a
// providerID, or the address it runs at. It is the machine controller's
// own test of a machine it deletes (a machine it has not recorded as made
// it asks the provider about, and records the answer).
func made(m *clusterv1.Machine) bool {
	return m.Status.ProviderID != "" || address(m) != ""
}

// address is the machine's InternalIP, empty until the provider made it.
func address(m *clusterv1.Machine) string {
	for _, a := range m.Status.Addresses {
		if a.Type == clusterv1.MachineInternalIP {
			return a.Address
		}
	}
	return ""
}

// create makes the next control-plane machine and returns its name. The
// first machine of a cluster is <cluster>-cp-0; every other one gets a
// random suffix, so that a name is never used twice: an etcd member, a
// Node or an upgrade record left by a machine that is gone is never taken
// for a new machine's. A retry after a crash lists the machines live and
// sees the one made (the planner waits for it), so no second one is made.
func (cp *ControlPlane) create(ctx context.Context, cluster *clusterv1.Cluster, machines []clusterv1.Machine, init bool, annotations map[string]string) (string, error) {
	spec := &cluster.Spec.ControlPlane
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: cluster.Namespace,
			Name:      newName(cluster.Name, machines, init),
			Labels:    map[string]string{clusterv1.ClusterNameLabel: cluster.Name, clusterv1.ControlPlaneLabel: ""},
		},
		Spec: clusterv1.MachineSpec{
			ClusterName: cluster.Name,
			Roles:       []clusterv1.MachineRole{clusterv1.ControlPlaneRole},
			Versions:    clusterv1.MachineVersions{Kubelet: spec.Version, ControlPlane: spec.Version},
			ClassRef:    spec.ClassRef.DeepCopy(),
		},
	}
	if spec.AllowWorkloads {
		m.Spec.Roles = append(m.Spec.Roles, clusterv1.WorkerRole)
	}
	if spec.ProviderSpec != nil {
		m.Spec.ProviderSpec = &runtime.RawExtension{Raw: append([]byte(nil), spec.ProviderSpec.Raw...)}
		if len(m.Spec.ProviderSpec.Raw) == 0 && spec.ProviderSpec.Object != nil {
			m.Spec.ProviderSpec.Object = spec.ProviderSpec.Object.DeepCopyObject()
		}
	}
	annotations = maps.Clone(annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	if stacked(cluster) {
		annotations[clusterv1.EtcdMemberHook] = ""
		if init {
			annotations[clusterv1.EtcdInitAnnotation] = "true"
		}
	}
	if len(annotations) > 0 {
		m.Annotations = annotations
	}
	if err := controllerutil.SetControllerReference(cluster, m, cp.Client.Scheme()); err != nil {
		return "", fmt.Errorf("owning machine %s: %w", m.Name, err)
	}
	if err := cp.Client.Create(ctx, m); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return "", nil // the name is taken: the next pass picks another
		}
		return "", fmt.Errorf("creating control-plane machine %s: %w", m.Name, err)
	}
	return m.Name, nil
}

// newName names a new control-plane machine: <cluster>-cp-0 for the one
// that starts the cluster (nothing of the cluster exists before it, so
// the name is never another member's), <cluster>-cp-<random> otherwise.
// A cluster name too long for that is shortened with a hash of it
// (names.Fit): a machine's name is its Node's, a DNS label.
func newName(cluster string, machines []clusterv1.Machine, init bool) string {
	base := names.Fit(cluster, "-cp", validation.DNS1123LabelMaxLength-6)
	if init {
		return base + "-0"
	}
	for {
		name := base + "-" + utilrand.String(5)
		if !slices.ContainsFunc(machines, func(m clusterv1.Machine) bool { return m.Name == name }) {
			return name
		}
	}
}

// deleteMachine deletes a control-plane machine (scale-down, remediation,
// Replace). One whose Node is not Ready is not drained: no kubelet would
// confirm its pods gone, and the drain would wait for ever.
func (cp *ControlPlane) deleteMachine(ctx context.Context, cluster *clusterv1.Cluster, machines []clusterv1.Machine, name string) error {
	if m := find(machines, name); m != nil && !machineReady(m) {
		if _, skip := m.Annotations[clusterv1.ExcludeNodeDrainingAnnotation]; !skip {
			before := m.DeepCopy()
			if m.Annotations == nil {
				m.Annotations = map[string]string{}
			}
			m.Annotations[clusterv1.ExcludeNodeDrainingAnnotation] = "control-plane machine not Ready when deleted"
			if err := cp.Client.Patch(ctx, m, client.MergeFrom(before)); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("skipping the drain of machine %s, which is not Ready: %w", name, err)
			}
		}
	}
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: cluster.Namespace, Name: name}}
	if err := cp.Client.Delete(ctx, m); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting control-plane machine %s: %w", name, err)
	}
	return nil
}

// release removes the etcd member of a machine being deleted, then its
// hook, so the machine controller deletes the machine. Removing a member
// that is already gone is a no-op, so a crash between the two is harmless.
func (cp *ControlPlane) release(ctx context.Context, cluster *clusterv1.Cluster, set *clusterpki.Set, machines []clusterv1.Machine, name string) error {
	i := slices.IndexFunc(machines, func(m clusterv1.Machine) bool { return m.Name == name })
	if i < 0 {
		return nil
	}
	m := &machines[i]
	if stacked(cluster) {
		if err := cp.removeMember(ctx, cluster, set, machines, m); err != nil {
			return err
		}
	}
	return RemoveHook(ctx, cp.Client, m)
}

// RemoveHook lets the machine controller delete m.
func RemoveHook(ctx context.Context, c client.Client, m *clusterv1.Machine) error {
	if !hasHook(m) {
		return nil
	}
	before := m.DeepCopy()
	delete(m.Annotations, clusterv1.EtcdMemberHook)
	if err := c.Patch(ctx, m, client.MergeFrom(before)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("removing the etcd hook of machine %s: %w", m.Name, err)
	}
	return nil
}

// setStatus fills status.controlPlane from the machines.
func setStatus(cluster *clusterv1.Cluster, machines []clusterv1.Machine) {
	st := &cluster.Status.ControlPlane
	st.Replicas, st.ReadyReplicas, st.UpdatedReplicas = 0, 0, 0
	var oldest clusterv1.ComponentVersions
	counted := 0
	for i := range machines {
		m := &machines[i]
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		counted++
		st.Replicas++
		if machineReady(m) {
			st.ReadyReplicas++
		}
		if m.Spec.Versions.ControlPlane == cluster.Spec.ControlPlane.Version {
			st.UpdatedReplicas++
		}
		v := m.Status.Versions.ControlPlane
		if v == nil {
			v = &clusterv1.ComponentVersions{} // not reported: unknown
		}
		first := counted == 1
		oldest.APIServer = older(oldest.APIServer, v.APIServer, first)
		oldest.ControllerManager = older(oldest.ControllerManager, v.ControllerManager, first)
		oldest.Scheduler = older(oldest.Scheduler, v.Scheduler, first)
		oldest.Etcd = older(oldest.Etcd, v.Etcd, first)
	}
	st.Components = oldest
	st.Version = ""
	if oldest.APIServer != "" && oldest.APIServer == oldest.ControllerManager && oldest.APIServer == oldest.Scheduler {
		st.Version = oldest.APIServer
	}
}

// older keeps the older of two versions; an unknown one ("") wins, as a
// machine that has not reported may run anything.
func older(have, v string, first bool) string {
	if first {
		return v
	}
	if have == "" || v == "" {
		return ""
	}
	if compareVersions(v, have) < 0 {
		return v
	}
	return have
}

func setReadyCondition(cluster *clusterv1.Cluster, step Step) {
	st := cluster.Status.ControlPlane
	want := cluster.Spec.ControlPlane.Replicas
	if want == 0 {
		want = 1
	}
	switch {
	case step.Action == Done && st.Replicas == want && st.ReadyReplicas >= want:
		setCondition(cluster, clusterv1.ClusterControlPlaneReadyCondition, metav1.ConditionTrue, clusterv1.ClusterControlPlaneReadyReason, "")
	case step.Action == Wait && step.Why != "":
		setCondition(cluster, clusterv1.ClusterControlPlaneReadyCondition, metav1.ConditionFalse, step.Why,
			fmt.Sprintf("%d of %d control-plane machines ready: %s", st.ReadyReplicas, want, step.Reason))
	case step.Action == Wait && st.Replicas == want:
		setCondition(cluster, clusterv1.ClusterControlPlaneReadyCondition, metav1.ConditionFalse, clusterv1.ClusterControlPlaneUnhealthyReason, step.Reason)
	default:
		msg := fmt.Sprintf("%d of %d control-plane machines ready", st.ReadyReplicas, want)
		if step.Reason != "" {
			msg += ": " + step.Reason
		}
		setCondition(cluster, clusterv1.ClusterControlPlaneReadyCondition, metav1.ConditionFalse, clusterv1.ClusterControlPlaneScalingReason, msg)
	}
}

func setCondition(cluster *clusterv1.Cluster, t string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&cluster.Status.Conditions, metav1.Condition{
		Type: t, Status: status, Reason: reason, Message: msg, ObservedGeneration: cluster.Generation,
	})
}

// etcdTimeout bounds one look at etcd: a member that does not answer
// within it counts as unhealthy.
const etcdTimeout = 3 * time.Second

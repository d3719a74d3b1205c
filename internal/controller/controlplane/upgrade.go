package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/upgrade"
)

// upgradeRecheck is how often an upgrade under way is looked at: a step
// ends when a component reports its new version and answers its health
// check, which nothing watched announces.
const upgradeRecheck = time.Second

// defaultStepTimeout is upgradeStrategy.stepTimeout's default.
const defaultStepTimeout = 10 * time.Minute

// upgrade carries out the control plane's upgrade to spec.controlPlane.version
// (M11, M12, M13, M19): it observes every machine's reported versions and
// health, asks upgrade.Plan for the next step and takes it, one step per
// pass. Everything it knows comes from the machines, etcd and the probes,
// so a restart at any point resumes at the same step (status.upgrade only
// reports, and times the current step). It reports whether an upgrade is
// under way.
func (cp *ControlPlane) upgrade(ctx context.Context, cluster *clusterv1.Cluster, set *clusterpki.Set, machines []clusterv1.Machine, etcd *etcdState) (bool, error) {
	st := cluster.Status.Upgrade
	underWay := st != nil && st.CompletedAt == nil && st.To == string(cluster.Spec.ControlPlane.Version)
	// The workers roll as the last step of a control-plane upgrade, not
	// on their own: a deployment kept at an older kubelet on purpose (the
	// skew policy allows it) starts nothing, and a settled cluster's pass
	// lists no worker.
	var workers map[string]string
	var deployments []clusterv1.MachineDeployment
	if underWay || upgrade.Needed(inputOf(cluster, machines, nil, etcd, nil)) {
		var err error
		if workers, deployments, err = Workers(ctx, cp.Client, cluster, underWay); err != nil {
			return false, err
		}
	}
	if !upgrade.Needed(inputOf(cluster, machines, nil, etcd, workers)) {
		cp.finish(cluster)
		if err := cp.undrain(ctx, machines, nil, nil); err != nil {
			return false, err
		}
		return false, cp.forgetSteps(ctx, machines)
	}
	probe := cp.Probe
	if probe == nil {
		probe = probeMachines
	}
	health := probe(ctx, set, machines)
	in := inputOf(cluster, machines, health, etcd, workers)
	if st = begin(cluster, in, machines); st == nil {
		// The version rules need the running version: a machine being
		// made has not reported it yet.
		setUpgrading(cluster, metav1.ConditionTrue, clusterv1.ClusterUpgradingReason,
			"waiting for every control-plane machine to report its API server's version before the upgrade begins")
		return true, nil
	}
	// The step under way is the one the machines record, not the one
	// status.upgrade names: that is written after the step, and a crash in
	// between leaves it on the step before.
	adopt(st, machines)
	inFlight(st, machines)
	if cluster.Annotations[clusterv1.UpgradeRollbackAnnotation] == strconv.FormatInt(cluster.Generation, 10) {
		if err := cp.rollback(ctx, cluster, machines); err != nil {
			return true, err
		}
		return true, cp.undrain(ctx, machines, health, nil)
	}
	if err := upgrade.Check(st.From, in.Version, nil); err != nil {
		setUpgrading(cluster, metav1.ConditionFalse, clusterv1.ClusterUnsupportedUpgradeReason, err.Error())
		return true, nil
	}
	if err := cp.undrain(ctx, machines, health, st.Current); err != nil {
		return true, err
	}
	if err := cp.settle(ctx, cluster, machines); err != nil {
		return true, err
	}
	d := upgrade.Plan(in)
	st.Steps = stepsOf(in, st)
	switch {
	case d.Done:
		return true, nil // settled this pass; the next one finishes
	case d.Waiting != "":
		cp.wait(cluster, d.Waiting, stuck(st.Current, machines, health))
		return true, nil
	}
	return true, cp.take(ctx, cluster, machines, deployments, *d.Next)
}

// inputOf is the planner's input: each control-plane machine's reported
// versions and health, etcd's health and the workers' kubelets.
func inputOf(cluster *clusterv1.Cluster, machines []clusterv1.Machine, health map[string]string, etcd *etcdState, workers map[string]string) upgrade.Input {
	in := UpgradeInput(cluster, string(cluster.Spec.ControlPlane.Version), machines, health, workers)
	in.EtcdHealthy = !stacked(cluster) || (etcd.err == nil && etcd.healthy() == len(etcd.members))
	return in
}

// UpgradeInput is the planner's input for an upgrade of cluster to version
// from what its machines report; health names the unhealthy machines (nil:
// all healthy, as marina upgrade plan assumes), etcd counts as healthy.
func UpgradeInput(cluster *clusterv1.Cluster, version string, machines []clusterv1.Machine, health map[string]string, workers map[string]string) upgrade.Input {
	spec := cluster.Spec.ControlPlane
	in := upgrade.Input{
		Version:     version,
		Strategy:    upgrade.Strategy(spec.UpgradeStrategy.Type),
		Replicas:    int(max(spec.Replicas, 1)),
		EtcdHealthy: true,
		Workers:     workers,
	}
	if in.Strategy == "" {
		in.Strategy = upgrade.InPlace
	}
	for i := range machines {
		m := &machines[i]
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		v := map[upgrade.Component]string{upgrade.Kubelet: m.Status.Versions.Kubelet}
		if r := m.Status.Versions.ControlPlane; r != nil {
			v[upgrade.APIServer], v[upgrade.ControllerManager], v[upgrade.Scheduler] = r.APIServer, r.ControllerManager, r.Scheduler
			if r.Etcd != "" {
				v[upgrade.Etcd] = r.Etcd
			}
		}
		in.Machines = append(in.Machines, upgrade.Machine{Name: m.Name, Versions: v, Healthy: health[m.Name] == ""})
	}
	return in
}

// OldestAPIServer is the oldest version the machines' API servers report,
// and whether every machine not being deleted has reported one.
func OldestAPIServer(machines []clusterv1.Machine) (string, bool) {
	oldest, all := "", true
	for i := range machines {
		m := &machines[i]
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		v := m.Status.Versions.ControlPlane
		if v == nil || v.APIServer == "" {
			all = false
			continue
		}
		if oldest == "" || compareVersions(v.APIServer, oldest) < 0 {
			oldest = v.APIServer
		}
	}
	return oldest, all
}

// begin records the upgrade in status.upgrade when it starts: from the
// oldest API server to the spec's version.
func begin(cluster *clusterv1.Cluster, in upgrade.Input, machines []clusterv1.Machine) *clusterv1.UpgradeStatus {
	st := cluster.Status.Upgrade
	if st != nil && st.To == in.Version {
		st.CompletedAt = nil // a component fell behind again after it was done: resume
		return st
	}
	// A machine this upgrade added (a crash lost the status that said the
	// upgrade began) runs the new version, and may never report it.
	machines = slices.DeleteFunc(slices.Clone(machines), func(m clusterv1.Machine) bool {
		rec := recordedStep(&m)
		return rec != nil && rec.Action == string(upgrade.AddMachine) && rec.To == in.Version
	})
	from, all := OldestAPIServer(machines)
	if st != nil && st.CompletedAt == nil && st.From != "" {
		from, all = st.From, true // the target changed mid-way (a rollback's fix)
	}
	if !all || from == "" {
		return nil
	}
	now := metav1.Now()
	cluster.Status.Upgrade = &clusterv1.UpgradeStatus{From: from, To: in.Version, Strategy: clusterv1.ControlPlaneUpgradeStrategyType(in.Strategy), StartedAt: &now}
	return cluster.Status.Upgrade
}

// finish marks an upgrade done once nothing runs another version.
func (cp *ControlPlane) finish(cluster *clusterv1.Cluster) {
	st := cluster.Status.Upgrade
	if st == nil {
		return
	}
	if st.CompletedAt == nil {
		now := metav1.Now()
		st.CompletedAt, st.Current = &now, nil
		for i := range st.Steps {
			st.Steps[i].State = clusterv1.UpgradeStepDone
		}
		cp.event(cluster, corev1.EventTypeNormal, clusterv1.ClusterUpgradeCompleteReason, "Upgrade",
			fmt.Sprintf("every control-plane component and kubelet runs %s (upgrade took %s)", st.To, now.Sub(st.StartedAt.Time).Round(time.Second)))
	}
	setUpgrading(cluster, metav1.ConditionFalse, clusterv1.ClusterUpgradeCompleteReason, "the control plane and the workers run "+st.To)
}

// wait reports a step the planner waits on, and halts the upgrade when the
// current step has taken longer than stepTimeout: the step's machine and
// component are named, nothing further is started, the other machines
// keep serving.
func (cp *ControlPlane) wait(cluster *clusterv1.Cluster, why string, stuck bool) {
	st := cluster.Status.Upgrade
	if cur := st.Current; stuck && cur.StartedAt != nil && cur.State != clusterv1.UpgradeStepRolledBack {
		if overdue(cluster, cur) || cur.State == clusterv1.UpgradeStepFailed {
			cp.halt(cluster, cur, why)
			return
		}
	}
	setUpgrading(cluster, metav1.ConditionTrue, clusterv1.ClusterUpgradingReason, why)
}

func (cp *ControlPlane) halt(cluster *clusterv1.Cluster, cur *clusterv1.UpgradeStep, why string) {
	msg := fmt.Sprintf("upgrade halted: %s did not become healthy within %s (%s); the other machines keep serving; "+
		"run marina upgrade rollback %s to return it to %s", describeStep(cur), stepTimeout(cluster), why, cluster.Name, cur.From)
	if cur.Action == string(upgrade.AddMachine) {
		msg = fmt.Sprintf("upgrade halted: %s did not become healthy within %s (%s); the other machines keep serving; "+
			"delete machine %s to have another one made, or change spec.controlPlane", describeStep(cur), stepTimeout(cluster), why, cur.Machine)
	}
	if cur.State != clusterv1.UpgradeStepFailed {
		cur.State = clusterv1.UpgradeStepFailed
		cp.event(cluster, corev1.EventTypeWarning, clusterv1.ClusterUpgradeStepTimeoutReason, "Upgrade", msg)
	}
	markStep(cluster.Status.Upgrade, cur)
	setUpgrading(cluster, metav1.ConditionFalse, clusterv1.ClusterUpgradeStepTimeoutReason, msg)
}

// overdue: the step has run longer than stepTimeout. The workers' roll
// is not timed here: it is as long as the fleet, and its MachineDeployments
// report their own progress.
func overdue(cluster *clusterv1.Cluster, cur *clusterv1.UpgradeStep) bool {
	return cur.Action != string(upgrade.RollWorkers) && cur.StartedAt != nil && time.Since(cur.StartedAt.Time) > stepTimeout(cluster)
}

func stepTimeout(cluster *clusterv1.Cluster) time.Duration {
	if d := cluster.Spec.ControlPlane.UpgradeStrategy.StepTimeout; d != nil && d.Duration > 0 {
		return d.Duration
	}
	return defaultStepTimeout
}

// take carries out one step. An API server (or the etcd it reads) is taken
// out of the endpoint's backends first, and restarted only once the
// balancer had EndpointDrainWait to stop sending to it (M13): the clients
// move to the other API servers before this one goes, not after it fails.
func (cp *ControlPlane) take(ctx context.Context, cluster *clusterv1.Cluster, machines []clusterv1.Machine, deployments []clusterv1.MachineDeployment, step upgrade.Step) error {
	st := cluster.Status.Upgrade
	cur := stepStatus(step)
	// The planner asks for a machine only when none is being added: each
	// AddMachine is a new step.
	if st.Current != nil && sameStep(st.Current, cur) && step.Kind != upgrade.AddMachine {
		cur = st.Current
	} else {
		now := metav1.Now()
		cur.StartedAt = &now
		st.Current = cur
		cp.event(cluster, corev1.EventTypeNormal, clusterv1.ClusterUpgradingReason, "Upgrade", "step: "+step.String())
	}
	if cur.State == clusterv1.UpgradeStepRolledBack {
		// Tried again after a rollback and a change of the spec: the
		// step's time starts over.
		now := metav1.Now()
		cur.StartedAt = &now
	}
	if cur.State == clusterv1.UpgradeStepFailed || overdue(cluster, cur) {
		cp.halt(cluster, cur, "it does not report "+step.To+" and pass its health checks")
		return nil
	}
	cur.State = clusterv1.UpgradeStepRunning
	markStep(st, cur)
	setUpgrading(cluster, metav1.ConditionTrue, clusterv1.ClusterUpgradingReason, step.String())
	switch step.Kind {
	case upgrade.SetComponent:
		m := find(machines, step.Machine)
		if m == nil {
			return nil
		}
		// A lone API server has nowhere to send its clients to.
		if (step.Component == upgrade.APIServer || step.Component == upgrade.Etcd) && len(machines) > 1 {
			if wait, err := cp.drain(ctx, m); err != nil || wait {
				return err
			}
		}
		return cp.setComponent(ctx, m, step.Component, step.To, &cluster.Spec.ControlPlane.Components, cur)
	case upgrade.AddMachine:
		// The new machine records its step from the start: the step's
		// machine and time are known from it after a crash.
		rec, err := encodeStep(cur)
		if err != nil {
			return err
		}
		name, err := cp.create(ctx, cluster, machines, false, map[string]string{clusterv1.UpgradeStepAnnotation: rec})
		if name != "" {
			cur.Machine = name
		}
		return err
	case upgrade.RemoveMachine:
		return cp.deleteMachine(ctx, cluster, machines, step.Machine)
	case upgrade.RollWorkers:
		return cp.rollWorkers(ctx, deployments, step.To)
	}
	return nil
}

// drain takes m's API server out of the endpoint's backends (the cluster
// controller applies the annotation after this pass) and reports whether
// the balancer still needs time to move its clients away.
func (cp *ControlPlane) drain(ctx context.Context, m *clusterv1.Machine) (bool, error) {
	if at, ok := drainedAt(m); ok {
		// A controller started since cannot know that the endpoint was
		// told before it stopped: the wait counts from its start, when its
		// first pass tells it.
		if at.Before(cp.Started) {
			at = cp.Started
		}
		return time.Since(at) < EndpointDrainWait, nil
	}
	before := m.DeepCopy()
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[clusterv1.EndpointDrainAnnotation] = time.Now().UTC().Format(time.RFC3339Nano)
	if err := cp.Client.Patch(ctx, m, client.MergeFrom(before)); err != nil {
		return true, fmt.Errorf("taking machine %s out of the endpoint: %w", m.Name, err)
	}
	return true, nil
}

func drainedAt(m *clusterv1.Machine) (time.Time, bool) {
	v, ok := m.Annotations[clusterv1.EndpointDrainAnnotation]
	if !ok {
		return time.Time{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, true // someone's value: count it as long drained
	}
	return at, true
}

// Drained reports whether m's API server is out of the endpoint's backends.
func Drained(m *clusterv1.Machine) bool {
	_, ok := drainedAt(m)
	return ok
}

// undrain puts back into the endpoint every drained machine that is
// healthy and runs what its spec asks, unless the current step, about to
// change its spec, has not taken effect yet: its step is over.
func (cp *ControlPlane) undrain(ctx context.Context, machines []clusterv1.Machine, health map[string]string, cur *clusterv1.UpgradeStep) error {
	for i := range machines {
		m := &machines[i]
		if !Drained(m) || health[m.Name] != "" || !runsSpec(m) || pending(cur, m) {
			continue
		}
		before := m.DeepCopy()
		delete(m.Annotations, clusterv1.EndpointDrainAnnotation)
		if err := cp.Client.Patch(ctx, m, client.MergeFrom(before)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("putting machine %s back into the endpoint: %w", m.Name, err)
		}
	}
	return nil
}

// forgetSteps takes the step records off the machines once nothing is
// left to upgrade: a record lives as long as its upgrade. Left there, a
// later upgrade to the same version (a component that fell behind, a try
// again after a rollback) would adopt it as its step under way, started
// long ago, and halt at once for its timeout.
func (cp *ControlPlane) forgetSteps(ctx context.Context, machines []clusterv1.Machine) error {
	for i := range machines {
		m := &machines[i]
		if _, ok := m.Annotations[clusterv1.UpgradeStepAnnotation]; !ok || !m.DeletionTimestamp.IsZero() {
			continue
		}
		before := m.DeepCopy()
		delete(m.Annotations, clusterv1.UpgradeStepAnnotation)
		if err := cp.Client.Patch(ctx, m, client.MergeFrom(before)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("taking the finished upgrade's step record off machine %s: %w", m.Name, err)
		}
	}
	return nil
}

// stuck: the current step has not finished: its component does not
// report its new version yet, or its machine is not healthy. A finished
// step is not blamed for a wait on something else.
func stuck(cur *clusterv1.UpgradeStep, machines []clusterv1.Machine, health map[string]string) bool {
	if cur == nil {
		return false
	}
	m := find(machines, cur.Machine)
	if cur.Action == string(upgrade.AddMachine) {
		// Its machine is not healthy yet, or it is gone.
		return m == nil || health[m.Name] != ""
	}
	return m != nil && (pending(cur, m) || health[m.Name] != "")
}

// stepRecord is UpgradeStepAnnotation's value: the step, and when it was
// taken to the nanosecond (startedAt has seconds), which orders the steps.
type stepRecord struct {
	clusterv1.UpgradeStep
	Taken time.Time `json:"taken"`
}

func encodeStep(step *clusterv1.UpgradeStep) (string, error) {
	rec := stepRecord{UpgradeStep: *step, Taken: time.Now()}
	rec.Machine = "" // the machine it is on
	if step.StartedAt != nil {
		rec.Taken = step.StartedAt.Time
	}
	data, err := json.Marshal(rec)
	return string(data), err
}

// recordedStep is the last upgrade step taken on m (UpgradeStepAnnotation).
func recordedStep(m *clusterv1.Machine) *stepRecord {
	raw, ok := m.Annotations[clusterv1.UpgradeStepAnnotation]
	if !ok {
		return nil
	}
	var rec stepRecord
	if err := json.Unmarshal([]byte(raw), &rec); err != nil || rec.StartedAt == nil {
		return nil // not ours to read: inFlight finds a step under way from the versions
	}
	rec.Machine = m.Name
	return &rec
}

// recorded: m records step already (a pass that resumes the step).
func recorded(m *clusterv1.Machine, step *clusterv1.UpgradeStep) bool {
	rec := recordedStep(m)
	return rec != nil && sameStep(&rec.UpgradeStep, step) && rec.State == step.State && step.StartedAt != nil &&
		rec.StartedAt.Unix() == step.StartedAt.Unix()
}

// adopt makes status.upgrade.current the last step the machines record
// for this upgrade, when the status names another one or another start:
// the step was taken, and marina was stopped before status.upgrade said
// so. The status's own state of that step (a halt) is kept.
func adopt(st *clusterv1.UpgradeStatus, machines []clusterv1.Machine) {
	var last *stepRecord
	for i := range machines {
		m := &machines[i]
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		if rec := recordedStep(m); rec != nil && rec.To == st.To && (last == nil || last.Taken.Before(rec.Taken)) {
			last = rec
		}
	}
	if last == nil {
		return
	}
	step := last.UpgradeStep
	if cur := st.Current; cur != nil && cur.StartedAt != nil {
		if sameStep(cur, &step) && cur.Machine == step.Machine && cur.StartedAt.Unix() == step.StartedAt.Unix() &&
			(cur.State == step.State || step.State != clusterv1.UpgradeStepRolledBack) {
			return
		}
		if step.StartedAt.Unix() < cur.StartedAt.Unix() {
			return // a later step records nothing on a machine that stays (RemoveMachine)
		}
	}
	st.Current = &step
}

// inFlight makes status.upgrade.current the step the machines show under
// way (a component asked for a version it does not report), when it names
// another: the step was taken, and marina was stopped before it recorded
// it. Its start is then unknown, and taken as now.
func inFlight(st *clusterv1.UpgradeStatus, machines []clusterv1.Machine) {
	for i := range machines {
		m := &machines[i]
		if !m.DeletionTimestamp.IsZero() || m.Status.Versions.ControlPlane == nil {
			continue
		}
		want, got := m.Spec.Versions.ControlPlaneComponents(), m.Status.Versions.ControlPlane
		for _, c := range []struct {
			component upgrade.Component
			want, got string
		}{
			{upgrade.APIServer, want.APIServer, got.APIServer},
			{upgrade.ControllerManager, want.ControllerManager, got.ControllerManager},
			{upgrade.Scheduler, want.Scheduler, got.Scheduler},
			{upgrade.Etcd, want.Etcd, got.Etcd},
			{upgrade.Kubelet, string(m.Spec.Versions.Kubelet), m.Status.Versions.Kubelet},
		} {
			if c.want == "" || c.want == c.got {
				continue
			}
			cur := st.Current
			if cur != nil && cur.Machine == m.Name && cur.Component == string(c.component) &&
				(cur.To == c.want || (cur.State == clusterv1.UpgradeStepRolledBack && cur.From == c.want)) {
				return // the step recorded, or its rollback
			}
			from := c.got
			if from == "" {
				from = string(m.Spec.Versions.ControlPlane) // restarting; a step starts from the settled version
			}
			now := metav1.Now()
			st.Current = &clusterv1.UpgradeStep{Action: string(upgrade.SetComponent), Machine: m.Name, Component: string(c.component),
				From: from, To: c.want, State: clusterv1.UpgradeStepRunning, StartedAt: &now}
			return
		}
	}
}

// pending: cur is a step on m that m does not report done yet.
func pending(cur *clusterv1.UpgradeStep, m *clusterv1.Machine) bool {
	if cur == nil || cur.Machine != m.Name || cur.Action != string(upgrade.SetComponent) || cur.State == clusterv1.UpgradeStepRolledBack {
		return false
	}
	r := m.Status.Versions.ControlPlane
	if r == nil {
		return true
	}
	got := map[string]string{string(upgrade.APIServer): r.APIServer, string(upgrade.ControllerManager): r.ControllerManager,
		string(upgrade.Scheduler): r.Scheduler, string(upgrade.Etcd): r.Etcd, string(upgrade.Kubelet): m.Status.Versions.Kubelet}
	return got[cur.Component] != cur.To
}

// runsSpec: every control-plane component of m reports the version its
// spec asks for.
func runsSpec(m *clusterv1.Machine) bool {
	r := m.Status.Versions.ControlPlane
	if r == nil {
		return false
	}
	want := m.Spec.Versions.ControlPlaneComponents()
	return r.APIServer == want.APIServer && r.ControllerManager == want.ControllerManager && r.Scheduler == want.Scheduler &&
		(want.Etcd == "" || r.Etcd == want.Etcd)
}

// setComponent asks m to run component c at version: one field of its
// spec.versions, which the machine controller hands its provider. settings,
// when given (a step forward), are recorded in the same patch as what
// components run at version (ComponentSettingsAnnotation); a rollback
// passes none, and the component gets back the settings of its old
// version.
//
// The step is recorded on m in the same patch (UpgradeStepAnnotation),
// so that the step under way and the target of a rollback are read from
// the machines.
func (cp *ControlPlane) setComponent(ctx context.Context, m *clusterv1.Machine, c upgrade.Component, version string, settings *clusterv1.ControlPlaneComponents, step *clusterv1.UpgradeStep) error {
	before := m.DeepCopy()
	if settings != nil && c != upgrade.Kubelet {
		if err := recordSettings(m, version, *settings); err != nil {
			return err
		}
	}
	if step != nil && !recorded(m, step) {
		rec, err := encodeStep(step)
		if err != nil {
			return err
		}
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[clusterv1.UpgradeStepAnnotation] = rec
	}
	v := &m.Spec.Versions
	if c == upgrade.Kubelet {
		v.Kubelet = clusterv1.KubernetesVersion(version)
	} else {
		if v.Components == nil {
			v.Components = &clusterv1.ComponentVersions{}
		}
		switch c {
		case upgrade.APIServer:
			v.Components.APIServer = version
		case upgrade.ControllerManager:
			v.Components.ControllerManager = version
		case upgrade.Scheduler:
			v.Components.Scheduler = version
		case upgrade.Etcd:
			v.Components.Etcd = version
		}
	}
	if equalVersions(&before.Spec.Versions, v) && before.Annotations[clusterv1.ComponentSettingsAnnotation] == m.Annotations[clusterv1.ComponentSettingsAnnotation] &&
		before.Annotations[clusterv1.UpgradeStepAnnotation] == m.Annotations[clusterv1.UpgradeStepAnnotation] {
		return nil
	}
	if err := cp.Client.Patch(ctx, m, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("setting %s of machine %s to %s: %w", c, m.Name, version, err)
	}
	return nil
}

// recordSettings sets the settings of version in m's annotation.
func recordSettings(m *clusterv1.Machine, version string, settings clusterv1.ControlPlaneComponents) error {
	all := map[string]clusterv1.ControlPlaneComponents{}
	if raw := m.Annotations[clusterv1.ComponentSettingsAnnotation]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &all); err != nil {
			return fmt.Errorf("machine %s: annotation %s: %w", m.Name, clusterv1.ComponentSettingsAnnotation, err)
		}
	}
	all[version] = settings
	data, err := json.Marshal(all)
	if err != nil {
		return err
	}
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[clusterv1.ComponentSettingsAnnotation] = string(data)
	return nil
}

func equalVersions(a, b *clusterv1.MachineVersions) bool {
	return a.Kubelet == b.Kubelet && a.ControlPlane == b.ControlPlane &&
		(a.Components == nil) == (b.Components == nil) && (a.Components == nil || *a.Components == *b.Components)
}

// settle folds the per-component versions of a machine whose control-plane
// components all run spec.controlPlane.version into spec.versions.controlPlane,
// so that a finished machine's spec reads as one version again, and its
// kubelet may follow (never newer than its control plane).
func (cp *ControlPlane) settle(ctx context.Context, cluster *clusterv1.Cluster, machines []clusterv1.Machine) error {
	target := string(cluster.Spec.ControlPlane.Version)
	for i := range machines {
		m := &machines[i]
		want := m.Spec.Versions.ControlPlaneComponents()
		if m.Spec.Versions.Components == nil || want.APIServer != target || want.ControllerManager != target || want.Scheduler != target || !runsSpec(m) {
			continue
		}
		before := m.DeepCopy()
		m.Spec.Versions.ControlPlane = clusterv1.KubernetesVersion(target)
		m.Spec.Versions.Components = nil
		if want.Etcd != "" {
			m.Spec.Versions.Components = &clusterv1.ComponentVersions{Etcd: want.Etcd}
		}
		if err := cp.Client.Patch(ctx, m, client.MergeFrom(before)); err != nil {
			return fmt.Errorf("recording that machine %s runs %s: %w", m.Name, target, err)
		}
	}
	return nil
}

// rollback returns the current (or failed) step to the version it came
// from and holds the upgrade for as long as the rollback request names
// this generation: the request stays on the Cluster, so a restart rolls
// back again (a no-op) instead of retrying the step. The machine's API
// server comes back into the endpoint once it is healthy at the old
// version.
func (cp *ControlPlane) rollback(ctx context.Context, cluster *clusterv1.Cluster, machines []clusterv1.Machine) error {
	st := cluster.Status.Upgrade
	if cur := st.Current; cur != nil && cur.Action == string(upgrade.SetComponent) {
		if m := find(machines, cur.Machine); m != nil {
			rec := *cur
			rec.State = clusterv1.UpgradeStepRolledBack
			if err := cp.setComponent(ctx, m, upgrade.Component(cur.Component), cur.From, nil, &rec); err != nil {
				return err
			}
		}
		if cur.State != clusterv1.UpgradeStepRolledBack {
			cur.State = clusterv1.UpgradeStepRolledBack
			cp.event(cluster, corev1.EventTypeNormal, clusterv1.ClusterUpgradeRolledBackReason, "Rollback",
				fmt.Sprintf("%s returned to %s", describeStep(cur), cur.From))
		}
		markStep(st, cur)
	}
	st.RolledBackGeneration = cluster.Generation
	setUpgrading(cluster, metav1.ConditionFalse, clusterv1.ClusterUpgradeRolledBackReason,
		fmt.Sprintf("the upgrade to %s was rolled back; change the Cluster's spec (fix what failed, or another version) to try again", st.To))
	return nil
}

// Workers are the kubelet versions of the cluster's workers that belong
// to a MachineDeployment, by machine name, and the cluster's deployments:
// the upgrade's last step rolls them (standalone workers are the user's).
// Under way, an upgrade also waits for every deployment to finish rolling
// out.
func Workers(ctx context.Context, c client.Reader, cluster *clusterv1.Cluster, underWay bool) (map[string]string, []clusterv1.MachineDeployment, error) {
	var mds clusterv1.MachineDeploymentList
	if err := c.List(ctx, &mds, client.InNamespace(cluster.Namespace)); err != nil {
		return nil, nil, fmt.Errorf("listing the machine deployments of %s: %w", cluster.Name, err)
	}
	deployments := slices.DeleteFunc(mds.Items, func(d clusterv1.MachineDeployment) bool { return d.Spec.ClusterName != cluster.Name })
	if len(deployments) == 0 {
		return nil, nil, nil
	}
	var ms clusterv1.MachineList
	if err := c.List(ctx, &ms, client.InNamespace(cluster.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name}); err != nil {
		return nil, nil, fmt.Errorf("listing the workers of %s: %w", cluster.Name, err)
	}
	workers := map[string]string{}
	for _, d := range deployments {
		// A template still at another version has machines to roll,
		// even before the first of them is replaced; one at the version
		// has until its rollout is over (its new machines report no
		// version until they run).
		v := string(d.Spec.Template.Spec.Versions.Kubelet)
		if underWay && !rolledOut(&d) {
			v = "rolling out"
		}
		workers["deployment/"+d.Name] = v
	}
	for _, m := range ms.Items {
		if _, cp := m.Labels[clusterv1.ControlPlaneLabel]; cp || m.Labels[clusterv1.MachineDeploymentNameLabel] == "" || !m.DeletionTimestamp.IsZero() {
			continue
		}
		workers[m.Name] = m.Status.Versions.Kubelet
	}
	return workers, deployments, nil
}

// rolledOut: every machine of d is of its current template and ready.
func rolledOut(d *clusterv1.MachineDeployment) bool {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	st := d.Status
	return st.ObservedGeneration >= d.Generation && st.Replicas == want && st.UpdatedReplicas == want && st.ReadyReplicas == want
}

// rollWorkers moves every deployment of the cluster to the version; their
// rolling updates replace the machines within maxSurge and maxUnavailable.
func (cp *ControlPlane) rollWorkers(ctx context.Context, deployments []clusterv1.MachineDeployment, version string) error {
	for i := range deployments {
		d := &deployments[i]
		if string(d.Spec.Template.Spec.Versions.Kubelet) == version {
			continue
		}
		before := d.DeepCopy()
		d.Spec.Template.Spec.Versions.Kubelet = clusterv1.KubernetesVersion(version)
		if err := cp.Client.Patch(ctx, d, client.MergeFrom(before)); err != nil {
			return fmt.Errorf("moving machine deployment %s to %s: %w", d.Name, version, err)
		}
	}
	return nil
}

// stepsOf is status.upgrade.steps: the whole plan, each step's state from
// what the machines report.
func stepsOf(in upgrade.Input, st *clusterv1.UpgradeStatus) []clusterv1.UpgradeStep {
	var out []clusterv1.UpgradeStep
	for _, s := range upgrade.Steps(in) {
		us := *stepStatus(s)
		switch {
		case st.Current != nil && sameStep(st.Current, &us):
			us.State, us.StartedAt = st.Current.State, st.Current.StartedAt
		case s.Kind == upgrade.SetComponent && s.From == s.To:
			us.State = clusterv1.UpgradeStepDone
		default:
			us.State = clusterv1.UpgradeStepPending
		}
		if s.Kind == upgrade.SetComponent && us.From == us.To {
			us.From = st.From
		}
		out = append(out, us)
		if len(out) == 64 {
			break
		}
	}
	return out
}

func stepStatus(s upgrade.Step) *clusterv1.UpgradeStep {
	return &clusterv1.UpgradeStep{Action: string(s.Kind), Machine: s.Machine, Component: string(s.Component), From: s.From, To: s.To}
}

// sameStep: a and b are one step of the plan. The plan's AddMachine names
// no machine; the one under way names the machine it made.
func sameStep(a, b *clusterv1.UpgradeStep) bool {
	return a.Action == b.Action && a.Component == b.Component && a.To == b.To &&
		(a.Machine == b.Machine || a.Action == string(upgrade.AddMachine))
}

// markStep copies the current step's state into the plan.
func markStep(st *clusterv1.UpgradeStatus, cur *clusterv1.UpgradeStep) {
	for i := range st.Steps {
		if sameStep(&st.Steps[i], cur) {
			st.Steps[i].State, st.Steps[i].StartedAt = cur.State, cur.StartedAt
		}
	}
}

func describeStep(s *clusterv1.UpgradeStep) string {
	switch upgrade.Kind(s.Action) {
	case upgrade.SetComponent:
		return fmt.Sprintf("%s on machine %s (%s → %s)", s.Component, s.Machine, s.From, s.To)
	case upgrade.RemoveMachine:
		return "removing machine " + s.Machine
	case upgrade.AddMachine:
		return "a new control-plane machine at " + s.To
	}
	return "the workers' roll to " + s.To
}

func find(machines []clusterv1.Machine, name string) *clusterv1.Machine {
	for i := range machines {
		if machines[i].Name == name {
			return &machines[i]
		}
	}
	return nil
}

func setUpgrading(cluster *clusterv1.Cluster, status metav1.ConditionStatus, reason, msg string) {
	setCondition(cluster, clusterv1.ClusterUpgradeProgressingCondition, status, reason, msg)
}

func (cp *ControlPlane) event(cluster *clusterv1.Cluster, kind, reason, action, msg string) {
	if cp.Recorder != nil {
		cp.Recorder.Eventf(cluster, nil, kind, reason, action, "%s", msg)
	}
}

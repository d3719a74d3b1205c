// Package describe draws a cluster and everything of it as a tree a
// person reads at a glance (marina describe cluster): each object with its
// readiness, phase, version, age, and the reason and message of its worst
// condition. Building the tree is a pure function of the objects, so its
// output is tested against golden files.
package describe

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/controller/controlplane"
)

// Objects are a cluster and what belongs to it, as listed from the
// management plane.
type Objects struct {
	Cluster            *clusterv1.Cluster
	Machines           []clusterv1.Machine
	MachineSets        []clusterv1.MachineSet
	MachineDeployments []clusterv1.MachineDeployment
}

// Node is one line of the tree.
type Node struct {
	Kind    string `json:"kind"`
	Name    string `json:"name"`
	Ready   string `json:"ready"` // True, False, Unknown, or "" (no such condition)
	Phase   string `json:"phase,omitempty"`
	Version string `json:"version,omitempty"`
	Age     string `json:"age,omitempty"`
	// Reason and Message are of the worst condition: a Ready that is not
	// True, else the first condition that is False.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Detail is a line shown under the node (a control-plane machine's
	// component versions).
	Detail     string             `json:"detail,omitempty"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	Children   []*Node            `json:"children,omitempty"`
}

// Cluster builds the tree of o at now: the Cluster; its control plane and
// control-plane machines; each MachineDeployment with its MachineSets and
// their Machines; then the workers that belong to no set.
func Cluster(o Objects, now time.Time) *Node {
	c := o.Cluster
	root := node("Cluster", c.Name, c.Status.Conditions, clusterv1.ReadyCondition, now, c.CreationTimestamp)
	root.Phase = string(c.Status.Phase)
	root.Version = string(c.Spec.ControlPlane.Version)

	cp := &Node{Kind: "ControlPlane", Name: "", Version: c.Status.ControlPlane.Version}
	cp.Ready, cp.Reason, cp.Message = readiness(c.Status.Conditions, clusterv1.ClusterControlPlaneReadyCondition)
	cp.Conditions = pick(c.Status.Conditions, clusterv1.ClusterControlPlaneReadyCondition, clusterv1.ClusterEtcdHealthyCondition, clusterv1.ClusterUpgradeProgressingCondition,
		clusterv1.ClusterControlPlaneMachinesOwnedCondition)
	want := max(c.Spec.ControlPlane.Replicas, 1)
	cp.Phase = fmt.Sprintf("%d/%d ready", c.Status.ControlPlane.ReadyReplicas, want)
	root.Children = append(root.Children, cp)

	machines := slices.Clone(o.Machines)
	slices.SortFunc(machines, func(a, b clusterv1.Machine) int { return strings.Compare(a.Name, b.Name) })
	owned := map[string]bool{}
	for i := range machines {
		m := &machines[i]
		// A labelled machine the Cluster does not own is no member of its
		// control plane (ControlPlaneMachinesOwned names it): shown with
		// the loose machines.
		if _, isCP := m.Labels[clusterv1.ControlPlaneLabel]; isCP && controlplane.Owns(c, m) {
			cp.Children = append(cp.Children, machineNode(m, now))
			owned[m.Name] = true
		}
	}

	deployments := slices.Clone(o.MachineDeployments)
	slices.SortFunc(deployments, func(a, b clusterv1.MachineDeployment) int { return strings.Compare(a.Name, b.Name) })
	sets := slices.Clone(o.MachineSets)
	slices.SortFunc(sets, func(a, b clusterv1.MachineSet) int { return strings.Compare(a.Name, b.Name) })
	usedSets := map[string]bool{}
	for i := range deployments {
		d := &deployments[i]
		dn := node("MachineDeployment", d.Name, d.Status.Conditions, clusterv1.MachinesReadyCondition, now, d.CreationTimestamp)
		dn.Version = string(d.Spec.Template.Spec.Versions.Kubelet)
		dn.Phase = fmt.Sprintf("%d/%d ready", d.Status.ReadyReplicas, replicas(d.Spec.Replicas))
		for j := range sets {
			s := &sets[j]
			if !ownedBy(s.OwnerReferences, "MachineDeployment", d.Name) {
				continue
			}
			usedSets[s.Name] = true
			dn.Children = append(dn.Children, setNode(s, machines, owned, now))
		}
		root.Children = append(root.Children, dn)
	}
	for j := range sets {
		if s := &sets[j]; !usedSets[s.Name] {
			root.Children = append(root.Children, setNode(s, machines, owned, now))
		}
	}
	var loose []*Node
	for i := range machines {
		if m := &machines[i]; !owned[m.Name] {
			loose = append(loose, machineNode(m, now))
		}
	}
	if len(loose) > 0 {
		root.Children = append(root.Children, &Node{Kind: "Workers", Children: loose})
	}
	return root
}

func setNode(s *clusterv1.MachineSet, machines []clusterv1.Machine, owned map[string]bool, now time.Time) *Node {
	sn := node("MachineSet", s.Name, s.Status.Conditions, clusterv1.MachinesReadyCondition, now, s.CreationTimestamp)
	sn.Version = string(s.Spec.Template.Spec.Versions.Kubelet)
	sn.Phase = fmt.Sprintf("%d/%d ready", s.Status.ReadyReplicas, replicas(s.Spec.Replicas))
	for i := range machines {
		m := &machines[i]
		if ownedBy(m.OwnerReferences, "MachineSet", s.Name) {
			sn.Children = append(sn.Children, machineNode(m, now))
			owned[m.Name] = true
		}
	}
	return sn
}

// Machine is the node of one machine: its state, and on a control-plane
// machine the versions its components report.
func Machine(m *clusterv1.Machine, now time.Time) *Node { return machineNode(m, now) }

func machineNode(m *clusterv1.Machine, now time.Time) *Node {
	n := node("Machine", m.Name, m.Status.Conditions, clusterv1.ReadyCondition, now, m.CreationTimestamp)
	n.Phase = string(m.Status.Phase)
	if stopped(m) {
		// The phase still says Running (it follows the Node, which the
		// workload cluster marks NotReady only tens of seconds later):
		// the provider's word is the news.
		n.Phase = clusterv1.MachineStoppedReason
	}
	n.Version = m.Status.Versions.Kubelet
	if n.Version == "" {
		n.Version = string(m.Spec.Versions.Kubelet)
	}
	if m.Status.FailureReason != "" {
		n.Reason, n.Message = m.Status.FailureReason, m.Status.FailureMessage
	}
	if v := m.Status.Versions.ControlPlane; v != nil {
		parts := []string{"kube-apiserver " + dash(v.APIServer), "kube-controller-manager " + dash(v.ControllerManager), "kube-scheduler " + dash(v.Scheduler)}
		if v.Etcd != "" {
			parts = append(parts, "etcd "+v.Etcd)
		}
		n.Detail = strings.Join(parts, ", ")
	}
	return n
}

// stopped: the machine's provider reports it stopped (and it is not being
// started right now, or its start failed).
func stopped(m *clusterv1.Machine) bool {
	c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineInstanceRunningCondition)
	return c != nil && m.DeletionTimestamp.IsZero() && m.Status.FailureReason == "" && c.Status == metav1.ConditionFalse &&
		(c.Reason == clusterv1.MachineStoppedReason || c.Reason == clusterv1.MachineStartFailedReason)
}

func node(kind, name string, conds []metav1.Condition, readyType string, now time.Time, created metav1.Time) *Node {
	n := &Node{Kind: kind, Name: name, Conditions: conds}
	n.Ready, n.Reason, n.Message = readiness(conds, readyType)
	if !created.IsZero() {
		n.Age = duration.HumanDuration(now.Sub(created.Time))
	}
	return n
}

// readiness is the ready condition's status and the worst condition's
// reason and message: the ready condition when it is not True, else the
// first condition that is False (none when all are well).
func readiness(conds []metav1.Condition, readyType string) (status, reason, message string) {
	ready := meta.FindStatusCondition(conds, readyType)
	if ready != nil {
		status = string(ready.Status)
		if ready.Status != metav1.ConditionTrue {
			return status, ready.Reason, ready.Message
		}
	}
	for _, c := range conds {
		if c.Status == metav1.ConditionFalse && !benign(c) {
			return status, c.Reason, c.Message
		}
	}
	return status, "", ""
}

// benign: a False condition that says nothing is wrong: one that is True
// only while something happens (scaling, rolling out, paused, upgrading),
// unless an upgrade halted.
func benign(c metav1.Condition) bool {
	switch c.Type {
	case clusterv1.ScalingUpCondition, clusterv1.ScalingDownCondition, clusterv1.RollingOutCondition, clusterv1.PausedCondition:
		return true
	case clusterv1.ClusterUpgradeProgressingCondition:
		return c.Reason != clusterv1.ClusterUpgradeStepTimeoutReason && c.Reason != clusterv1.ClusterUnsupportedUpgradeReason
	}
	return false
}

func pick(conds []metav1.Condition, types ...string) []metav1.Condition {
	var out []metav1.Condition
	for _, t := range types {
		if c := meta.FindStatusCondition(conds, t); c != nil {
			out = append(out, *c)
		}
	}
	return out
}

func ownedBy(refs []metav1.OwnerReference, kind, name string) bool {
	for _, r := range refs {
		if r.Kind == kind && r.Name == name {
			return true
		}
	}
	return false
}

func replicas(r *int32) int32 {
	if r == nil {
		return 1
	}
	return *r
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

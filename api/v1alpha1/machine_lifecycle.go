package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Reasons and annotations of the machine lifecycle that the machine
// controller sets and honours (issue: machines and the provider contract).
const (
	// MachineInvalidProviderSpecReason: the provider refused the merged
	// providerSpec; the message names the field. Fix the machine or its class.
	MachineInvalidProviderSpecReason = "InvalidProviderSpec"
	// MachineVanishedReason: the machine had a providerID, but the real
	// machine no longer exists at its provider. marina does not re-create it.
	MachineVanishedReason = "MachineVanished"
	// MachineClusterUnreachableReason: the workload cluster's API server does
	// not answer; the controller retries with exponential backoff.
	MachineClusterUnreachableReason = "ClusterUnreachable"
	// MachineKubeconfigRefusedReason: the cluster's kubeconfig Secret asks
	// marina to read a file of its host or run a program; the message
	// names the fields.
	MachineKubeconfigRefusedReason = "KubeconfigRefused"
	// MachineDrainSkippedReason: draining was skipped on request.
	MachineDrainSkippedReason = "DrainSkipped"
	// MachineNodeNotDeletedReason: the machine is deleted without draining
	// or removing its Node, because the workload cluster did not answer past
	// spec.nodeDeletionTimeout, or did not answer and the machine has the
	// exclude-node-draining annotation. Delete the Node by hand once the
	// cluster answers.
	MachineNodeNotDeletedReason = "NodeNotDeleted"
	// MachineWaitingForHookReason: the machine is being deleted and waits
	// for a pre-terminate hook (PreTerminateHookPrefix) to be removed.
	MachineWaitingForHookReason = "WaitingForPreTerminateHook"

	// ExcludeNodeDrainingAnnotation on a Machine skips draining its Node
	// before deletion (for a Node that is already gone or must go now).
	ExcludeNodeDrainingAnnotation = "cluster.marina.dev/exclude-node-draining"

	// StoppedOnPurposeAnnotation ("true") on a Machine says that an
	// operator stopped the real machine on purpose and wants it to stay
	// stopped: the machine controller reports it (InstanceRunning=False,
	// Stopped) but does not start it again, as it otherwise does after a
	// reboot or a killed process. Remove the annotation to have it
	// started. A MachineHealthCheck that selects the machine still sees its
	// Node go NotReady, and may replace it.
	StoppedOnPurposeAnnotation = "cluster.marina.dev/stopped-on-purpose"

	// RemediationReasonAnnotation is put on a Machine by a MachineHealthCheck
	// that found it unhealthy and remediated (or, for a machine no set owns,
	// only marked) it: the reason and message, so that the cause survives
	// into the machine's deletion and its events. Set by the controller;
	// removed when the machine is healthy again.
	RemediationReasonAnnotation = "cluster.marina.dev/remediation-reason"
)

// ProviderKindAnnotation records, on a Machine a provider has taken, the
// providerSpec kind ("group/version/Kind") that chose the provider, so the
// machine stays with its provider even if its MachineClass is deleted. Set
// by the machine controller; do not edit.
const ProviderKindAnnotation = "cluster.marina.dev/provider-kind"

// Labels and annotations of control-plane machines (issue: clusters).
const (
	// ControlPlaneLabel marks the Machines a Cluster's control plane made
	// from spec.controlPlane.
	ControlPlaneLabel = GroupName + "/control-plane"

	// ExternalControlPlaneAnnotation ("true") on a Cluster says that someone
	// else runs its control plane: marina makes no certificates, endpoint
	// or control-plane machines for it, and its workers join through the
	// <cluster>-kubeconfig Secret the user provides (with a ServiceAccount
	// token of that cluster). Set it at creation.
	ExternalControlPlaneAnnotation = GroupName + "/external-control-plane"

	// ManagedEndpointAnnotation on a Cluster says that marina made its
	// spec.controlPlaneEndpoint with the provider (and deletes it with the
	// cluster); an endpoint the user set has none.
	ManagedEndpointAnnotation = GroupName + "/managed-endpoint"

	// EtcdInitAnnotation marks the control-plane machine that starts a new
	// stacked etcd cluster (the cluster's first); every other one joins the
	// running members. Set once, at creation, by the control plane.
	EtcdInitAnnotation = GroupName + "/etcd-init"

	// ControlPlaneVersionsAnnotation is kept on a control-plane machine's
	// Node by its agent: the JSON of ComponentVersions, the versions its
	// components actually run (read from the components), which the machine
	// controller copies into status.versions.controlPlane.
	ControlPlaneVersionsAnnotation = GroupName + "/control-plane-versions"

	// DesiredVersionsAnnotation is written on a machine's Node by the
	// machine controller, with the workload cluster's admin credentials:
	// the JSON of the versions its kubelet and control-plane components
	// should run, and the component settings by version (an InPlace
	// upgrade, M12). The machine's agent watches its own Node and restarts
	// just the component whose version changed; it reports what runs in
	// ControlPlaneVersionsAnnotation and the Node's kubeletVersion.
	DesiredVersionsAnnotation = GroupName + "/desired-versions"

	// KubeletConfigAnnotation is kept on a Node by its agent: the kubelet
	// configuration it runs, "<configmap>/<hash>" (M16); the machine
	// controller copies it into status.kubeletConfig.
	KubeletConfigAnnotation = GroupName + "/kubelet-config"

	// ComponentSettingsAnnotation on a control-plane Machine holds, as a
	// JSON map from version to spec.controlPlane.components, the settings
	// its components run at the versions an upgrade moved them to; the
	// control-plane controller writes it in the same patch as the step.
	ComponentSettingsAnnotation = GroupName + "/component-settings"

	// EndpointDrainAnnotation on a control-plane Machine takes its API
	// server out of the cluster endpoint's backends before an upgrade step
	// restarts it (M13); its value is when (RFC 3339). The control-plane
	// controller removes it once the API server is ready at its new version.
	EndpointDrainAnnotation = GroupName + "/endpoint-drain"

	// EtcdMemberIDAnnotation on a stacked control-plane Machine is the ID
	// (hex) of its etcd member, recorded by the control-plane controller the
	// first time it sees the member (matched by the machine's address or
	// name). From then on the member is this ID alone: it is the one removed
	// before the machine goes, and a machine whose member is gone is
	// replaced. Set by the controller; do not edit.
	EtcdMemberIDAnnotation = GroupName + "/etcd-member-id"

	// UpgradeStepAnnotation on a control-plane Machine is the last upgrade
	// step taken on it, as the JSON of an UpgradeStep (with its start),
	// written in the same write as the step itself (the change of
	// spec.versions, or the machine's creation for a Replace upgrade's
	// AddMachine). The step under way, its timeout and the target of a
	// rollback are read from these records, never from status.upgrade,
	// which is written after the step and may lag behind it. The records
	// are taken off once the upgrade is done.
	UpgradeStepAnnotation = GroupName + "/upgrade-step"

	// UpgradeRollbackAnnotation on a Cluster asks the control-plane
	// controller to return the failed or current upgrade step to its
	// previous version (marina upgrade rollback). Its value is the
	// Cluster's metadata.generation: the upgrade holds until the spec
	// changes, after which the annotation no longer applies.
	UpgradeRollbackAnnotation = GroupName + "/upgrade-rollback"

	// PreTerminateHookPrefix: while a Machine being deleted has an
	// annotation with this prefix, the machine controller drains its Node
	// but does not delete the real machine. The control plane uses one to
	// remove a machine's etcd member first (M14); the suffix names the hook.
	PreTerminateHookPrefix = "pre-terminate.delete.hook.cluster.marina.dev/"
	// EtcdMemberHook is the control plane's pre-terminate hook.
	EtcdMemberHook = PreTerminateHookPrefix + "etcd-member"
)

// InstanceKeyAnnotation on a Machine or a Cluster holds the key its
// provider made the machine (or the cluster's endpoint) under: the UID the
// object had when the provider first saw it. marina move writes it on the
// objects it creates on another management plane, where the UIDs are new,
// so that the controller there finds the machines and endpoints that run
// instead of making new ones. An object without it uses its own UID.
const InstanceKeyAnnotation = GroupName + "/instance-key"

// MovedFromAnnotation on an object marina move created holds the UID of
// the object it copies on the source management plane: a move run again
// after a crash finds what it created already by it.
const MovedFromAnnotation = GroupName + "/moved-from"

// InstanceKey is the key a provider knows obj's machine or endpoint by:
// the InstanceKeyAnnotation when set, else obj's UID.
func InstanceKey(obj metav1.Object) types.UID {
	if k := obj.GetAnnotations()[InstanceKeyAnnotation]; k != "" {
		return types.UID(k)
	}
	return obj.GetUID()
}

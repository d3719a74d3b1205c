package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// MachineFinalizer is put on every Machine by the machine controller, so that
// the real machine is drained and deleted before the object goes away.
const MachineFinalizer = "cluster.marina.dev/machine"

// LegacyMachineFinalizer is MachineFinalizer's name before it was
// domain-qualified with a path, as the API server asks (it warned on every
// machine). A machine carrying it is treated as carrying MachineFinalizer,
// and the machine controller replaces it on its next pass.
const LegacyMachineFinalizer = "machine.cluster.marina.dev"

// MachineSpec is the desired state of a machine: the provider-independent
// fields that tooling acts on (M1), and the provider-specific blob.
//
// +kubebuilder:validation:XValidation:rule="has(self.classRef) || has(self.providerSpec)",message="a machine needs a provider configuration: set classRef.name to a MachineClass (kubectl get machineclasses), or set providerSpec to a full provider object with apiVersion and kind",fieldPath=.providerSpec,reason=FieldValueRequired
// +kubebuilder:validation:XValidation:rule="!('ControlPlane' in self.roles) || has(self.versions.controlPlane)",message="versions.controlPlane is required on a machine with the ControlPlane role: set it to the control-plane version this machine runs, e.g. v1.37.2",fieldPath=.versions.controlPlane,reason=FieldValueRequired
// +kubebuilder:validation:XValidation:rule="'ControlPlane' in self.roles || !has(self.versions.controlPlane)",message="versions.controlPlane is only for machines with the ControlPlane role: remove it, or add ControlPlane to roles",fieldPath=.versions.controlPlane,reason=FieldValueForbidden
// +kubebuilder:validation:XValidation:rule="'ControlPlane' in self.roles || !isSemver(self.versions.kubelet, true) || !isSemver(oldSelf.versions.kubelet, true) || (semver(self.versions.kubelet, true).major() == semver(oldSelf.versions.kubelet, true).major() && semver(self.versions.kubelet, true).minor() >= semver(oldSelf.versions.kubelet, true).minor() && semver(self.versions.kubelet, true).minor() <= semver(oldSelf.versions.kubelet, true).minor() + 1)",message="a worker's kubelet may go up by at most one minor version at a time and never down a minor version (Kubernetes version skew policy): e.g. move v1.36.x to v1.37.x first, then to v1.38.x",fieldPath=.versions.kubelet
// +kubebuilder:validation:XValidation:rule="!('ControlPlane' in self.roles) || !isSemver(self.versions.kubelet, true) || !isSemver(oldSelf.versions.kubelet, true) || (semver(self.versions.kubelet, true).major() == semver(oldSelf.versions.kubelet, true).major() && semver(self.versions.kubelet, true).minor() + 1 >= semver(oldSelf.versions.kubelet, true).minor() && semver(self.versions.kubelet, true).minor() <= semver(oldSelf.versions.kubelet, true).minor() + 1)",message="a control-plane machine's kubelet may move by at most one minor version at a time (Kubernetes version skew policy; one minor down is the rollback of an upgrade's step): e.g. move v1.36.x to v1.37.x first, then to v1.38.x",fieldPath=.versions.kubelet
// +kubebuilder:validation:XValidation:rule="!has(self.versions.controlPlane) || !has(oldSelf.versions.controlPlane) || !isSemver(self.versions.controlPlane, true) || !isSemver(oldSelf.versions.controlPlane, true) || (semver(self.versions.controlPlane, true).major() == semver(oldSelf.versions.controlPlane, true).major() && semver(self.versions.controlPlane, true).minor() >= semver(oldSelf.versions.controlPlane, true).minor() && semver(self.versions.controlPlane, true).minor() <= semver(oldSelf.versions.controlPlane, true).minor() + 1)",message="versions.controlPlane may go up by at most one minor version at a time and never down a minor version (Kubernetes version skew policy: kube-apiserver one minor at a time): e.g. move v1.36.x to v1.37.x first, then to v1.38.x",fieldPath=.versions.controlPlane
type MachineSpec struct {
	// clusterName is the name of the Cluster, in the same namespace, that this
	// machine belongs to: a DNS label (providers use it in names and paths).
	// It cannot be changed after creation.
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="must be the name of a Cluster: a DNS label of lower-case letters, digits and '-'"
	ClusterName string `json:"clusterName"`

	// providerID is status.providerID, copied here by the machine controller
	// once the provider has made the machine, because tools written for
	// upstream Cluster API look for it in the spec: cluster-autoscaler's
	// clusterapi provider reads it to find a Node's machine and to count a
	// machine being deleted as leaving. Leave it unset (templates included);
	// once set it cannot change.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="oldSelf == '' || self == oldSelf",message="providerID cannot change once set"
	ProviderID string `json:"providerID,omitempty"`

	// roles are the parts the machine plays in its cluster: ControlPlane,
	// Worker, or both (a control-plane machine that also runs workloads is not
	// given the control-plane NoSchedule taint). Roles cannot be changed after
	// creation: replace the machine instead.
	//
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=2
	Roles []MachineRole `json:"roles"`

	// versions are the Kubernetes versions the machine should run. Changing
	// them upgrades the machine in place, in the order the cluster's upgrade
	// strategy prescribes.
	//
	// +required
	Versions MachineVersions `json:"versions"`

	// containerRuntime is the container runtime the kubelet uses.
	//
	// +optional
	// +kubebuilder:default={name: containerd}
	ContainerRuntime ContainerRuntime `json:"containerRuntime,omitempty"`

	// labels are put on the machine's Node when it registers, added to the
	// labels of the machine's class. A machine may not change a label its
	// class sets: the class's labels are the administrator's.
	//
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Labels map[string]string `json:"labels,omitempty"`

	// taints are put on the machine's Node when it registers, added to the
	// taints of the machine's class; a machine may not change the value of a
	// taint its class sets (same key and effect). Control-plane machines get the
	// node-role.kubernetes.io/control-plane:NoSchedule taint in addition,
	// unless they are also workers.
	//
	// +optional
	// +listType=map
	// +listMapKey=key
	// +listMapKey=effect
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:XValidation:rule="self.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute']",message="each taint's effect must be NoSchedule, PreferNoSchedule or NoExecute",fieldPath=.effect
	Taints []corev1.Taint `json:"taints,omitempty"`

	// kubeletConfigRef points at the kubelet configuration this machine's
	// kubelet runs with (M16). Treat the referenced ConfigMaps as versioned and
	// immutable (kubelet-config-v1, kubelet-config-v2, ...): rolling a fleet to
	// a new configuration means moving machines to the new name a few at a
	// time. When unset, the kubelet runs with marina's defaults.
	//
	// +optional
	KubeletConfigRef *KubeletConfigReference `json:"kubeletConfigRef,omitempty"`

	// classRef names the MachineClass (a flavor such as "large" or "gpu") whose
	// provider configuration and node template this machine uses (M5). With a
	// classRef, providerSpec is optional and holds only the overrides the class
	// allows. It cannot be added, removed or changed after creation.
	//
	// +optional
	ClassRef *MachineClassReference `json:"classRef,omitempty"`

	// providerSpec is the provider-specific configuration of the machine: a
	// complete Kubernetes-style object with apiVersion and kind, whose kind
	// selects the provider that creates the machine, for example
	//
	//   apiVersion: local.marina.dev/v1alpha1
	//   kind: LocalMachine
	//   spec: {cpu: 2, memory: 4Gi}
	//
	// Without classRef it is the whole configuration. With classRef it holds
	// only overrides: it still names the class's apiVersion and kind, and the
	// other fields are merged over the class's providerSpec as a JSON merge
	// patch (RFC 7386); a field the class does not list in allowedOverrides is
	// rejected. Its kind cannot be changed after creation. It may hold at
	// most 64 KiB of JSON: keep large data in a Secret or ConfigMap.
	//
	// +optional
	// +kubebuilder:validation:EmbeddedResource
	// +kubebuilder:pruning:PreserveUnknownFields
	ProviderSpec *runtime.RawExtension `json:"providerSpec,omitempty"`

	// nodeDrainTimeout bounds how long deleting the machine waits for its
	// Node to drain (pods protected by a PodDisruptionBudget can block it);
	// after it, the machine is deleted anyway. Unset waits until the Node is
	// drained. To skip draining entirely, annotate the machine with
	// cluster.marina.dev/exclude-node-draining.
	//
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,5}(ms|s|m|h))+$')",message="must be a duration like 10m, 90s or 1h30m (at most 5 digits per unit)"
	NodeDrainTimeout *metav1.Duration `json:"nodeDrainTimeout,omitempty"`

	// nodeDeletionTimeout bounds how long deleting the machine waits for its
	// workload cluster, counted from the deletion request: while the
	// cluster's API server does not answer, the Node can be neither drained
	// nor removed. After it, the real machine is deleted anyway, without
	// draining or removing the Node (a NodeNotDeleted warning event says
	// so; delete the Node by hand once the cluster answers). It also bounds
	// a Node removal that keeps failing after the real machine is gone,
	// and a provider that cannot delete the real machine (an SSH host gone
	// for good): past it the Machine goes, and a LeftBehind warning event
	// names what was left, which the safety controller's orphan sweep
	// keeps asking the provider to delete. Unset waits for the cluster (upstream Cluster API defaults it to 10s).
	// A machine with the cluster.marina.dev/exclude-node-draining annotation
	// does not wait for an unreachable cluster at all.
	//
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,5}(ms|s|m|h))+$')",message="must be a duration like 10m, 90s or 1h30m (at most 5 digits per unit)"
	NodeDeletionTimeout *metav1.Duration `json:"nodeDeletionTimeout,omitempty"`
}

// MachineVersions are the Kubernetes versions a machine should run.
//
// +kubebuilder:validation:XValidation:rule="!has(self.controlPlane) || !isSemver(self.kubelet, true) || !isSemver(self.controlPlane, true) || !semver(self.kubelet, true).isGreaterThan(semver(self.controlPlane, true))",message="the kubelet must not be newer than the control plane: lower versions.kubelet or raise versions.controlPlane",fieldPath=.kubelet
// +kubebuilder:validation:XValidation:rule="!has(self.controlPlane) || !isSemver(self.kubelet, true) || !isSemver(self.controlPlane, true) || (semver(self.kubelet, true).major() == semver(self.controlPlane, true).major() && semver(self.kubelet, true).minor() + 3 >= semver(self.controlPlane, true).minor())",message="the kubelet may be at most three minor versions older than versions.controlPlane (Kubernetes version skew policy): raise versions.kubelet",fieldPath=.kubelet
type MachineVersions struct {
	// kubelet is the version of the kubelet (and kube-proxy) on the machine,
	// for example v1.37.2. It must not be newer than the cluster's control
	// plane (nor, on a worker, than the oldest API server running), nor more
	// than three minor versions older. On a worker it goes up one minor
	// version at a time and never down one.
	//
	// +required
	Kubelet KubernetesVersion `json:"kubelet"`

	// controlPlane is the version of the control-plane components
	// (kube-apiserver, kube-controller-manager, kube-scheduler) on a machine
	// with the ControlPlane role. The control-plane controller sets it from
	// the Cluster's spec.controlPlane.version; required on control-plane
	// machines, forbidden on workers.
	//
	// +optional
	ControlPlane KubernetesVersion `json:"controlPlane,omitempty"`

	// components, during an InPlace upgrade, are the versions single
	// control-plane components should run where they differ from
	// controlPlane: the control-plane controller moves one component of one
	// machine at a time (M12) and clears this once every component runs the
	// new version. Empty fields follow controlPlane.
	//
	// +optional
	Components *ComponentVersions `json:"components,omitempty"`
}

// ContainerRuntime is the container runtime of a machine.
type ContainerRuntime struct {
	// name of the container runtime, for example containerd or cri-o.
	//
	// +optional
	// +kubebuilder:default=containerd
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name,omitempty"`

	// version of the container runtime, for example 2.1.4. When unset the
	// provider installs the version it pins for the machine's kubelet.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Version string `json:"version,omitempty"`
}

// KubeletConfigStatus is the kubelet configuration a machine runs.
type KubeletConfigStatus struct {
	// name of the ConfigMap the configuration came from.
	// +optional
	Name string `json:"name,omitempty"`
	// hash is sha256 of the document, the first 16 hex digits.
	// +optional
	Hash string `json:"hash,omitempty"`
}

// KubeletConfigReference points at a versioned kubelet configuration.
type KubeletConfigReference struct {
	// name of a ConfigMap in the machine's namespace whose key "kubelet"
	// holds a KubeletConfiguration (kubelet.config.k8s.io) document.
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// MachinePhase is a simple, high-level summary of where a machine is in its
// lifecycle; conditions say why.
//
// +kubebuilder:validation:Enum=Pending;Provisioning;Provisioned;Running;Deleting;Failed
type MachinePhase string

const (
	// MachinePhasePending: the machine is accepted but its provider has not
	// started creating it (for example while its class cannot be resolved or
	// no provider owns its kind).
	MachinePhasePending MachinePhase = "Pending"
	// MachinePhaseProvisioning: the provider is creating the machine.
	MachinePhaseProvisioning MachinePhase = "Provisioning"
	// MachinePhaseProvisioned: the machine exists and has a providerID, but
	// its Node has not registered yet.
	MachinePhaseProvisioned MachinePhase = "Provisioned"
	// MachinePhaseRunning: the machine's Node has registered.
	MachinePhaseRunning MachinePhase = "Running"
	// MachinePhaseDeleting: the machine is being drained and deleted.
	MachinePhaseDeleting MachinePhase = "Deleting"
	// MachinePhaseFailed: the machine hit an error retrying cannot fix; see
	// failureReason and failureMessage. It is replaced, not repaired.
	MachinePhaseFailed MachinePhase = "Failed"
)

// MachineStatus is the observed state of a machine.
//
// The merged provider configuration (class plus overrides) is deliberately not
// recorded here: it is a pure function of the class and the machine's
// overrides (internal/class.Merge), providers find a machine again by its UID
// and providerID rather than by its configuration, and copying it into every
// machine would show users the parts of a class that admins keep from them
// (M6) and duplicate a possibly large blob per machine.
type MachineStatus struct {
	// phase is a one-word summary of the machine's lifecycle: Pending,
	// Provisioning, Provisioned, Running, Deleting or Failed.
	//
	// +optional
	Phase MachinePhase `json:"phase,omitempty"`

	// providerID identifies the real machine at its provider, in the form
	// <provider>://<provider-specific id>; the machine's Node carries the same
	// value in spec.providerID, which is how the two are matched.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=512
	ProviderID string `json:"providerID,omitempty"`

	// nodeRef is the Node this machine registered as in the workload cluster.
	//
	// +optional
	NodeRef *NodeReference `json:"nodeRef,omitempty"`

	// addresses are the machine's network addresses as its provider reports
	// them.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Addresses []MachineAddress `json:"addresses,omitempty"`

	// versions are the versions the machine's components actually run, as
	// last observed.
	//
	// +optional
	Versions MachineObservedVersions `json:"versions,omitempty"`

	// kubeletConfig is the kubelet configuration the machine's kubelet
	// runs, as its agent reports it (M16): the ConfigMap it came from and
	// a hash of the document.
	//
	// +optional
	KubeletConfig *KubeletConfigStatus `json:"kubeletConfig,omitempty"`

	// failureReason is a short, machine-readable word for a failure that
	// needs a person (or the machine's replacement) to fix; empty otherwise.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=256
	FailureReason string `json:"failureReason,omitempty"`

	// failureMessage explains failureReason to an operator and says what to do.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=10240
	FailureMessage string `json:"failureMessage,omitempty"`

	// conditions are the machine's detailed state: Ready, ProviderSpecResolved,
	// Provisioned, NodeReady, UpToDate, Drained, HealthCheckSucceeded.
	//
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the metadata.generation this status describes.
	//
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// NodeReference names a Node of the workload cluster.
type NodeReference struct {
	// name of the Node.
	//
	// +required
	Name string `json:"name"`
	// uid of the Node, telling a re-registered Node of the same name apart.
	//
	// +optional
	UID string `json:"uid,omitempty"`
}

// MachineAddressType is the kind of a machine address.
//
// +kubebuilder:validation:Enum=Hostname;ExternalIP;InternalIP;ExternalDNS;InternalDNS
type MachineAddressType string

// The machine address types, as on a Node.
const (
	MachineHostName    MachineAddressType = "Hostname"
	MachineExternalIP  MachineAddressType = "ExternalIP"
	MachineInternalIP  MachineAddressType = "InternalIP"
	MachineExternalDNS MachineAddressType = "ExternalDNS"
	MachineInternalDNS MachineAddressType = "InternalDNS"
)

// MachineAddress is one network address of a machine.
type MachineAddress struct {
	// type of the address: Hostname, ExternalIP, InternalIP, ExternalDNS or
	// InternalDNS.
	//
	// +required
	Type MachineAddressType `json:"type"`
	// address is the IP address or DNS name.
	//
	// +required
	// +kubebuilder:validation:MaxLength=256
	Address string `json:"address"`
}

// MachineObservedVersions are the component versions observed on a machine.
type MachineObservedVersions struct {
	// kubelet is the version the machine's Node reports
	// (status.nodeInfo.kubeletVersion).
	//
	// +optional
	Kubelet string `json:"kubelet,omitempty"`
	// controlPlane are the versions of the control-plane components running
	// on a control-plane machine, one per component, so that a component-
	// ordered upgrade (all API servers, then all controller managers, then all
	// schedulers) can be followed step by step.
	//
	// +optional
	ControlPlane *ComponentVersions `json:"controlPlane,omitempty"`
}

// Machine is one node of a workload cluster, real or simulated: a VM, a bare
// metal host or a local sandbox. The machine controller and the provider that
// owns the kind of its providerSpec make the real machine match it.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=machines,scope=Namespaced,shortName=ma,categories=marina
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterName`
// +kubebuilder:selectablefield:JSONPath=`.spec.clusterName`
// +kubebuilder:printcolumn:name="Roles",type=string,JSONPath=`.spec.roles[*]`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.versions.kubelet`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.nodeRef.name`
// +kubebuilder:printcolumn:name="Instance",type=string,JSONPath=`.status.conditions[?(@.type=="InstanceRunning")].reason`
// +kubebuilder:printcolumn:name="Class",type=string,JSONPath=`.spec.classRef.name`,priority=1
// +kubebuilder:printcolumn:name="ProviderID",type=string,JSONPath=`.status.providerID`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Machine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state of the machine.
	//
	// +required
	// +kubebuilder:validation:XValidation:rule="self.clusterName == oldSelf.clusterName",message="clusterName cannot be changed after creation: create a new machine in the other cluster and delete this one",fieldPath=.clusterName
	// +kubebuilder:validation:XValidation:rule="self.roles == oldSelf.roles",message="roles cannot be changed after creation: create a machine with the new roles and delete this one",fieldPath=.roles
	// +kubebuilder:validation:XValidation:rule="has(self.classRef) == has(oldSelf.classRef) && (!has(self.classRef) || self.classRef.name == oldSelf.classRef.name)",message="classRef cannot be added, removed or changed after creation: create a machine of the other class and delete this one",fieldPath=.classRef
	// +kubebuilder:validation:XValidation:rule="!has(self.providerSpec) || !has(oldSelf.providerSpec) || (self.providerSpec.kind == oldSelf.providerSpec.kind && self.providerSpec.apiVersion.split('/')[0] == oldSelf.providerSpec.apiVersion.split('/')[0])",message="providerSpec kind and API group cannot be changed after creation: they choose the provider that owns the machine; create a new machine for the other provider and delete this one",fieldPath=.providerSpec
	Spec MachineSpec `json:"spec"`

	// status is the observed state of the machine, written by its controllers.
	//
	// +optional
	Status MachineStatus `json:"status,omitempty"`
}

// MachineList is a list of Machines.
//
// +kubebuilder:object:root=true
type MachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the machines.
	Items []Machine `json:"items"`
}

// ControlPlaneComponents resolves controlPlane and components: the version
// each control-plane component should run (a component without a version
// of its own runs controlPlane; etcd is empty unless set). All empty on a
// worker.
func (v *MachineVersions) ControlPlaneComponents() ComponentVersions {
	cp := string(v.ControlPlane)
	if cp == "" {
		return ComponentVersions{}
	}
	out := ComponentVersions{APIServer: cp, ControllerManager: cp, Scheduler: cp}
	if c := v.Components; c != nil {
		if c.APIServer != "" {
			out.APIServer = c.APIServer
		}
		if c.ControllerManager != "" {
			out.ControllerManager = c.ControllerManager
		}
		if c.Scheduler != "" {
			out.Scheduler = c.Scheduler
		}
		out.Etcd = c.Etcd
	}
	return out
}

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// ClusterFinalizer is put on every Cluster by the cluster controller, so that
// its machines are deleted before the object goes away.
const ClusterFinalizer = "cluster.marina.dev/cluster"

// LegacyClusterFinalizer is ClusterFinalizer's name before it was
// domain-qualified with a path (see LegacyMachineFinalizer); the cluster
// controller honours it and replaces it.
const LegacyClusterFinalizer = "cluster.cluster.marina.dev"

// ClusterSpec is the desired state of a workload cluster.
//
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.controlPlaneEndpoint) || !has(oldSelf.controlPlaneEndpoint.host) || oldSelf.controlPlaneEndpoint.host.size() == 0 || (has(self.controlPlaneEndpoint) && has(self.controlPlaneEndpoint.host) && self.controlPlaneEndpoint == oldSelf.controlPlaneEndpoint)",message="controlPlaneEndpoint cannot be removed or changed once set: certificates and kubeconfigs name it; put a load balancer or DNS name in front instead",fieldPath=.controlPlaneEndpoint
type ClusterSpec struct {
	// paused stops every marina controller from acting on this cluster and its
	// machines (for maintenance by hand, or while moving it between management
	// planes) until it is set back to false.
	//
	// +optional
	Paused bool `json:"paused,omitempty"`

	// clusterNetwork is the cluster's pod and service networking. It cannot be
	// changed after creation.
	//
	// +optional
	// +kubebuilder:default={}
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="clusterNetwork cannot be changed after creation: pods and services already use these networks; create a new cluster to renumber"
	ClusterNetwork ClusterNetwork `json:"clusterNetwork,omitempty"`

	// controlPlaneEndpoint is the address clients reach the workload
	// cluster's API server at. Leave it empty to let the provider choose one;
	// once set (by you or by marina) it cannot be changed, because the API
	// server's certificates and every kubeconfig name it.
	//
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(oldSelf.host) || oldSelf.host == '' || self == oldSelf",message="controlPlaneEndpoint cannot be changed once set: certificates and kubeconfigs name it; put a load balancer or DNS name in front instead"
	ControlPlaneEndpoint APIEndpoint `json:"controlPlaneEndpoint,omitempty"`

	// controlPlane is the control plane's configuration and versions (M8).
	//
	// +required
	ControlPlane ControlPlaneSpec `json:"controlPlane"`
}

// ClusterNetwork is a cluster's networking.
//
// +kubebuilder:validation:XValidation:rule="!has(self.pods) || !has(self.services) || self.pods.all(p, self.services.all(s, !isCIDR(p) || !isCIDR(s) || (!cidr(p).containsCIDR(cidr(s)) && !cidr(s).containsCIDR(cidr(p)))))",message="pod and service networks must not overlap: pick disjoint ranges, e.g. pods 10.244.0.0/16 and services 10.96.0.0/12",fieldPath=.pods
type ClusterNetwork struct {
	// pods are the networks pod IPs are allocated from: one, or one IPv4 and
	// one IPv6 network for dual-stack. Default 10.244.0.0/16.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:default={"10.244.0.0/16"}
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:XValidation:rule="self.size() < 2 || !isCIDR(self[0]) || !isCIDR(self[1]) || cidr(self[0]).ip().family() != cidr(self[1]).ip().family()",message="two pod networks must be one IPv4 and one IPv6 network (dual-stack): remove one of them"
	Pods []CIDR `json:"pods,omitempty"`

	// services are the networks Service cluster IPs are allocated from: one,
	// or one IPv4 and one IPv6 network for dual-stack. Default 10.96.0.0/12,
	// which is also the largest IPv4 network kube-apiserver accepts; an IPv6
	// network may be at most a /108.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:default={"10.96.0.0/12"}
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:XValidation:rule="self.size() < 2 || !isCIDR(self[0]) || !isCIDR(self[1]) || cidr(self[0]).ip().family() != cidr(self[1]).ip().family()",message="two service networks must be one IPv4 and one IPv6 network (dual-stack): remove one of them"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || cidr(self).prefixLength() >= (cidr(self).ip().family() == 4 ? 12 : 108)",message="is larger than kube-apiserver accepts for services (at most 20 host bits): use a /12 or smaller IPv4 network, a /108 or smaller IPv6 network"
	Services []CIDR `json:"services,omitempty"`

	// dnsDomain is the cluster's DNS domain. Default cluster.local.
	//
	// +optional
	// +kubebuilder:default=cluster.local
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="must be a DNS domain such as cluster.local: lower-case letters, digits and '-', in dot-separated labels"
	// +kubebuilder:validation:XValidation:rule="self.split('.').all(l, l.size() <= 63)",message="each dot-separated label of a DNS domain may be at most 63 characters"
	DNSDomain string `json:"dnsDomain,omitempty"`
}

// APIEndpoint is a host and port at which an API server is reached.
type APIEndpoint struct {
	// host is the DNS name or IP address.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Host string `json:"host,omitempty"`

	// port is the TCP port.
	//
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`
}

// ControlPlaneSpec is the desired control plane of a cluster. The
// control-plane controller creates and upgrades the control-plane Machines
// from it (M9).
//
// +kubebuilder:validation:XValidation:rule="has(self.classRef) || has(self.providerSpec)",message="the control plane needs a provider configuration for its machines: set classRef.name to a MachineClass, or providerSpec to a full provider object with apiVersion and kind",fieldPath=.providerSpec,reason=FieldValueRequired
// +kubebuilder:validation:XValidation:rule="self.etcd.type != 'Stacked' || self.replicas % 2 == 1",message="with stacked etcd, control-plane replicas must be odd (1, 3, 5 or 7) so that etcd keeps a quorum: change replicas, or use external etcd",fieldPath=.replicas
// +kubebuilder:validation:XValidation:rule="has(self.caSecretRef) == has(oldSelf.caSecretRef)",message="caSecretRef cannot be added or removed after creation: every certificate of the cluster is signed by its CA; create a new cluster to change the CA",fieldPath=.caSecretRef
type ControlPlaneSpec struct {
	// version is the Kubernetes version of the control plane, for example
	// v1.37.2. Changing it upgrades the cluster (M11): one minor version at a
	// time, never down a minor version, in the order upgradeStrategy says.
	//
	// +required
	// +kubebuilder:validation:XValidation:rule="!isSemver(self, true) || !isSemver(oldSelf, true) || (semver(self, true).major() == semver(oldSelf, true).major() && semver(self, true).minor() >= semver(oldSelf, true).minor() && semver(self, true).minor() <= semver(oldSelf, true).minor() + 1)",message="version may go up by at most one minor version at a time and never down a minor version (Kubernetes version skew policy): e.g. upgrade v1.36.x to v1.37.x first, then to v1.38.x"
	Version KubernetesVersion `json:"version"`

	// replicas is the number of control-plane machines: 1 for a test cluster,
	// 3 or 5 for high availability. Odd with stacked etcd.
	//
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=9
	Replicas int32 `json:"replicas,omitempty"`

	// allowWorkloads gives control-plane machines the Worker role too, so they
	// are not tainted NoSchedule and run ordinary pods (small clusters).
	//
	// +optional
	AllowWorkloads bool `json:"allowWorkloads,omitempty"`

	// classRef names the MachineClass control-plane machines are made from.
	//
	// +optional
	ClassRef *MachineClassReference `json:"classRef,omitempty"`

	// providerSpec is the provider configuration of control-plane machines:
	// the full object without classRef, or the class's allowed overrides with
	// it, exactly as in a Machine's spec.providerSpec. At most 64 KiB of JSON.
	//
	// +optional
	// +kubebuilder:validation:EmbeddedResource
	// +kubebuilder:pruning:PreserveUnknownFields
	ProviderSpec *runtime.RawExtension `json:"providerSpec,omitempty"`

	// components holds settings of the control-plane components.
	//
	// +optional
	Components ControlPlaneComponents `json:"components,omitempty"`

	// etcd chooses where the cluster's etcd runs (M14). Default: stacked.
	//
	// +optional
	// +kubebuilder:default={type: Stacked}
	Etcd EtcdSpec `json:"etcd,omitempty"`

	// caSecretRef names a Secret (type kubernetes.io/tls, keys tls.crt and
	// tls.key) in the cluster's namespace holding your own signing CA. When
	// unset, marina generates a CA for the cluster (M15). It cannot be added
	// or removed after creation, and the CA in it must not change: marina
	// cannot rotate a cluster's CA yet, and the cluster reports a CA that
	// expires within 90 days (CertificatesAvailable, reason CAExpiringSoon).
	//
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="caSecretRef cannot be changed after creation: every certificate of the cluster is signed by its CA, and marina cannot rotate a cluster's CA yet (replacing the CA inside the referenced Secret breaks the cluster too): create a new cluster with the new CA and move the workloads"
	CASecretRef *SecretReference `json:"caSecretRef,omitempty"`

	// certificateValidity is how long the certificates a control-plane
	// machine issues itself (its API server's, its etcd member's, its
	// components' client certificates) are valid, as kubeadm's
	// certificateValidityPeriod: 2 years (17520h) when unset, never beyond
	// the CA. A machine renews them before they end, 30 days before or in
	// the last third of their life when that is shorter, and restarts its
	// API server, controller manager and scheduler on the new ones (etcd
	// reads its own again for every connection). A change applies to each
	// machine at its next renewal, or when it is made or upgraded.
	//
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,5}(ms|s|m|h))+$')",message="must be a duration like 8760h, 90m or 1h30m (at most 5 digits per unit)"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^([0-9]{1,5}(ms|s|m|h))+$') || duration(self) >= duration('1m')",message="certificateValidity must be at least 1m: a machine renews its certificates in the last third of their life and restarts its components each time"
	CertificateValidity *metav1.Duration `json:"certificateValidity,omitempty"`

	// upgradeStrategy is how a version change is carried out.
	//
	// +optional
	// +kubebuilder:default={type: InPlace}
	UpgradeStrategy ControlPlaneUpgradeStrategy `json:"upgradeStrategy,omitempty"`
}

// ControlPlaneComponents are settings of the control-plane components.
type ControlPlaneComponents struct {
	// apiServer holds kube-apiserver settings.
	// +optional
	APIServer ComponentSettings `json:"apiServer,omitempty"`
	// controllerManager holds kube-controller-manager settings.
	// +optional
	ControllerManager ComponentSettings `json:"controllerManager,omitempty"`
	// scheduler holds kube-scheduler settings.
	// +optional
	Scheduler ComponentSettings `json:"scheduler,omitempty"`
}

// ComponentSettings are settings of one control-plane component.
type ComponentSettings struct {
	// extraArgs are command-line flags added to the component's, without the
	// leading dashes: {"v": "2", "audit-log-maxage": "30"}. They tune how the
	// component behaves, not how it is wired: a flag marina sets, and any
	// flag naming an address, port, file, credential, key or etcd, is refused
	// (docs/security.md lists them).
	//
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('-'))",message="write flag names without the leading dashes: audit-log-maxage, not --audit-log-maxage"
	ExtraArgs map[string]string `json:"extraArgs,omitempty"`
}

// EtcdType is where a cluster's etcd runs.
//
// +kubebuilder:validation:Enum=Stacked;External
type EtcdType string

const (
	// EtcdStacked runs one etcd member on each control-plane machine; marina
	// manages the membership as machines come and go, never losing quorum.
	EtcdStacked EtcdType = "Stacked"
	// EtcdExternal uses an etcd cluster marina does not manage.
	EtcdExternal EtcdType = "External"
)

// EtcdSpec is the cluster's etcd.
//
// +kubebuilder:validation:XValidation:rule="self.type != 'External' || has(self.external)",message="etcd type External needs external.endpoints: list the client URLs of your etcd cluster, or use type Stacked",fieldPath=.external,reason=FieldValueRequired
// +kubebuilder:validation:XValidation:rule="self.type == 'External' || !has(self.external)",message="external is only used with etcd type External: remove it, or set type to External",fieldPath=.external,reason=FieldValueForbidden
type EtcdSpec struct {
	// type is Stacked (default: an etcd member on every control-plane
	// machine) or External (an etcd cluster you run). It cannot be changed
	// after creation.
	//
	// +optional
	// +kubebuilder:default=Stacked
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="etcd type cannot be changed after creation: the cluster's data lives there; create a new cluster and restore a backup into it"
	Type EtcdType `json:"type,omitempty"`

	// external is the etcd cluster to use with type External.
	//
	// +optional
	External *ExternalEtcd `json:"external,omitempty"`
}

// ExternalEtcd is an etcd cluster marina does not manage.
type ExternalEtcd struct {
	// endpoints are the client URLs of the etcd members, for example
	// https://10.0.0.5:2379.
	//
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=512
	// +kubebuilder:validation:items:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''",message="must be an etcd client URL like https://10.0.0.5:2379"
	Endpoints []string `json:"endpoints"`

	// secretRef names a Secret in the cluster's namespace with the client
	// certificate for etcd: keys ca.crt, tls.crt and tls.key.
	//
	// +optional
	SecretRef *SecretReference `json:"secretRef,omitempty"`
}

// ControlPlaneUpgradeStrategyType is how the control plane is upgraded.
//
// +kubebuilder:validation:Enum=InPlace;Replace
type ControlPlaneUpgradeStrategyType string

const (
	// InPlaceUpgrade upgrades the components on the existing machines in the
	// safe order (M12): kube-apiserver on every control-plane machine, then
	// kube-controller-manager on each, then kube-scheduler on each, then the
	// kubelets; one machine at a time, each step gated on health.
	InPlaceUpgrade ControlPlaneUpgradeStrategyType = "InPlace"
	// ReplaceUpgrade replaces control-plane machines one at a time by new ones
	// at the new version (create one, wait until healthy, delete an old one);
	// also the way to roll the operating system.
	ReplaceUpgrade ControlPlaneUpgradeStrategyType = "Replace"
)

// ControlPlaneUpgradeStrategy is how the control plane is upgraded.
type ControlPlaneUpgradeStrategy struct {
	// type is InPlace (default: upgrade the components on the existing
	// machines, API servers first, then controller managers, then schedulers,
	// then kubelets) or Replace (replace machines one at a time).
	//
	// +optional
	// +kubebuilder:default=InPlace
	Type ControlPlaneUpgradeStrategyType `json:"type,omitempty"`

	// stepTimeout is how long a single upgrade step (one component on one
	// machine, or one machine replacement) may take to become healthy before
	// the upgrade stops and reports it in the UpgradeProgressing condition.
	// Default 10m.
	//
	// +optional
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,5}(ms|s|m|h))+$')",message="must be a duration like 10m, 90s or 1h30m (at most 5 digits per unit)"
	StepTimeout *metav1.Duration `json:"stepTimeout,omitempty"`
}

// ClusterPhase is a one-word summary of a cluster's lifecycle.
//
// +kubebuilder:validation:Enum=Pending;Provisioning;Provisioned;Deleting;Failed
type ClusterPhase string

const (
	// ClusterPhasePending: the cluster is accepted; nothing has been created.
	ClusterPhasePending ClusterPhase = "Pending"
	// ClusterPhaseProvisioning: certificates, endpoint and the first
	// control-plane machine are being created.
	ClusterPhaseProvisioning ClusterPhase = "Provisioning"
	// ClusterPhaseProvisioned: the control plane answers.
	ClusterPhaseProvisioned ClusterPhase = "Provisioned"
	// ClusterPhaseDeleting: the cluster's machines are being deleted.
	ClusterPhaseDeleting ClusterPhase = "Deleting"
	// ClusterPhaseFailed: the cluster hit an error retrying cannot fix; see
	// its conditions.
	ClusterPhaseFailed ClusterPhase = "Failed"
)

// ClusterStatus is the observed state of a cluster.
type ClusterStatus struct {
	// phase is a one-word summary: Pending, Provisioning, Provisioned,
	// Deleting or Failed.
	//
	// +optional
	Phase ClusterPhase `json:"phase,omitempty"`

	// controlPlane is the observed state of the control plane.
	//
	// +optional
	ControlPlane ControlPlaneStatus `json:"controlPlane,omitempty"`

	// conditions are the cluster's detailed state: Ready,
	// CertificatesAvailable, ControlPlaneInitialized, ControlPlaneReady,
	// EtcdHealthy, UpgradeProgressing, Paused.
	//
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// upgrade is the control-plane upgrade under way or last finished: its
	// plan, every step with its state, and the current one (M11).
	//
	// +optional
	Upgrade *UpgradeStatus `json:"upgrade,omitempty"`

	// observedGeneration is the metadata.generation this status describes.
	//
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// UpgradeStatus is the plan and progress of a control-plane upgrade.
type UpgradeStatus struct {
	// from is the oldest version any API server ran when the upgrade began.
	// +optional
	From string `json:"from,omitempty"`
	// to is the version being upgraded to.
	// +optional
	To string `json:"to,omitempty"`
	// strategy is InPlace or Replace.
	// +optional
	Strategy ControlPlaneUpgradeStrategyType `json:"strategy,omitempty"`
	// startedAt is when the upgrade began.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// completedAt is when every step was done.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`
	// current is the step being carried out; empty between steps and when
	// done.
	// +optional
	Current *UpgradeStep `json:"current,omitempty"`
	// steps are the steps of an InPlace upgrade in the order they are
	// taken, each with its state; a Replace upgrade lists its machines.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Steps []UpgradeStep `json:"steps,omitempty"`
	// rolledBackGeneration is the generation whose upgrade was rolled back
	// (marina upgrade rollback): no step is taken until the spec changes.
	// +optional
	RolledBackGeneration int64 `json:"rolledBackGeneration,omitempty"`
}

// UpgradeStepState is where one step of an upgrade is.
//
// +kubebuilder:validation:Enum=Pending;Running;Done;Failed;RolledBack
type UpgradeStepState string

// Upgrade step states.
const (
	UpgradeStepPending    UpgradeStepState = "Pending"
	UpgradeStepRunning    UpgradeStepState = "Running"
	UpgradeStepDone       UpgradeStepState = "Done"
	UpgradeStepFailed     UpgradeStepState = "Failed"
	UpgradeStepRolledBack UpgradeStepState = "RolledBack"
)

// UpgradeStep is one step of an upgrade: one component on one machine
// (InPlace), one machine added or removed (Replace), or the workers.
type UpgradeStep struct {
	// action is SetComponent, AddMachine, RemoveMachine or RollWorkers.
	// +kubebuilder:validation:MaxLength=32
	Action string `json:"action"`
	// machine is the control-plane machine the step is about.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Machine string `json:"machine,omitempty"`
	// component is kube-apiserver, kube-controller-manager, kube-scheduler,
	// etcd or kubelet.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Component string `json:"component,omitempty"`
	// from and to are the versions.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	From string `json:"from,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=64
	To string `json:"to,omitempty"`
	// state is Pending, Running, Done, Failed or RolledBack.
	// +optional
	State UpgradeStepState `json:"state,omitempty"`
	// startedAt is when the step began.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
}

// ControlPlaneStatus is the observed state of a control plane.
type ControlPlaneStatus struct {
	// version is the control-plane version every component on every
	// control-plane machine runs; empty while they differ (during an upgrade).
	//
	// +optional
	Version string `json:"version,omitempty"`

	// components are the oldest version of each component across the
	// control-plane machines, which shows how far an upgrade has come.
	//
	// +optional
	Components ComponentVersions `json:"components,omitempty"`

	// replicas is the number of control-plane machines.
	//
	// +optional
	Replicas int32 `json:"replicas"`

	// readyReplicas is the number of control-plane machines whose components
	// are all healthy.
	//
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`

	// updatedReplicas is the number of control-plane machines that run
	// spec.controlPlane.version.
	//
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas"`
}

// Cluster is a Kubernetes cluster managed by marina: its networking, its
// endpoint and its control plane (M8). Its control-plane machines are
// Machines with the ControlPlane role and spec.clusterName set to it.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=clusters,scope=Namespaced,shortName=cl,categories=marina
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63",message="metadata.name must be at most 63 characters for a cluster, because it is used as a label value: choose a shorter name"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.controlPlane.version`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.spec.controlPlane.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.controlPlane.readyReplicas`
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.spec.controlPlaneEndpoint.host`,priority=1
// +kubebuilder:printcolumn:name="Paused",type=boolean,JSONPath=`.spec.paused`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Cluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state of the cluster.
	//
	// +required
	Spec ClusterSpec `json:"spec"`

	// status is the observed state of the cluster, written by its controllers.
	//
	// +optional
	Status ClusterStatus `json:"status,omitempty"`
}

// ClusterList is a list of Clusters.
//
// +kubebuilder:object:root=true
type ClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the clusters.
	Items []Cluster `json:"items"`
}

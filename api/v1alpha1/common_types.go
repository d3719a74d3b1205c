package v1alpha1

// Well-known labels and annotations.
const (
	// ClusterNameLabel is set by marina on every Machine, MachineSet and
	// MachineDeployment to the name of the Cluster it belongs to, so that
	// `kubectl get machines -l cluster.marina.dev/cluster-name=prod` works.
	ClusterNameLabel = GroupName + "/cluster-name"

	// AutoscalerMinSizeAnnotation on a MachineSet or MachineDeployment is the
	// smallest number of replicas a cluster autoscaler may scale it down to
	// (a non-negative integer, "0" allows scale to zero) (M7). The name is the
	// one cluster-autoscaler's clusterapi provider reads when run with
	// CAPI_GROUP=cluster.marina.dev.
	AutoscalerMinSizeAnnotation = GroupName + "/cluster-api-autoscaler-node-group-min-size"

	// AutoscalerMaxSizeAnnotation on a MachineSet or MachineDeployment is the
	// largest number of replicas a cluster autoscaler may scale it up to (a
	// non-negative integer, at least the min size). A node group without both
	// annotations is not autoscaled (M7).
	AutoscalerMaxSizeAnnotation = GroupName + "/cluster-api-autoscaler-node-group-max-size"

	// DeleteMachineAnnotation on a Machine of a MachineSet makes it the first
	// to go when the set shrinks, before unhealthy machines and before the
	// delete policy's choice. Cluster autoscalers set it on the machine of the
	// node they remove, then lower replicas. The value is ignored.
	DeleteMachineAnnotation = GroupName + "/delete-machine"

	// MachineDeploymentNameLabel is put on every MachineSet (and its
	// Machines) made by a MachineDeployment, with the deployment's name. It
	// keeps upstream Cluster API's group because cluster-autoscaler's
	// clusterapi provider reads this exact key whatever its CAPI_GROUP.
	MachineDeploymentNameLabel = "cluster.x-k8s.io/deployment-name"

	// MachineTemplateHashLabel is put by a MachineDeployment on each of its
	// MachineSets, their selectors and their machines: a hash of the template
	// the set was made from, so that sets of different revisions never claim
	// each other's machines. Set by the controller; do not edit.
	MachineTemplateHashLabel = GroupName + "/machine-template-hash"

	// RevisionAnnotation on a MachineSet made by a MachineDeployment is the
	// revision (1, 2, 3, ...) of the template it holds; on the deployment, the
	// revision of its current template. A template that comes back (a
	// rollback) gets a new, higher revision.
	RevisionAnnotation = GroupName + "/revision"

	// UpstreamRevisionAnnotation carries the same revision as
	// RevisionAnnotation, on the same objects, under upstream Cluster API's
	// key. cluster-autoscaler's clusterapi provider reads this exact key
	// whatever its CAPI_GROUP: without it on the MachineSets it takes every
	// MachineDeployment for one that is rolling out, and never scales it
	// down (docs/autoscaling.md). Set by the controller; do not edit.
	UpstreamRevisionAnnotation = "machinedeployment.clusters.x-k8s.io/revision"

	// DesiredReplicasAnnotation on a MachineSet made by a MachineDeployment
	// is the deployment's spec.replicas when the set's replicas were last
	// written. A set whose value differs from the deployment's replicas
	// tells the controller the deployment was scaled since, which it then
	// spreads over its sets in proportion to their sizes, as a Deployment's
	// desired-replicas annotation does. Set by the controller; do not edit.
	DesiredReplicasAnnotation = GroupName + "/desired-replicas"

	// RollbackToRevisionAnnotation on a MachineDeployment asks the controller
	// to put back the template of an earlier revision (the number of a
	// MachineSet's revision annotation, or "0" for the one before the
	// current). The controller copies that template into spec.template,
	// which rolls the machines as any template change does, and removes the
	// annotation. An unknown revision is reported in the Progressing
	// condition and the annotation is removed.
	RollbackToRevisionAnnotation = GroupName + "/rollback-to-revision"

	// NodeMachineAnnotation is put on each Node a marina Machine owns, with
	// the machine's name (its namespace is in NodeClusterNamespaceAnnotation);
	// cluster-autoscaler maps Nodes to Machines by the two.
	NodeMachineAnnotation = GroupName + "/machine"

	// NodeClusterNameAnnotation is put on each Node a marina Machine owns,
	// with the name of the machine's Cluster.
	NodeClusterNameAnnotation = GroupName + "/cluster-name"

	// NodeClusterNamespaceAnnotation is put on each Node a marina Machine
	// owns, with the namespace of the machine's Cluster.
	NodeClusterNamespaceAnnotation = GroupName + "/cluster-namespace"

	// PausedAnnotation on any marina object stops its controller from changing
	// it or the world on its behalf until the annotation is removed; for a
	// whole cluster, set Cluster.spec.paused instead.
	PausedAnnotation = GroupName + "/paused"

	// FrozenAnnotation on a MachineSet is set and removed by the safety
	// controller (FrozenCondition); its value says why.
	FrozenAnnotation = GroupName + "/frozen"
)

// KubernetesVersion is a Kubernetes release version as its components report
// it, with a leading "v": v1.37.2, or a pre-release such as v1.38.0-rc.1.
//
// +kubebuilder:validation:MinLength=6
// +kubebuilder:validation:MaxLength=64
// +kubebuilder:validation:XValidation:rule="self.matches('^v(0|[1-9][0-9]*)[.](0|[1-9][0-9]*)[.](0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$')",message="must be a Kubernetes release version like v1.37.2: a leading v, then major.minor.patch"
type KubernetesVersion string

// VersionPattern is a KubernetesVersion's format (the schema rule above) and
// that of a component's version in a Machine's spec.versions.components,
// which the admission webhook checks: versions name binaries on a host and
// reach shell commands there, so nothing but these characters may pass.
const VersionPattern = `^v(0|[1-9][0-9]*)[.](0|[1-9][0-9]*)[.](0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`

// CIDR is an IPv4 or IPv6 network in CIDR notation, like 10.244.0.0/16 or
// fd00:10:244::/56, written with its host bits zero.
//
// +kubebuilder:validation:MaxLength=43
// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="must be a network in CIDR notation like 10.244.0.0/16 or fd00::/64"
// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="must be written with its host bits zero: use the network address, e.g. 10.244.0.0/16 rather than 10.244.1.7/16"
type CIDR string

// MachineRole is a role a machine plays in its cluster.
//
// +kubebuilder:validation:Enum=ControlPlane;Worker
type MachineRole string

const (
	// ControlPlaneRole machines run the control plane: kube-apiserver,
	// kube-controller-manager, kube-scheduler and, with stacked etcd, an etcd
	// member. They are tainted unschedulable unless they are also workers.
	ControlPlaneRole MachineRole = "ControlPlane"
	// WorkerRole machines run the cluster's workloads.
	WorkerRole MachineRole = "Worker"
)

// MachineClassReference names a MachineClass.
type MachineClassReference struct {
	// name of the cluster-scoped MachineClass (`kubectl get machineclasses`).
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// SecretReference names a Secret in the namespace of the object that holds
// the reference.
type SecretReference struct {
	// name of the Secret, in the same namespace as the referring object.
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// ComponentVersions are the versions of the control-plane components.
type ComponentVersions struct {
	// apiServer is the version of kube-apiserver.
	// +optional
	APIServer string `json:"apiServer,omitempty"`
	// controllerManager is the version of kube-controller-manager.
	// +optional
	ControllerManager string `json:"controllerManager,omitempty"`
	// scheduler is the version of kube-scheduler.
	// +optional
	Scheduler string `json:"scheduler,omitempty"`
	// etcd is the version of the etcd member on this machine (stacked etcd),
	// for example v3.6.16; empty with external etcd.
	// +optional
	Etcd string `json:"etcd,omitempty"`
}

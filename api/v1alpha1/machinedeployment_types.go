package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// MachineDeploymentStrategyType is how a MachineDeployment replaces machines
// when its template changes.
//
// +kubebuilder:validation:Enum=RollingUpdate;OnDelete
type MachineDeploymentStrategyType string

const (
	// RollingUpdateStrategy replaces old machines with new ones gradually,
	// within the bounds of maxSurge and maxUnavailable.
	RollingUpdateStrategy MachineDeploymentStrategyType = "RollingUpdate"
	// OnDeleteStrategy replaces a machine only after someone deletes it.
	OnDeleteStrategy MachineDeploymentStrategyType = "OnDelete"
)

// MachineDeploymentStrategy is how machines are replaced.
//
// +kubebuilder:validation:XValidation:rule="self.type == 'RollingUpdate' || !has(self.rollingUpdate)",message="rollingUpdate is only used with type RollingUpdate: remove it, or set type to RollingUpdate",fieldPath=.rollingUpdate,reason=FieldValueForbidden
type MachineDeploymentStrategy struct {
	// type is RollingUpdate (the default: replace machines gradually) or
	// OnDelete (create a replacement only when a machine is deleted).
	//
	// +optional
	// +kubebuilder:default=RollingUpdate
	Type MachineDeploymentStrategyType `json:"type,omitempty"`

	// rollingUpdate bounds a RollingUpdate.
	//
	// +optional
	RollingUpdate *MachineRollingUpdate `json:"rollingUpdate,omitempty"`
}

// MachineRollingUpdate bounds how many machines a rolling update adds or
// takes away at a time.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.maxSurge) && has(self.maxUnavailable) && (self.maxSurge == 0 || self.maxSurge == '0%') && (self.maxUnavailable == 0 || self.maxUnavailable == '0%'))",message="maxSurge and maxUnavailable cannot both be zero, or the rollout could never make progress: raise one of them",fieldPath=.maxSurge
type MachineRollingUpdate struct {
	// maxSurge is how many machines may exist above the desired replicas
	// during the update: a number (1) or a percentage of replicas ("25%",
	// rounded up). Default 1.
	//
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="must be a non-negative number of machines (1) or a percentage from 0% to 100% (25%)"
	MaxSurge *intstr.IntOrString `json:"maxSurge,omitempty"`

	// maxUnavailable is how many of the desired replicas may be unavailable
	// during the update: a number (0) or a percentage of replicas ("25%",
	// rounded down). Default 0: capacity never drops below replicas.
	//
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="must be a non-negative number of machines (1) or a percentage from 0% to 100% (25%)"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
}

// MachineDeploymentSpec is the desired state of a MachineDeployment.
//
// +kubebuilder:validation:XValidation:rule="self.template.spec.clusterName == self.clusterName",message="template.spec.clusterName must equal clusterName: a deployment only creates machines of its own cluster",fieldPath=.template.spec.clusterName
// +kubebuilder:validation:XValidation:rule="(has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0) || (has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0)",message="selector must not be empty: set matchLabels to the template's labels (an empty selector would adopt and delete every machine in the namespace)",fieldPath=.selector
// +kubebuilder:validation:XValidation:rule="!('ControlPlane' in self.template.spec.roles)",message="a deployment makes workers only: remove ControlPlane from template.spec.roles; control-plane machines come from the Cluster's spec.controlPlane, which keeps etcd quorum",fieldPath=.template.spec.roles,reason=FieldValueForbidden
type MachineDeploymentSpec struct {
	// clusterName is the name of the Cluster, in the same namespace, that the
	// deployment's machines belong to. It cannot be changed after creation.
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	ClusterName string `json:"clusterName"`

	// replicas is the number of machines the deployment keeps. It is the scale
	// subresource, so `kubectl scale` and autoscalers change it.
	//
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	Replicas *int32 `json:"replicas,omitempty"`

	// selector finds the deployment's machines by label; it must match the
	// labels of template.metadata (the controller reports a mismatch in the
	// Ready condition) and cannot be changed after creation.
	//
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="selector cannot be changed after creation: create a new deployment and scale this one to zero"
	Selector metav1.LabelSelector `json:"selector"`

	// template is what the machines look like. Changing it rolls the
	// machines according to strategy.
	//
	// +required
	Template MachineTemplateSpec `json:"template"`

	// strategy is how machines are replaced when the template changes.
	// Default: RollingUpdate with maxSurge 1 and maxUnavailable 0.
	//
	// +optional
	// +kubebuilder:default={type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
	Strategy *MachineDeploymentStrategy `json:"strategy,omitempty"`

	// deletePolicy chooses which machines go first when the deployment
	// shrinks: Random (default), Newest or Oldest.
	//
	// +optional
	// +kubebuilder:default=Random
	DeletePolicy MachineDeletePolicy `json:"deletePolicy,omitempty"`

	// minReadySeconds is how long a new machine's Node must be Ready before
	// the machine counts as available and the rollout moves on.
	//
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	MinReadySeconds int32 `json:"minReadySeconds,omitempty"`

	// revisionHistoryLimit is how many old, scaled-down MachineSets are kept
	// for rollback.
	//
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	RevisionHistoryLimit *int32 `json:"revisionHistoryLimit,omitempty"`

	// progressDeadlineSeconds is how long a rollout may go without a new
	// machine becoming available before the Progressing condition turns
	// False (ProgressDeadlineExceeded). The rollout is not stopped: fix the
	// template or roll back.
	//
	// +optional
	// +kubebuilder:default=600
	// +kubebuilder:validation:Minimum=1
	ProgressDeadlineSeconds *int32 `json:"progressDeadlineSeconds,omitempty"`
}

// MachineDeploymentStatus is the observed state of a MachineDeployment.
type MachineDeploymentStatus struct {
	// selector is spec.selector in string form, for the scale subresource.
	//
	// +optional
	Selector string `json:"selector,omitempty"`

	// replicas is the number of machines across all the deployment's sets.
	//
	// +optional
	Replicas int32 `json:"replicas"`

	// updatedReplicas is the number of machines built from the current
	// template.
	//
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas"`

	// readyReplicas is the number of machines whose Node is Ready.
	//
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`

	// availableReplicas is the number of machines whose Node has been Ready
	// for at least minReadySeconds.
	//
	// +optional
	AvailableReplicas int32 `json:"availableReplicas"`

	// conditions are the deployment's detailed state: Ready, Available,
	// RollingOut, Progressing, MachinesReady, ScalingUp, ScalingDown,
	// Paused, and, with autoscaler size annotations, NodeGroupSizeValid.
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

// MachineDeployment manages MachineSets to roll machines declaratively from
// one template to the next, like a Deployment does for pods.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:path=machinedeployments,scope=Namespaced,shortName=md,categories=marina
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterName`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Current",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Updated",type=integer,JSONPath=`.status.updatedReplicas`
// +kubebuilder:printcolumn:name="Available",type=integer,JSONPath=`.status.availableReplicas`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.template.spec.versions.kubelet`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineDeployment struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state of the deployment.
	//
	// +required
	// +kubebuilder:validation:XValidation:rule="self.clusterName == oldSelf.clusterName",message="clusterName cannot be changed after creation: create a new deployment in the other cluster",fieldPath=.clusterName
	Spec MachineDeploymentSpec `json:"spec"`

	// status is the observed state of the deployment.
	//
	// +optional
	Status MachineDeploymentStatus `json:"status,omitempty"`
}

// MachineDeploymentList is a list of MachineDeployments.
//
// +kubebuilder:object:root=true
type MachineDeploymentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the deployments.
	Items []MachineDeployment `json:"items"`
}

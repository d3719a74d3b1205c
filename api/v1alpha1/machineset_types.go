package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MachineDeletePolicy chooses which machines go first when a set shrinks.
//
// +kubebuilder:validation:Enum=Random;Newest;Oldest
type MachineDeletePolicy string

const (
	// RandomDeletePolicy removes machines in no particular order, after those
	// that are unhealthy or already being deleted.
	RandomDeletePolicy MachineDeletePolicy = "Random"
	// NewestDeletePolicy removes the most recently created machines first.
	NewestDeletePolicy MachineDeletePolicy = "Newest"
	// OldestDeletePolicy removes the longest-running machines first.
	OldestDeletePolicy MachineDeletePolicy = "Oldest"
)

// MachineTemplateSpec is the template machines of a set are created from.
type MachineTemplateSpec struct {
	// metadata holds the labels and annotations each machine gets; its labels
	// must match the selector.
	//
	// +optional
	ObjectMeta MachineTemplateMeta `json:"metadata,omitempty"`

	// spec is the spec each machine gets.
	//
	// +required
	Spec MachineSpec `json:"spec"`
}

// MachineTemplateMeta is the metadata a template gives its machines.
type MachineTemplateMeta struct {
	// labels of each machine (not of its Node: use spec.labels for those).
	//
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Labels map[string]string `json:"labels,omitempty"`

	// annotations of each machine.
	//
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Annotations map[string]string `json:"annotations,omitempty"`
}

// MachineSetSpec is the desired state of a MachineSet.
//
// +kubebuilder:validation:XValidation:rule="self.template.spec.clusterName == self.clusterName",message="template.spec.clusterName must equal clusterName: a set only creates machines of its own cluster",fieldPath=.template.spec.clusterName
// +kubebuilder:validation:XValidation:rule="(has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0) || (has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0)",message="selector must not be empty: set matchLabels to the template's labels (an empty selector would adopt and delete every machine in the namespace)",fieldPath=.selector
// +kubebuilder:validation:XValidation:rule="!('ControlPlane' in self.template.spec.roles)",message="a set makes workers only: remove ControlPlane from template.spec.roles; control-plane machines come from the Cluster's spec.controlPlane, which keeps etcd quorum",fieldPath=.template.spec.roles,reason=FieldValueForbidden
type MachineSetSpec struct {
	// clusterName is the name of the Cluster, in the same namespace, that the
	// set's machines belong to. It cannot be changed after creation.
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	ClusterName string `json:"clusterName"`

	// replicas is the number of machines the set keeps. It is the scale
	// subresource, so `kubectl scale` and autoscalers change it.
	//
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	Replicas *int32 `json:"replicas,omitempty"`

	// minReadySeconds is how long a new machine's Node must be Ready before
	// the machine counts as available.
	//
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	MinReadySeconds int32 `json:"minReadySeconds,omitempty"`

	// deletePolicy chooses which machines go first when the set shrinks:
	// Random (default), Newest or Oldest. Unhealthy machines and machines
	// annotated for deletion always go first.
	//
	// +optional
	// +kubebuilder:default=Random
	DeletePolicy MachineDeletePolicy `json:"deletePolicy,omitempty"`

	// selector finds the set's machines by label; it must match the labels
	// of template.metadata (the controller reports a mismatch in the Ready
	// condition) and cannot be changed after creation.
	//
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="selector cannot be changed after creation: create a new set and scale this one to zero"
	Selector metav1.LabelSelector `json:"selector"`

	// template is what new machines look like. Changing it affects only
	// machines created afterwards; a MachineDeployment rolls existing ones.
	//
	// +required
	Template MachineTemplateSpec `json:"template"`
}

// MachineSetStatus is the observed state of a MachineSet.
type MachineSetStatus struct {
	// selector is spec.selector in string form, for the scale subresource
	// (which autoscalers and `kubectl scale` read).
	//
	// +optional
	Selector string `json:"selector,omitempty"`

	// replicas is the number of machines the set has now.
	//
	// +optional
	Replicas int32 `json:"replicas"`

	// readyReplicas is the number of machines whose Node is Ready.
	//
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`

	// availableReplicas is the number of machines whose Node has been Ready
	// for at least minReadySeconds.
	//
	// +optional
	AvailableReplicas int32 `json:"availableReplicas"`

	// conditions are the set's detailed state: Ready, MachinesReady,
	// ScalingUp, ScalingDown, Paused, SelectorExclusive, and, with
	// autoscaler size annotations, NodeGroupSizeValid.
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

// MachineSet keeps a number of identical machines running, like a ReplicaSet
// does for pods. Usually a MachineDeployment owns it.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:path=machinesets,scope=Namespaced,shortName=ms,categories=marina
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterName`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Current",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Available",type=integer,JSONPath=`.status.availableReplicas`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.template.spec.versions.kubelet`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state of the set.
	//
	// +required
	// +kubebuilder:validation:XValidation:rule="self.clusterName == oldSelf.clusterName",message="clusterName cannot be changed after creation: create a new set in the other cluster",fieldPath=.clusterName
	Spec MachineSetSpec `json:"spec"`

	// status is the observed state of the set.
	//
	// +optional
	Status MachineSetStatus `json:"status,omitempty"`
}

// MachineSetList is a list of MachineSets.
//
// +kubebuilder:object:root=true
type MachineSetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the sets.
	Items []MachineSet `json:"items"`
}

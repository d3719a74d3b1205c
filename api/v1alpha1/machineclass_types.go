package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// MachineClassSpec is an admin-published flavor of machine.
type MachineClassSpec struct {
	// providerSpec is the complete provider configuration of machines of this
	// class: a Kubernetes-style object whose apiVersion and kind choose the
	// provider, for example
	//
	//   apiVersion: local.marina.dev/v1alpha1
	//   kind: LocalMachine
	//   spec: {cpu: 8, memory: 32Gi, gpus: 1}
	//
	// A machine of this class may override the fields listed in
	// allowedOverrides; everything else is taken as is, and stays invisible to
	// users who cannot read MachineClasses (M6). Its kind cannot be changed
	// after creation. It may hold at most 64 KiB of JSON.
	//
	// +required
	// +kubebuilder:validation:EmbeddedResource
	// +kubebuilder:pruning:PreserveUnknownFields
	ProviderSpec runtime.RawExtension `json:"providerSpec"`

	// nodeTemplate describes the Node a machine of this class becomes, before
	// it exists, so that an autoscaler can scale a group of such machines up
	// from zero (M7).
	//
	// +optional
	NodeTemplate NodeTemplate `json:"nodeTemplate,omitempty"`

	// allowedOverrides lists the fields of providerSpec a machine of this
	// class may set in its own providerSpec. Each entry is a dotted path of
	// object keys from the root of the provider object, such as
	// "spec.diskSize" or "spec.network"; allowing a path allows everything
	// below it. Lists are replaced whole, never merged item by item; keys that
	// contain a dot cannot be named. apiVersion, kind and metadata cannot be
	// overridden. Empty (the default): machines can use the class only as is.
	//
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=256
	// +kubebuilder:validation:items:XValidation:rule="self.matches('^[A-Za-z0-9_-]+([.][A-Za-z0-9_-]+)*$')",message="must be a dotted path of object keys such as spec.diskSize: letters, digits, '-' and '_' separated by single dots"
	// +kubebuilder:validation:items:XValidation:rule="!(self.split('.')[0] in ['apiVersion', 'kind', 'metadata'])",message="apiVersion, kind and metadata cannot be overridden: they identify the provider object; allow paths under spec instead"
	AllowedOverrides []string `json:"allowedOverrides,omitempty"`
}

// NodeTemplate is what a Node created from a class looks like.
type NodeTemplate struct {
	// labels every Node of this class gets; a machine's own labels are added
	// to them and win on a clash.
	//
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Labels map[string]string `json:"labels,omitempty"`

	// taints every Node of this class gets, for example
	// nvidia.com/gpu=present:NoSchedule on a GPU class; a machine taint with
	// the same key and effect replaces the class's.
	//
	// +optional
	// +listType=map
	// +listMapKey=key
	// +listMapKey=effect
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:XValidation:rule="self.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute']",message="each taint's effect must be NoSchedule, PreferNoSchedule or NoExecute",fieldPath=.effect
	Taints []corev1.Taint `json:"taints,omitempty"`

	// capacity is the Node's resource capacity: cpu, memory, pods, and
	// extended resources such as nvidia.com/gpu, e.g.
	// {cpu: "8", memory: 32Gi, pods: "110", nvidia.com/gpu: "1"}.
	// It should agree with providerSpec; a class that lets machines override
	// sizes states the size of a machine that overrides nothing.
	//
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	Capacity corev1.ResourceList `json:"capacity,omitempty"`
}

// MachineClass is a named flavor of machine ("large", "gpu") published by
// an administrator: the provider configuration and the Node template that
// machines naming it in spec.classRef get (M5, M6, M7). It is cluster-scoped,
// so one catalogue serves every namespace.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=machineclasses,scope=Cluster,shortName=mc,categories=marina
// +kubebuilder:printcolumn:name="Provider",type=string,JSONPath=`.spec.providerSpec.kind`
// +kubebuilder:printcolumn:name="CPU",type=string,JSONPath=`.spec.nodeTemplate.capacity.cpu`
// +kubebuilder:printcolumn:name="Memory",type=string,JSONPath=`.spec.nodeTemplate.capacity.memory`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineClass struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the class.
	//
	// +required
	// +kubebuilder:validation:XValidation:rule="self.providerSpec.kind == oldSelf.providerSpec.kind && self.providerSpec.apiVersion.split('/')[0] == oldSelf.providerSpec.apiVersion.split('/')[0]",message="providerSpec kind and API group cannot be changed: machines of this class belong to its provider; publish a new class for the other provider",fieldPath=.providerSpec
	Spec MachineClassSpec `json:"spec"`
}

// MachineClassList is a list of MachineClasses.
//
// +kubebuilder:object:root=true
type MachineClassList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the classes.
	Items []MachineClass `json:"items"`
}

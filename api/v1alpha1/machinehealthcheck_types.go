package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// MachineHealthCheckSpec is what makes a machine unhealthy and how many
// unhealthy machines may be remediated.
type MachineHealthCheckSpec struct {
	// clusterName is the name of the Cluster, in the same namespace, whose
	// machines are checked.
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="clusterName cannot be changed after creation: create a health check for the other cluster"
	ClusterName string `json:"clusterName"`

	// selector picks the machines to check, by their labels. It must not be
	// empty: an empty selector would check every machine of the cluster.
	//
	// +required
	// +kubebuilder:validation:XValidation:rule="(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",message="selector must not be empty: set matchLabels or matchExpressions to pick the machines to check (an empty selector would remediate every machine of the cluster)"
	Selector metav1.LabelSelector `json:"selector"`

	// unhealthyConditions are Node conditions that make a machine unhealthy
	// when they hold for at least their timeout, for example Ready=False for
	// 5m or Ready=Unknown for 5m.
	//
	// +required
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	UnhealthyConditions []UnhealthyCondition `json:"unhealthyConditions"`

	// nodeStartupTimeout is how long a machine may run without its Node
	// registering before it is unhealthy. Default 10m; "0s" disables the check.
	//
	// +optional
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,5}(ms|s|m|h))+$')",message="must be a duration like 10m, 90s or 1h30m (at most 5 digits per unit)"
	NodeStartupTimeout *metav1.Duration `json:"nodeStartupTimeout,omitempty"`

	// maxUnhealthy stops remediation while more than this many of the
	// selected machines are unhealthy: a number (2) or a percentage ("40%").
	// It guards against a network partition making every machine look dead.
	// Default 100%: always remediate.
	//
	// +optional
	// +kubebuilder:default="100%"
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="must be a non-negative number of machines (2) or a percentage from 0% to 100% (40%)"
	MaxUnhealthy *intstr.IntOrString `json:"maxUnhealthy,omitempty"`
}

// UnhealthyCondition is a Node condition that, held long enough, makes a
// machine unhealthy.
type UnhealthyCondition struct {
	// type of the Node condition, for example Ready.
	//
	// +required
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=316
	Type corev1.NodeConditionType `json:"type"`

	// status of the condition that counts as unhealthy: True, False or
	// Unknown.
	//
	// +required
	// +kubebuilder:validation:Enum=True;False;Unknown
	Status corev1.ConditionStatus `json:"status"`

	// timeout is how long the condition must hold, like 5m.
	//
	// +required
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,5}(ms|s|m|h))+$')",message="must be a duration like 5m, 300s or 1h (at most 5 digits per unit)"
	Timeout metav1.Duration `json:"timeout"`
}

// MachineHealthCheckStatus is the observed state of a MachineHealthCheck.
type MachineHealthCheckStatus struct {
	// expectedMachines is the number of machines the selector picks.
	//
	// +optional
	ExpectedMachines int32 `json:"expectedMachines"`

	// currentHealthy is the number of those machines that are healthy.
	//
	// +optional
	CurrentHealthy int32 `json:"currentHealthy"`

	// remediationsAllowed is how many more machines may be remediated before
	// maxUnhealthy stops remediation.
	//
	// +optional
	RemediationsAllowed int32 `json:"remediationsAllowed"`

	// recentRemediations are the machines this check deleted within the
	// last nodeStartupTimeout (10m when that is 0s), oldest first. Each
	// counts toward maxUnhealthy until it is that old, even after its
	// machine is gone and replaced: a storm that builds slowly, a few
	// machines at a time, is held back as one that comes at once. Written
	// by the controller before it deletes a machine; do not edit.
	//
	// +optional
	// +listType=atomic
	RecentRemediations []MachineRemediation `json:"recentRemediations,omitempty"`

	// conditions are the health check's detailed state: RemediationAllowed.
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

// MachineRemediation is one machine a health check deleted.
type MachineRemediation struct {
	// machine is the name of the deleted machine.
	//
	// +required
	// +kubebuilder:validation:MaxLength=253
	Machine string `json:"machine"`

	// time is when the health check deleted it.
	//
	// +required
	Time metav1.Time `json:"time"`
}

// MachineHealthCheck watches the Nodes of selected machines and has the
// unhealthy ones replaced (their owning set recreates them), unless too many
// are unhealthy at once.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=machinehealthchecks,scope=Namespaced,shortName=mhc,categories=marina
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterName`
// +kubebuilder:printcolumn:name="Expected",type=integer,JSONPath=`.status.expectedMachines`
// +kubebuilder:printcolumn:name="Healthy",type=integer,JSONPath=`.status.currentHealthy`
// +kubebuilder:printcolumn:name="MaxUnhealthy",type=string,JSONPath=`.spec.maxUnhealthy`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineHealthCheck struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is what the health check checks.
	//
	// +required
	Spec MachineHealthCheckSpec `json:"spec"`

	// status is the observed state of the health check.
	//
	// +optional
	Status MachineHealthCheckStatus `json:"status,omitempty"`
}

// MachineHealthCheckList is a list of MachineHealthChecks.
//
// +kubebuilder:object:root=true
type MachineHealthCheckList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the health checks.
	Items []MachineHealthCheck `json:"items"`
}

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of every marina cluster object.
const GroupName = "cluster.marina.dev"

// GroupVersion is the group and version of the types in this package.
var GroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

var (
	// SchemeBuilder registers the types of this package in a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Resource returns the group-qualified resource of this package's version, for
// API errors (apierrors.NewNotFound and friends).
func Resource(resource string) schema.GroupResource {
	return GroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&Cluster{}, &ClusterList{},
		&Machine{}, &MachineList{},
		&MachineClass{}, &MachineClassList{},
		&MachineSet{}, &MachineSetList{},
		&MachineDeployment{}, &MachineDeploymentList{},
		&MachineHealthCheck{}, &MachineHealthCheckList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

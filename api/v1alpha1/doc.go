// Package v1alpha1 is marina's cluster API, group cluster.marina.dev, version
// v1alpha1: Cluster, Machine, MachineClass, MachineSet, MachineDeployment and
// MachineHealthCheck. The Go types are the source of the CustomResourceDefinitions
// under config/crd/bases (make generate); their field comments are what
// `kubectl explain` shows, and their markers hold the schema's defaults and
// validation rules, which the API server enforces before any controller runs.
//
// Other packages import it as clusterv1.
//
// +kubebuilder:object:generate=true
// +groupName=cluster.marina.dev
package v1alpha1

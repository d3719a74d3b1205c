// Package validation checks marina objects against the syntax rules
// Kubernetes itself applies to the same kind of values: label keys and
// values, taints, annotations, DNS names, label selectors, resource
// quantities and the service network sizes kube-apiserver accepts.
//
// The checks are pure functions of one object, with no client and no I/O, so
// that the admission webhook, the CLI and tests can all run them; rules that
// need another object (a MachineClass, the Cluster) live in the webhook. Each
// error carries the path of the field to fix, rooted like the object
// (spec.template.metadata.labels[pool]).
package validation

// Package machine is the generic, provider-independent machine controller
// (M1-M3). It owns everything about a Machine but the real machine itself:
// the finalizer and owner reference, the class merge, dispatch to the
// provider that owns the providerSpec kind, matching the workload cluster's
// Node by providerID, copying labels and taints onto it, draining it before
// deletion, phases and conditions. Providers create, describe and delete.
//
// The object flow is designed for few writes: a machine costs one metadata
// patch (finalizer and owner reference together) and one status patch per
// phase change; nothing is written when nothing changed, and no helper
// objects are created per machine in the management plane.
package machine

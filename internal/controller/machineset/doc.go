// Package machineset is the MachineSet controller: it keeps spec.replicas
// Machines built from spec.template, like a ReplicaSet keeps pods. It adopts
// orphan machines that match the selector and releases those that stop
// matching (controller owner references); it removes machines in the order
// of DeletionOrder (annotated first, then failed or not Ready ones, then by
// deletePolicy); every removal is a Machine deletion, so the machine
// controller drains the Node first. It creates and deletes nothing while
// the Cluster is paused or being deleted, or while the template's labels do
// not match the selector.
//
// # Crash safety
//
// The machines a set owns are listed from the API server on every pass,
// not from the informer cache. A set therefore never acts on a view that
// misses its own earlier creations or deletions, which is what expectations
// bookkeeping protects a ReplicaSet from; unlike that in-memory
// bookkeeping, a live list survives a restart. Every machine is created with
// its controller owner reference in the same request, so a process killed
// between any two calls leaves either no machine or an owned one, and the
// next pass counts it. The cost is one LIST per pass, a read; writes stay
// one create or delete per machine plus the set's status.
//
// A machine being deleted (draining) still counts against spec.replicas
// when deciding to create, so a set never holds more machines than
// spec.replicas, even while old ones drain; it no longer counts when deciding
// what to delete, so it is never picked twice.
package machineset

// Package machineset is the MachineSet controller: it keeps spec.replicas
// Machines built from spec.template, like a ReplicaSet keeps pods. It adopts
// orphan machines that match the selector and releases those that stop
// matching (controller owner references); it removes machines in the order
// of DeletionOrder (annotated first, then failed or not Ready ones, then
// those Ready for less than minReadySeconds, then by deletePolicy); every removal is a Machine deletion, so the machine
// controller drains the Node first. It creates and deletes nothing while
// the Cluster is paused or being deleted, or while the template's labels do
// not match the selector.
//
// # Crash safety
//
// A set never acts on a view that misses its own earlier creations or
// deletions. Its machines are read from the informer cache (those of its
// cluster, by index) only when the cache shows every machine write this
// process made about the set since it last read them from the API server;
// otherwise, and on each set's first pass after the process starts, they
// are listed from the API server, which shows every acknowledged write.
// A create that fails in a way that leaves open whether the API server
// committed it (a timeout, a lost connection) makes the next pass list live
// too. This is a ReplicaSet's expectations bookkeeping with a live list as the
// fallback instead of a timeout, so a restart, which forgets the
// bookkeeping, costs one list per set. Listing live on every pass was
// measured to cost a fleet of 1,010 machines in one namespace most of its
// time (docs/benchmarks.md). Every machine is created with its controller
// owner reference in the same request, so a process killed between any two
// calls leaves either no machine or an owned one, and the next pass counts
// it. Creations go in batches of 1, 2, 4, …, each batch waited for.
//
// A machine being deleted (draining) still counts against spec.replicas
// when deciding to create, so a set never holds more machines than
// spec.replicas, even while old ones drain; it no longer counts when deciding
// what to delete, so it is never picked twice.
package machineset

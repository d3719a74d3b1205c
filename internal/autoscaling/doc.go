// Package autoscaling is marina's side of the node-group contract of
// cluster-autoscaler's clusterapi provider, run unmodified with
// CAPI_GROUP=cluster.marina.dev (M7). It parses the min/max size
// annotations of a MachineSet or MachineDeployment, and derives the
// capacity.cluster-autoscaler.kubernetes.io/* annotations, which let the
// autoscaler simulate a node of a group scaled to zero, from the
// MachineClass node template the group's machines are made from. Both are
// pure functions; the set and deployment controllers apply the results.
// docs/autoscaling.md lists the whole contract.
package autoscaling

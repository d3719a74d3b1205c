// Package remote gives controllers access to workload clusters: one cached,
// bounded client per cluster, built from the cluster's admin kubeconfig
// Secret (<cluster>-kubeconfig, key "value") and rebuilt when that Secret
// changes. Each cluster's Nodes are cached and indexed by spec.providerID, and
// Node changes are reported to the caller so machines are reconciled when
// their Node changes, without polling. On request (Options.OnCSREvent), and
// when marina's credential may answer them, the kubelets' client
// certificate requests are cached and reported the same way, for the
// machine controller to approve each worker's own.
package remote

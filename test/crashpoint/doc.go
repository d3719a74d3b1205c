// Package crashpoint holds the crash-point harness on real processes
// (issue 22): marina's manager, with the local provider running real etcd
// and kube-apiserver processes, is stopped after its k-th write and a
// fresh one takes over the same state, through scenarios that change a
// control plane's etcd membership; after each takeover the invariants are
// checked. See crashpoint_test.go for how to run the long form.
package crashpoint

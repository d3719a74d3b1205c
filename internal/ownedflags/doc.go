// Package ownedflags is the one list of control-plane component flags that
// marina owns: the flags it sets itself, and every flag that wires a
// component to files, addresses, credentials, etcd or another cluster. A
// Cluster's extraArgs may tune how a component behaves but not how it is
// wired, so the admission webhook (internal/validation) refuses an owned
// flag with the reason, and internal/bootstrap refuses to render one
// (defence in depth, for objects stored before the rule). docs/security.md
// states the list for operators.
package ownedflags

// Package plane runs marina's embedded management plane on one machine: a
// real etcd, kube-apiserver and kube-controller-manager from bin/, as child
// processes on loopback, with TLS, a CA generated on first start, client
// certificate authentication and RBAC. Everything it owns lives in one state
// directory, so starting it again on the same directory keeps every object.
//
// Children never outlive the process that started them: they are started from
// one OS thread with a parent-death signal (package process), so even a `kill -9` of marina takes
// them down, and a graceful stop terminates them in reverse start order.
package plane

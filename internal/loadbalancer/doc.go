// Package loadbalancer is the control-plane endpoint of a local cluster: a
// layer-4 (TCP) load balancer that listens on one loopback address and
// passes each client connection, TLS untouched, to one of the cluster's
// kube-apiservers that answers its /readyz health check.
//
// Balancer is the balancer itself, for any caller. RunDir runs one from a
// directory (its configuration and health-check certificates) as its own
// process, `marina load-balancer --dir DIR`, which Start launches detached
// and Stop ends, so that a cluster's endpoint outlives a restart of marina
// as its machines' agents do.
package loadbalancer

// Package nodenet gives a local machine with a real kubelet a network of
// its own (issue 32): a network namespace, a veth pair whose host end is on
// the provider's bridge, an address on the bridge's network and a default
// route through the host's end, so that the management host reaches the
// machine's kubelet and NodePorts and the machines reach one another. It
// also keeps the routes to the other Nodes' pod CIDRs inside a machine's
// namespace (Routes plans them, a pure function).
//
// Everything is made with iproute2's ip command, idempotently: a step that
// finds its result already there does nothing, so a provider killed between
// two steps finishes the job on its next call; Remove undoes all of it.
package nodenet

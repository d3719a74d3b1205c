// Package nodeagent is the simulated kubelet of a local worker machine, run
// as `marina node-agent --sandbox DIR` by the local provider. It reads only
// its sandbox (see package sandbox), trades the bootstrap token it finds
// there for the node's own client certificate (TLS bootstrap,
// tlsbootstrap.go), registers its Node, keeps the Node's Lease and Ready
// condition fresh, and plays the pods bound to the Node: it reports them
// Running and Ready and confirms their termination.
//
// It is built to be light, so that hundreds of agents fit on one small host:
// one filtered pod watch, timers of ten seconds and more, nothing per second.
// Killed, it just stops, and the Node goes NotReady as with a real kubelet.
package nodeagent

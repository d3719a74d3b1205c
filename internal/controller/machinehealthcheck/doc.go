// Package machinehealthcheck is the MachineHealthCheck controller: it reads
// the machines a check selects and their Nodes in the workload cluster, has
// internal/health decide who is unhealthy and whether remediation may go on
// (maxUnhealthy), marks each machine (its HealthCheckSucceeded condition and,
// when it is remediated or only marked, the remediation-reason annotation),
// and deletes the unhealthy workers a MachineSet owns, so that their set
// replaces them. It looks again exactly when the next pending timeout
// expires, and on every change of a selected machine or of a Node of the
// cluster.
//
// # What it does not do
//
// It never remediates a control-plane machine (it marks it and says why:
// replacing one must keep etcd's quorum, which the control-plane controller
// will own), and it never remediates anything while the workload cluster's
// API server does not answer: then every Node looks dead, and the network,
// not the machines, may be down.
//
// # Draining a remediated machine
//
// A remediated machine is deleted like any other, so the machine controller
// drains its Node first. A drain waits for the kubelet to confirm each
// evicted pod is gone, which an unreachable kubelet never does. So, before
// deleting, the controller puts the exclude-node-draining annotation on a
// machine whose Node is gone or not Ready (its pods are recreated elsewhere
// once the Node object is removed), and bounds the drain of any other
// remediated machine with spec.nodeDrainTimeout (Options.DrainTimeout) when
// the machine sets none.
//
// # Crash safety
//
// Each step is idempotent and the next pass starts from what the API server
// holds, not from memory. A machine is marked, then deleted with a UID
// precondition. A machine being deleted is never remediated again (the plan
// leaves it alone and counts it as not healthy), so a controller killed
// after the deletion, or reading a cache that has not seen it yet, deletes
// nothing more: at worst it repeats the same DELETE, which on an object that
// already has a deletionTimestamp changes nothing, and on one that is gone
// (or was replaced under the same name) fails with NotFound or a conflict,
// both ignored. The set counts a machine being deleted against its replicas,
// so it makes exactly one replacement, once the old machine is gone. Each
// remediation is recorded in status.recentRemediations before the deletion
// (it counts toward maxUnhealthy after the machine is gone), so a process
// killed right after deleting does not forget it.
package machinehealthcheck

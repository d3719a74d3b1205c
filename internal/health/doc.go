// Package health decides, for a MachineHealthCheck, which of the machines it
// selects are unhealthy, whether too many are for remediation to go on
// (maxUnhealthy, which counts what is coming too: conditions that have begun
// and recent remediations), which machines to remediate now and when to look
// again.
// It is a pure function of observed facts and the current time: no client,
// no clock. internal/controller/machinehealthcheck reads the world, calls
// Decide and applies the plan.
package health

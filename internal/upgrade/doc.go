// Package upgrade plans a cluster's upgrade (M11, M12, M13, M19): given the
// desired version, the strategy and what every control-plane machine and
// worker runs, it returns the single next step, done, or blocked with the
// reason. It is a pure function with no client, clock or I/O, like
// etcd-io/raft's state machine: the controller applies the step and plans
// again from what it then observes, so a restart resumes from the machines'
// reported versions and never redoes or skips a step.
package upgrade

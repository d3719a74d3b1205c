// Package rollout decides how a MachineDeployment moves its machines from
// older templates to the current one. Plan is a pure function: it takes the
// observed MachineSets (desired and actual counts, how many are available)
// and the deployment's bounds, and returns the replicas each set should have
// next. It reads no clock and calls no API, so every edge case of a rolling
// update is a row in a table test; the controller only reads the world and
// writes the returned numbers.
//
// # Semantics
//
// The rules are those of Kubernetes Deployments, which operators already
// know:
//
//   - maxSurge and maxUnavailable are numbers or percentages of the desired
//     replicas; a surge percentage rounds up, an unavailable percentage
//     rounds down. When both come out at zero (say maxUnavailable 10% of 5
//     with maxSurge 0), maxUnavailable becomes 1, or the rollout could never
//     move.
//   - The new set grows while the machines of every set stay within
//     replicas + maxSurge.
//   - Old sets shrink while at least replicas - maxUnavailable machines stay
//     available. Old machines that are not available go first: removing them
//     costs no availability. This holds only because a MachineSet deletes by
//     the same definition of available (machineset.DeletionOrder: not Ready,
//     then Ready for less than minReadySeconds, before available machines);
//     the property test plays rollouts through the set's real counting and
//     deletion order to keep the two in agreement.
//   - A template changed in the middle of a rollout makes the previous "new"
//     set one more old set.
//   - A replicas change in the middle of a rollout is spread over the sets
//     in proportion to their sizes (Scale), as Deployments do, so that a
//     scale-up during a stuck rollout does not put every new machine on the
//     template that is stuck. Each set records the deployment replicas it
//     was sized for, which is how a later pass tells a scaling from the
//     steps of the rollout. A scale-down first removes the machines marked
//     for deletion (cluster-autoscaler's pick), in whichever set they are.
//
// Unlike pods, machines take a while to go: a machine being deleted still
// holds its capacity, and still counts towards replicas + maxSurge. The
// planner therefore counts a set as the larger of its desired replicas and
// the machines it actually has, so the total never exceeds the surge bound
// even while old machines drain.
package rollout

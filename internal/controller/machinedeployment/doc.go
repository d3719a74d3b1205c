// Package machinedeployment is the MachineDeployment controller: it rolls
// machines from one template to the next through MachineSets, like a
// Deployment does for pods through ReplicaSets.
//
// Each template revision has its own MachineSet, named after the
// deployment and a hash of spec.template (the cluster.marina.dev/
// machine-template-hash label, added to the set's selector and machines so
// that sets never claim each other's machines). Changing only the
// deployment's own labels or annotations leaves the hash, and so every
// machine, alone. The deterministic name makes creating a set idempotent: a
// controller killed after the create and restarted finds the set, never a
// second one.
//
// How many machines each set should have next is decided by the pure
// planner in internal/rollout (RollingUpdate with maxSurge/maxUnavailable,
// Scale when replicas changed in the middle of a rolling update, or
// OnDelete); this package only reads the sets and their machines and
// writes the planned replicas. Each set records the deployment replicas it
// was sized for (cluster.marina.dev/desired-replicas), which is how a later
// pass tells a change of replicas, to spread over the sets, from a step of
// the rollout. The planner counts machines, not set
// statuses, so a set that has not yet acted on its last scale is never
// scaled twice.
//
// With the OnDelete strategy, the old sets carry
// cluster.marina.dev/scale-down-only: they never create a machine, so a
// machine someone deletes is replaced by the current set from the current
// template, however fast its deletion completes.
//
// # Revisions and rollback
//
// Sets carry cluster.marina.dev/revision (1, 2, 3, ...), the deployment the
// revision of its current template; both carry it again as
// machinedeployment.clusters.x-k8s.io/revision, which cluster-autoscaler
// reads (docs/autoscaling.md). A template that comes back gets the
// next revision on its existing set. To roll back, either apply the earlier
// template again, or annotate the deployment
//
//	kubectl annotate md/workers cluster.marina.dev/rollback-to-revision=0
//
// ("0" is the revision before the current one; any revision number a set
// carries works): the controller copies that set's template into
// spec.template and removes the annotation, and the machines roll back as
// for any template change, within the same maxSurge/maxUnavailable bounds.
// This is what `kubectl rollout undo` does for Deployments (which cannot
// target custom resources). Scaled-down sets beyond revisionHistoryLimit are
// deleted; a revision whose set is gone cannot be rolled back to.
//
// # Progress
//
// The Progressing condition turns False (ProgressDeadlineExceeded) when a
// rollout has not made progress (a new set created or scaled, a machine of
// it created or becoming Ready) for spec.progressDeadlineSeconds; the
// rollout itself is not stopped.
package machinedeployment

package v1alpha1

// Condition types and reasons of marina's objects. Every condition is a
// metav1.Condition whose type is one of these constants; a condition a user
// can see carries a message saying what to do. Types are positive ("Ready",
// not "NotReady"): True is the good state.

// Conditions shared by several kinds.
const (
	// ReadyCondition summarises an object's other conditions: True when the
	// object is fully working. Every marina kind with a status sets it.
	ReadyCondition = "Ready"

	// PausedCondition is True while the object or its cluster is paused and
	// its controller leaves it alone.
	PausedCondition = "Paused"

	// PausedReason: Cluster.spec.paused or the paused annotation is set.
	PausedReason = "Paused"
	// NotPausedReason: the object is reconciled normally.
	NotPausedReason = "NotPaused"
	// DeletingReason: the object is being deleted.
	DeletingReason = "Deleting"
	// WaitingForClusterReason: the object waits for its Cluster, which is
	// missing or not yet provisioned.
	WaitingForClusterReason = "WaitingForCluster"
)

// Machine conditions.
const (
	// MachineProviderSpecResolvedCondition is True when the machine's provider
	// configuration is known: its class was found and its overrides merged
	// (M5), or it has a full providerSpec and no class.
	MachineProviderSpecResolvedCondition = "ProviderSpecResolved"

	// MachineProviderSpecResolvedReason: the provider configuration is known.
	MachineProviderSpecResolvedReason = "Resolved"
	// MachineClassNotFoundReason: spec.classRef names no MachineClass.
	MachineClassNotFoundReason = "ClassNotFound"
	// MachineOverrideNotAllowedReason: the machine's providerSpec sets a field
	// its class does not list in allowedOverrides, or names another kind.
	MachineOverrideNotAllowedReason = "OverrideNotAllowed"

	// MachineProvisionedCondition is True once the provider has created the
	// real machine and reported its providerID.
	MachineProvisionedCondition = "Provisioned"

	// MachineProvisionedReason: the real machine exists.
	MachineProvisionedReason = "Provisioned"
	// MachineProvisioningReason: the provider is creating the machine.
	MachineProvisioningReason = "Provisioning"
	// MachineProviderNotFoundReason: no running provider owns the kind of the
	// machine's providerSpec (M2); install or start that provider.
	MachineProviderNotFoundReason = "ProviderNotFound"
	// MachineProvisioningFailedReason: the provider failed to create the
	// machine; the message has its error.
	MachineProvisioningFailedReason = "ProvisioningFailed"
	// MachineKubeletConfigUnavailableReason: spec.kubeletConfigRef names a
	// ConfigMap that is missing or holds no KubeletConfiguration (M16).
	MachineKubeletConfigUnavailableReason = "KubeletConfigUnavailable"
	// MachineWaitingForControlPlaneReason: a worker waits until the cluster's
	// control plane answers before it joins (M10).
	MachineWaitingForControlPlaneReason = "WaitingForControlPlane"
	// MachineBootstrapRefusedReason: the control plane refuses the machine
	// its bootstrap for good (it is not one of the control plane's own
	// machines); retrying cannot change that.
	MachineBootstrapRefusedReason = "BootstrapRefused"

	// MachineInstanceRunningCondition says whether the real machine runs,
	// as its provider sees it: False while it is stopped (a host reboot, a
	// killed process), until the machine controller has started it again.
	MachineInstanceRunningCondition = "InstanceRunning"

	// MachineInstanceRunningReason: the provider reports the machine running.
	MachineInstanceRunningReason = "Running"
	// MachineInstancePendingReason: the provider reports the machine booting.
	MachineInstancePendingReason = "Pending"
	// MachineStoppedReason: the machine exists but does not run. The
	// controller starts it again, with the same disk, data, certificates
	// and etcd member, unless the StoppedOnPurposeAnnotation is set (the
	// message says which).
	MachineStoppedReason = "Stopped"
	// MachineStartFailedReason: the provider could not start the stopped
	// machine; the controller retries with backoff, the message says why.
	MachineStartFailedReason = "StartFailed"
	// MachineStartedReason: the event of a stopped machine started again.
	MachineStartedReason = "Started"
	// MachineDeletionFailedReason: the provider could not delete the
	// machine being deleted; the controller retries with backoff, the
	// message says why (and when it stops waiting, with
	// spec.nodeDeletionTimeout set).
	MachineDeletionFailedReason = "DeletionFailed"
	// MachineLeftBehindReason: the provider could not delete the machine
	// within spec.nodeDeletionTimeout; the Machine went without it, and
	// the event names what was left behind.
	MachineLeftBehindReason = "LeftBehind"

	// MachineNodeReadyCondition mirrors the Ready condition of the machine's
	// Node in the workload cluster.
	MachineNodeReadyCondition = "NodeReady"

	// MachineNodeReadyReason: the Node is Ready.
	MachineNodeReadyReason = "NodeReady"
	// MachineNodeNotReadyReason: the Node exists but is not Ready.
	MachineNodeNotReadyReason = "NodeNotReady"
	// MachineNodeNotFoundReason: no Node with the machine's providerID has
	// registered yet, or it has been deleted.
	MachineNodeNotFoundReason = "NodeNotFound"
	// MachineNodeCertificateNotApprovedReason: no Node yet, and marina
	// cannot answer the certificate request the machine's agent made to
	// join (its kubeconfig of the cluster may not, say).
	MachineNodeCertificateNotApprovedReason = "NodeCertificateNotApproved"

	// MachineUpToDateCondition is True when every component of the machine
	// runs the version its spec asks for.
	MachineUpToDateCondition = "UpToDate"

	// MachineUpToDateReason: observed versions equal spec.versions.
	MachineUpToDateReason = "UpToDate"
	// MachineUpgradingReason: an in-place upgrade of the machine is under way.
	MachineUpgradingReason = "Upgrading"
	// MachineVersionsUnavailableReason: spec.versions names a version the
	// provider cannot put on the machine (its binaries were not built or
	// cannot be had); the machine keeps running what it runs.
	MachineVersionsUnavailableReason = "VersionsUnavailable"

	// MachineDrainedCondition is True when the machine's Node has been
	// cordoned and its pods evicted before deletion.
	MachineDrainedCondition = "Drained"

	// MachineDrainingReason: pods are being evicted.
	MachineDrainingReason = "Draining"
	// MachineDrainedReason: the Node is empty of evictable pods.
	MachineDrainedReason = "Drained"
	// MachineDrainBlockedReason: evictions are refused, usually by a
	// PodDisruptionBudget; the message names the pods.
	MachineDrainBlockedReason = "DrainBlocked"
	// MachineDrainTimeoutReason: draining took too long and the machine is
	// deleted anyway.
	MachineDrainTimeoutReason = "DrainTimeout"

	// MachineHealthCheckSucceededCondition is set by a MachineHealthCheck:
	// False when the machine is unhealthy by its rules.
	MachineHealthCheckSucceededCondition = "HealthCheckSucceeded"

	// MachineHealthyReason: no unhealthy condition holds.
	MachineHealthyReason = "Healthy"
	// MachineUnhealthyNodeConditionReason: a Node condition of the health
	// check's unhealthyConditions held longer than its timeout.
	MachineUnhealthyNodeConditionReason = "UnhealthyNodeCondition"
	// MachineNodeStartupTimeoutReason: the Node did not register within
	// nodeStartupTimeout.
	MachineNodeStartupTimeoutReason = "NodeStartupTimeout"
	// MachineNodeDeletedReason: the machine had a Node (status.nodeRef) and
	// that Node no longer exists in the workload cluster.
	MachineNodeDeletedReason = "NodeDeleted"
	// MachineFailedReason: the machine is Failed (status.failureReason); it
	// is replaced, not repaired.
	MachineFailedReason = "MachineFailed"
)

// Cluster conditions.
const (
	// ClusterCertificatesAvailableCondition is True when the cluster's CA
	// (generated, or the user's from caSecretRef) and certificates exist (M15).
	ClusterCertificatesAvailableCondition = "CertificatesAvailable"

	// ClusterCertificatesAvailableReason: the certificates exist.
	ClusterCertificatesAvailableReason = "CertificatesAvailable"
	// ClusterCASecretInvalidReason: the Secret named by caSecretRef is missing
	// or holds no usable CA key pair.
	ClusterCASecretInvalidReason = "CASecretInvalid"
	// ClusterCertificatesLostReason: a CA or the service-account key was
	// deleted after the control plane was initialised. marina makes no new
	// one: the running components hold certificates and tokens of the old.
	ClusterCertificatesLostReason = "CertificatesLost"
	// ClusterCAExpiringSoonReason: the certificates exist, but the cluster CA
	// expires within CAExpiryWarning; the condition stays True.
	ClusterCAExpiringSoonReason = "CAExpiringSoon"

	// ClusterControlPlaneInitializedCondition is True once the first
	// control-plane machine has initialised the cluster (M10); it never goes
	// back to False.
	ClusterControlPlaneInitializedCondition = "ControlPlaneInitialized"

	// ClusterControlPlaneInitializedReason: the first control plane answered.
	ClusterControlPlaneInitializedReason = "Initialized"
	// ClusterWaitingForControlPlaneReason: the first control-plane machine is
	// still coming up.
	ClusterWaitingForControlPlaneReason = "WaitingForControlPlane"

	// ClusterControlPlaneReadyCondition is True when every control-plane
	// machine runs healthy components.
	ClusterControlPlaneReadyCondition = "ControlPlaneReady"

	// ClusterControlPlaneReadyReason: all control-plane machines are healthy.
	ClusterControlPlaneReadyReason = "ControlPlaneReady"
	// ClusterControlPlaneScalingReason: control-plane machines are being added
	// or removed.
	ClusterControlPlaneScalingReason = "Scaling"
	// ClusterControlPlaneUnhealthyReason: a control-plane component is not
	// healthy; the message names the machine and component.
	ClusterControlPlaneUnhealthyReason = "ComponentUnhealthy"
	// ClusterEtcdMembershipUnknownReason: the etcd members could not be
	// listed, so nothing that changes the membership (removing a member,
	// letting a machine being deleted go, adding a machine) is done until
	// they can; EtcdHealthy says why they cannot.
	ClusterEtcdMembershipUnknownReason = "EtcdMembershipUnknown"
	// ClusterWaitingForProviderReason: a control-plane machine is being
	// deleted before the machine controller recorded whether its provider
	// made it; its etcd member, if it has one, must go first.
	ClusterWaitingForProviderReason = "WaitingForProvider"
	// ClusterVersionUnavailableReason: the provider cannot run
	// spec.controlPlane.version (the local provider runs what make setup
	// built); the message lists the versions it can run.
	ClusterVersionUnavailableReason = "VersionUnavailable"
	// ClusterEndpointUnavailableReason: the cluster has no control-plane
	// endpoint and its provider cannot make one.
	ClusterEndpointUnavailableReason = "EndpointUnavailable"
	// ClusterEndpointNotAllowedReason: spec.controlPlaneEndpoint is an
	// address of the management host that its operator did not open to
	// clusters.
	ClusterEndpointNotAllowedReason = "EndpointNotAllowed"

	// ClusterControlPlaneMachinesOwnedCondition is False while machines
	// carry this cluster's control-plane labels without the Cluster being
	// their controller (metadata.ownerReferences): the control plane does
	// not count them, bootstrap them, scale, upgrade or delete them. It is
	// absent when every such machine is the Cluster's.
	ClusterControlPlaneMachinesOwnedCondition = "ControlPlaneMachinesOwned"
	// ClusterUnownedControlPlaneMachineReason: the message names the
	// machines labelled as this cluster's control plane that it does not own.
	ClusterUnownedControlPlaneMachineReason = "UnownedControlPlaneMachine"

	// ClusterEtcdHealthyCondition is True when every etcd member is healthy
	// and the cluster has quorum (M14).
	ClusterEtcdHealthyCondition = "EtcdHealthy"

	// ClusterEtcdHealthyReason: all members are healthy.
	ClusterEtcdHealthyReason = "EtcdHealthy"
	// ClusterEtcdMemberUnhealthyReason: a member is unhealthy; the message
	// names it.
	ClusterEtcdMemberUnhealthyReason = "MemberUnhealthy"
	// ClusterEtcdUnreachableReason: no etcd member (stacked) or external
	// endpoint answers; the message has the error.
	ClusterEtcdUnreachableReason = "Unreachable"

	// ClusterUpgradeProgressingCondition is True while a control-plane
	// upgrade is under way (M11, M12); its message names the current step.
	ClusterUpgradeProgressingCondition = "UpgradeProgressing"

	// ClusterUpgradingReason: a step of the upgrade is being carried out.
	ClusterUpgradingReason = "Upgrading"
	// ClusterUpgradeCompleteReason: every component runs spec version.
	ClusterUpgradeCompleteReason = "UpgradeComplete"
	// ClusterUpgradeStepTimeoutReason: a step did not become healthy within
	// upgradeStrategy.stepTimeout; the upgrade is stopped.
	ClusterUpgradeStepTimeoutReason = "StepTimeout"
	// ClusterUpgradeRolledBackReason: marina upgrade rollback returned the
	// failed step to its old version; the upgrade waits for a spec change.
	ClusterUpgradeRolledBackReason = "RolledBack"
	// ClusterUnsupportedUpgradeReason: no upgrade procedure exists for the
	// observed and desired versions (M19).
	ClusterUnsupportedUpgradeReason = "UnsupportedUpgrade"
)

// MachineSet and MachineDeployment conditions.
const (
	// MachinesReadyCondition is True when every machine of the set or
	// deployment is Ready.
	MachinesReadyCondition = "MachinesReady"

	// MachinesReadyReason: all machines are Ready.
	MachinesReadyReason = "MachinesReady"
	// MachinesNotReadyReason: some machines are not Ready; the message says
	// how many.
	MachinesNotReadyReason = "MachinesNotReady"

	// AvailableCondition is True when at least replicas - maxUnavailable
	// machines are available.
	AvailableCondition = "Available"

	// AvailableReason: enough machines are available.
	AvailableReason = "Available"
	// NotEnoughAvailableReason: fewer machines are available than required.
	NotEnoughAvailableReason = "NotEnoughAvailable"

	// RollingOutCondition is True while a MachineDeployment replaces machines
	// built from an older template.
	RollingOutCondition = "RollingOut"

	// RollingOutReason: old machines are being replaced.
	RollingOutReason = "RollingOut"
	// RolloutCompleteReason: every machine is built from the current template.
	RolloutCompleteReason = "RolloutComplete"

	// ScalingUpCondition is True while machines are being added.
	ScalingUpCondition = "ScalingUp"
	// ScalingDownCondition is True while machines are being removed.
	ScalingDownCondition = "ScalingDown"

	// ScalingReason: the number of machines differs from replicas.
	ScalingReason = "Scaling"
	// NotScalingReason: the number of machines equals replicas.
	NotScalingReason = "NotScaling"
	// MachineCreationFailedReason: creating a machine failed; the message has
	// the API error.
	MachineCreationFailedReason = "MachineCreationFailed"

	// SelectorMismatchReason: the template's labels do not match the
	// selector, so machines made from it would not belong to the set; no
	// machine is created or deleted until spec.template.metadata.labels match.
	SelectorMismatchReason = "SelectorMismatch"
	// SelectorExclusiveCondition is False when a MachineSet's selector also
	// matches machines another set controls. Those machines stay with their
	// owner (a set adopts only orphans), so nothing is created or deleted
	// because of it, but counts and `kubectl get -l` are confusing: give each
	// set its own label.
	SelectorExclusiveCondition = "SelectorExclusive"
	// SelectorExclusiveReason: the selector matches only the set's machines.
	SelectorExclusiveReason = "Exclusive"
	// SelectorOverlapReason: the message names the other sets.
	SelectorOverlapReason = "SelectorOverlap"

	// FrozenCondition is True while the safety controller has frozen a
	// MachineSet for having more machines than replicas + maxSurge for too
	// long (a runaway): it creates no machine until it is back in bounds,
	// and may still delete. It is absent otherwise.
	FrozenCondition = "Frozen"
	// TooManyMachinesReason: the message gives the counts.
	TooManyMachinesReason = "TooManyMachines"

	// ClusterPausedReason: the Cluster is paused (spec.paused) or being
	// deleted, so no machine is created or deleted.
	ClusterPausedReason = "ClusterPaused"

	// NodeGroupSizeValidCondition is set on a MachineSet or MachineDeployment
	// that has a cluster-autoscaler min or max size annotation: False when
	// one is missing, not a non-negative integer, or min exceeds max. Only a
	// report: replicas are never changed because of it.
	NodeGroupSizeValidCondition = "NodeGroupSizeValid"
	// NodeGroupSizeValidReason: min and max are usable.
	NodeGroupSizeValidReason = "Valid"
	// InvalidNodeGroupSizeReason: the message names the annotation at fault.
	InvalidNodeGroupSizeReason = "InvalidNodeGroupSize"

	// ProgressingCondition is a MachineDeployment's rollout progress, as a
	// Deployment's: True while the rollout moves or after it completed, False
	// when no machine became available for spec.progressDeadlineSeconds.
	ProgressingCondition = "Progressing"
	// NewMachineSetAvailableReason: the rollout completed.
	NewMachineSetAvailableReason = "NewMachineSetAvailable"
	// MachineSetUpdatedReason: the rollout is moving.
	MachineSetUpdatedReason = "MachineSetUpdated"
	// ProgressDeadlineExceededReason: the rollout made no progress within
	// spec.progressDeadlineSeconds; usually new machines never become Ready:
	// look at their conditions, then fix the template or roll back.
	ProgressDeadlineExceededReason = "ProgressDeadlineExceeded"
	// RollbackFailedReason: the revision named by the rollback annotation
	// does not exist.
	RollbackFailedReason = "RollbackRevisionNotFound"
)

// MachineHealthCheck conditions.
const (
	// RemediationAllowedCondition is False when more machines are unhealthy
	// than maxUnhealthy allows, and remediation is stopped.
	RemediationAllowedCondition = "RemediationAllowed"

	// RemediationAllowedReason: unhealthy machines are within maxUnhealthy.
	RemediationAllowedReason = "RemediationAllowed"
	// TooManyUnhealthyReason: more machines are unhealthy than maxUnhealthy;
	// look for a common cause (network, control plane) before raising it.
	TooManyUnhealthyReason = "TooManyUnhealthy"
	// RemediationClusterUnreachableReason: the workload cluster's API server
	// does not answer, so its Nodes cannot be read; nothing is remediated
	// while it is so, because the network, not the machines, may be down.
	RemediationClusterUnreachableReason = "ClusterUnreachable"
	// NoMachinesSelectedReason: the selector matches no machine of the
	// cluster; check spec.selector against the machines' labels.
	NoMachinesSelectedReason = "NoMachinesSelected"
	// InvalidMaxUnhealthyReason: spec.maxUnhealthy cannot be read as a
	// number or a percentage from 0% to 100%; nothing is remediated.
	InvalidMaxUnhealthyReason = "InvalidMaxUnhealthy"
)

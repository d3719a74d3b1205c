package machine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/bootstraptoken"
	"marina.dev/marina/internal/class"
	"marina.dev/marina/internal/kubeletconfig"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/provider"
)

// reconcileUnowned handles a machine no provider of this controller owns:
// it reports so when this controller is the reporting one, and does nothing
// else to it (M2).
func (r *Reconciler) reconcileUnowned(ctx context.Context, m *clusterv1.Machine, kind schema.GroupVersionKind, kindErr error) (ctrl.Result, error) {
	if !r.opts.ReportUnowned || isExternal(kind, r.opts.ExternalKinds) {
		return ctrl.Result{}, nil
	}
	before := m.DeepCopy()
	switch {
	case kindErr != nil && !apierrors.IsNotFound(kindErr):
		return ctrl.Result{}, kindErr
	case kindErr != nil:
		setCondition(m, clusterv1.MachineProviderSpecResolvedCondition, metav1.ConditionFalse, clusterv1.MachineClassNotFoundReason,
			kindErr.Error()+"; create the MachineClass (kubectl get machineclasses lists those that exist)")
	default:
		setCondition(m, clusterv1.MachineProvisionedCondition, metav1.ConditionFalse, clusterv1.MachineProviderNotFoundReason,
			fmt.Sprintf("no provider owns providerSpec kind %q (apiVersion %q); providers running here own %v: fix the kind, or start the provider that owns it",
				kind.Kind, kind.GroupVersion().String(), r.opts.Providers.Kinds()))
	}
	setReady(m)
	// Watches on MachineClass (and a restart with more providers) bring the
	// machine back; nothing to retry until then.
	return ctrl.Result{}, r.patchStatus(ctx, before, m)
}

func isExternal(kind schema.GroupVersionKind, external []schema.GroupVersionKind) bool {
	for _, k := range external {
		if k == kind {
			return true
		}
	}
	return false
}

// ensureMetadata puts the finalizer and the owner reference to the Cluster
// on the machine in one patch, and restores them if someone stripped them;
// once the provider made the machine, the same patch copies
// status.providerID to spec.providerID.
func (r *Reconciler) ensureMetadata(ctx context.Context, m *clusterv1.Machine, kind schema.GroupVersionKind) error {
	before := m.DeepCopy()
	machineFinalizer.Add(m)
	if m.Annotations[clusterv1.ProviderKindAnnotation] != provider.FormatKind(kind) {
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[clusterv1.ProviderKindAnnotation] = provider.FormatKind(kind)
	}
	if err := r.ensureClusterOwner(ctx, m); err != nil {
		return err
	}
	if m.Spec.ProviderID == "" {
		// Where tools made for upstream Cluster API look (the field's doc).
		m.Spec.ProviderID = m.Status.ProviderID
	}
	if equalMetadata(before, m) && before.Annotations[clusterv1.ProviderKindAnnotation] == m.Annotations[clusterv1.ProviderKindAnnotation] &&
		before.Spec.ProviderID == m.Spec.ProviderID {
		return nil
	}
	if err := r.client.Patch(ctx, m, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("adding finalizer and owner reference: %w", err)
	}
	return nil
}

// ensureClusterOwner makes the Cluster the owner of a machine that has no
// controller (one made by hand), so that deleting the Cluster deletes it.
// A machine a set controls is owned by its set alone: the garbage collector
// deletes an object only when all its owners are gone, so a Cluster owner
// beside the set would keep the machine alive when its set or deployment is
// deleted (seen on marina up). A machine adopted by a set loses its Cluster
// owner for the same reason.
func (r *Reconciler) ensureClusterOwner(ctx context.Context, m *clusterv1.Machine) error {
	if metav1.GetControllerOf(m) != nil {
		m.OwnerReferences = slices.DeleteFunc(m.OwnerReferences, func(ref metav1.OwnerReference) bool {
			return ref.Kind == "Cluster" && ref.Name == m.Spec.ClusterName && ref.APIVersion == clusterv1.GroupVersion.String() &&
				(ref.Controller == nil || !*ref.Controller)
		})
		return nil
	}
	cluster := &clusterv1.Cluster{}
	switch err := r.client.Get(ctx, clusterKey(m), cluster); {
	case err == nil:
		if err := controllerutil.SetOwnerReference(cluster, m, r.client.Scheme()); err != nil {
			return fmt.Errorf("setting owner reference: %w", err)
		}
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("reading cluster %s: %w", m.Spec.ClusterName, err)
	}
	return nil
}

func equalMetadata(a, b *clusterv1.Machine) bool {
	if !slices.Equal(a.Finalizers, b.Finalizers) || len(a.OwnerReferences) != len(b.OwnerReferences) {
		return false
	}
	for i := range a.OwnerReferences {
		if a.OwnerReferences[i].UID != b.OwnerReferences[i].UID {
			return false
		}
	}
	return true
}

// reconcileNormal: resolve the configuration, provision, then follow the Node.
func (r *Reconciler) reconcileNormal(ctx context.Context, before, m *clusterv1.Machine, prov provider.Provider) (ctrl.Result, error) {
	if m.Status.FailureReason == clusterv1.MachineVanishedReason {
		return ctrl.Result{}, nil
	}
	clearFixableFailure(m)
	var desired *provider.Versions // staged this pass: the Node may ask for them
	resolved, err := r.resolve(ctx, m, prov)
	if err != nil {
		return ctrl.Result{}, err
	}
	if resolved == nil && m.Status.ProviderID == "" {
		return ctrl.Result{}, nil // nothing to make until the spec or class is fixed
	}
	if m.Status.ProviderID == "" {
		if res, err := r.provision(ctx, m, prov, resolved); err != nil || m.Status.ProviderID == "" {
			return res, err
		}
	} else if inst, err := r.describe(ctx, m, prov); err != nil || m.Status.FailureReason != "" {
		return ctrl.Result{}, err
	} else if res, err := r.reconcileInstance(ctx, before, m, prov, inst); err != nil || !res.IsZero() {
		return res, err
	} else if desired, err = r.stageVersions(ctx, m, prov); err != nil && !provider.IsInvalidSpec(err) {
		return ctrl.Result{}, err
	}
	return r.reconcileNode(ctx, m, resolved, desired)
}

// stageVersions is the machine's half of an InPlace upgrade step (M12):
// the versions spec.versions asks for, with the component settings the
// control plane recorded for the versions it moved components to, are
// first staged by a provider that must put binaries on the machine
// (VersionStager); reconcileNode then writes them on the machine's Node,
// where its agent reads them. Staging comes first, so an agent never reads
// versions whose binaries are not there yet; a controller killed between
// the two stages again (a no-op) and writes the Node on its next pass. The
// control-plane controller moves spec.versions one component at a time.
func (r *Reconciler) stageVersions(ctx context.Context, m *clusterv1.Machine, prov provider.Provider) (*provider.Versions, error) {
	v := provider.Versions{Kubelet: string(m.Spec.Versions.Kubelet), ControlPlane: m.Spec.Versions.ControlPlaneComponents()}
	if raw := m.Annotations[clusterv1.ComponentSettingsAnnotation]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &v.Settings); err != nil {
			return nil, fmt.Errorf("machine %s: annotation %s is not a map of versions to component settings: %w", m.Name, clusterv1.ComponentSettingsAnnotation, err)
		}
	}
	if stager, ok := prov.(provider.VersionStager); ok {
		err := stager.StageVersions(ctx, clusterv1.InstanceKey(m), v)
		if provider.IsInvalidSpec(err) {
			// Retrying cannot help until spec.versions changes, which
			// brings the machine back; its Node keeps what it asked for.
			setCondition(m, clusterv1.MachineUpToDateCondition, metav1.ConditionFalse, clusterv1.MachineVersionsUnavailableReason,
				fmt.Sprintf("provider %s cannot stage spec.versions: %v; the machine keeps running what it runs: set spec.versions (or the cluster's version) to one the provider has", prov.Name(), err))
			return nil, err
		}
		if err != nil {
			return nil, fmt.Errorf("staging the versions of machine %s with provider %s: %w", m.Name, prov.Name(), err)
		}
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineUpToDateCondition); c != nil && c.Reason == clusterv1.MachineVersionsUnavailableReason {
		meta.RemoveStatusCondition(&m.Status.Conditions, clusterv1.MachineUpToDateCondition)
	}
	if r.crashed("after-stage-versions") {
		return nil, errCrash
	}
	return &v, nil
}

// resolve merges the class and checks the blob with the provider. A nil
// result with a nil error means the machine cannot go on until its spec or
// class changes; the conditions say why.
func (r *Reconciler) resolve(ctx context.Context, m *clusterv1.Machine, prov provider.Provider) (*class.Resolved, error) {
	var mc *clusterv1.MachineClass
	if m.Spec.ClassRef != nil {
		mc = &clusterv1.MachineClass{}
		if err := r.client.Get(ctx, types.NamespacedName{Name: m.Spec.ClassRef.Name}, mc); err != nil {
			if apierrors.IsNotFound(err) {
				setCondition(m, clusterv1.MachineProviderSpecResolvedCondition, metav1.ConditionFalse, clusterv1.MachineClassNotFoundReason,
					fmt.Sprintf("MachineClass %q does not exist: create it again (kubectl get machineclasses lists those that exist)", m.Spec.ClassRef.Name))
				setReady(m)
				return nil, nil
			}
			return nil, fmt.Errorf("reading MachineClass %q: %w", m.Spec.ClassRef.Name, err)
		}
	}
	resolved, err := class.Merge(mc, &m.Spec)
	if err != nil {
		r.refuse(m, clusterv1.MachineOverrideNotAllowedReason, "the machine's overrides do not fit its class: "+err.Error())
		return nil, nil
	}
	if err := prov.Validate(resolved.ProviderSpec.Raw); err != nil {
		if !provider.IsInvalidSpec(err) {
			return nil, fmt.Errorf("validating providerSpec: %w", err)
		}
		r.refuse(m, clusterv1.MachineInvalidProviderSpecReason, err.Error()+": fix spec.providerSpec (or the MachineClass)")
		return nil, nil
	}
	setCondition(m, clusterv1.MachineProviderSpecResolvedCondition, metav1.ConditionTrue, clusterv1.MachineProviderSpecResolvedReason, "")
	return resolved, nil
}

// refuse reports a configuration that cannot be used. A machine not yet
// made fails: it waits for a corrected spec. A machine that runs keeps
// running: its class changed under it (an administrator narrowed
// allowedOverrides, say), which is no reason to call it broken; it only
// stops following the class's node labels and taints until it fits again.
func (r *Reconciler) refuse(m *clusterv1.Machine, reason, msg string) {
	setCondition(m, clusterv1.MachineProviderSpecResolvedCondition, metav1.ConditionFalse, reason, msg)
	if m.Status.ProviderID != "" {
		return
	}
	fail(m, reason, msg)
	r.recorder.Eventf(m, nil, corev1.EventTypeWarning, reason, "Resolve", "%s", msg)
}

// provision asks the provider for the machine. The provider is keyed by the
// machine's UID, so a controller killed after Create but before the status
// write gets the same machine back on the next try, never a second one.
func (r *Reconciler) provision(ctx context.Context, m *clusterv1.Machine, prov provider.Provider, resolved *class.Resolved) (ctrl.Result, error) {
	boot, res, err := r.bootstrapFor(ctx, m, clusterv1.MachineProvisionedCondition)
	if boot == nil {
		return res, err
	}
	kubeletConfig, ok, err := r.kubeletConfig(ctx, m)
	if !ok {
		return ctrl.Result{RequeueAfter: kubeletConfigRecheck}, err
	}
	spec := m.Spec.DeepCopy()
	spec.Labels, spec.Taints = nodeMetadata(m.Spec.Roles, resolved.Labels, resolved.Taints)
	inst, err := prov.Create(ctx, &provider.Request{
		UID: clusterv1.InstanceKey(m), Namespace: m.Namespace, Name: m.Name,
		Machine: *spec, ProviderSpec: resolved.ProviderSpec.Raw, Bootstrap: *boot,
		KubeletConfig: kubeletConfig, NodeAnnotations: nodeAnnotations(m),
	})
	if err != nil {
		if provider.IsInvalidSpec(err) {
			fail(m, clusterv1.MachineInvalidProviderSpecReason, err.Error())
			return ctrl.Result{}, nil
		}
		setCondition(m, clusterv1.MachineProvisionedCondition, metav1.ConditionFalse, clusterv1.MachineProvisioningFailedReason,
			fmt.Sprintf("provider %s could not create the machine (retrying): %v", prov.Name(), err))
		setReady(m)
		return ctrl.Result{}, fmt.Errorf("creating machine with provider %s: %w", prov.Name(), err)
	}
	if r.crashed("after-create") {
		return ctrl.Result{}, errCrash
	}
	m.Status.ProviderID = inst.ProviderID
	m.Status.Addresses = inst.Addresses
	setCondition(m, clusterv1.MachineProvisionedCondition, metav1.ConditionTrue, clusterv1.MachineProvisionedReason, "")
	setInstanceState(m, inst.State)
	return ctrl.Result{}, nil
}

// describe checks that a provisioned machine still exists, and returns
// what its provider says of it. One that vanished outside marina is
// reported and left alone (a nil Instance): re-creating it silently would
// hide the loss and could resurrect a machine an operator removed on
// purpose. One that exists but stopped is reconcileInstance's.
func (r *Reconciler) describe(ctx context.Context, m *clusterv1.Machine, prov provider.Provider) (*provider.Instance, error) {
	inst, err := prov.Get(ctx, clusterv1.InstanceKey(m))
	if provider.IsNotFound(err) {
		msg := fmt.Sprintf("the machine %s no longer exists at provider %s; marina does not re-create it: delete this Machine (its MachineSet replaces it)",
			m.Status.ProviderID, prov.Name())
		fail(m, clusterv1.MachineVanishedReason, msg)
		r.recorder.Eventf(m, nil, corev1.EventTypeWarning, clusterv1.MachineVanishedReason, "Describe", "%s", msg)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("describing machine with provider %s: %w", prov.Name(), err)
	}
	m.Status.Addresses = inst.Addresses
	return inst, nil
}

// nodeRecheck is how often a machine waiting for its Node looks again
// without an event.
const nodeRecheck = 30 * time.Second

// reconcileNode finds the machine's Node by providerID, records it, mirrors
// its readiness, writes on it the versions staged this pass (desired, when
// not nil), and keeps the machine's labels and taints on it (when its
// configuration resolves; resolved may be nil).
func (r *Reconciler) reconcileNode(ctx context.Context, m *clusterv1.Machine, resolved *class.Resolved, desired *provider.Versions) (ctrl.Result, error) {
	cl, res, err := r.cluster(ctx, m, clusterv1.MachineNodeReadyCondition)
	if cl == nil {
		return res, err
	}
	node, err := cl.NodeByProviderID(ctx, m.Status.ProviderID)
	if err != nil {
		return ctrl.Result{}, err
	}
	answerErr := r.answerCertificateRequests(ctx, m, cl)
	if node == nil {
		m.Status.NodeRef = nil
		if answerErr != nil {
			setCondition(m, clusterv1.MachineNodeReadyCondition, metav1.ConditionFalse, clusterv1.MachineNodeCertificateNotApprovedReason,
				fmt.Sprintf("waiting for a Node with spec.providerID %s to register; its agent's certificate request cannot be answered (retrying): %v", m.Status.ProviderID, answerErr))
			setReady(m)
			return ctrl.Result{}, answerErr
		}
		setCondition(m, clusterv1.MachineNodeReadyCondition, metav1.ConditionFalse, clusterv1.MachineNodeNotFoundReason,
			fmt.Sprintf("waiting for a Node with spec.providerID %s to register", m.Status.ProviderID))
		setReady(m)
		// The Node and certificate request watches bring the machine back;
		// the requeue is for a cluster the cache dropped, which no longer
		// watches.
		return ctrl.Result{RequeueAfter: nodeRecheck}, nil
	}
	if answerErr != nil {
		// The Node is there: its machine is served all the same.
		ctrl.LoggerFrom(ctx).Error(answerErr, "Answering certificate requests of a joined machine")
	}
	if m.Status.NodeRef == nil && !hasRole(m.Spec.Roles, clusterv1.ControlPlaneRole) {
		// The worker has joined: its bootstrap token has served. Were this
		// lost to a crash, the token expires on its own.
		if err := bootstraptoken.Delete(ctx, cl.Clientset, clusterv1.InstanceKey(m)); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Deleting the bootstrap token of a joined machine")
		}
	}
	m.Status.NodeRef = &clusterv1.NodeReference{Name: node.Name, UID: string(node.UID)}
	m.Status.Versions.Kubelet = node.Status.NodeInfo.KubeletVersion
	m.Status.KubeletConfig = nil
	if name, hash, ok := kubeletconfig.ParseReported(node.Annotations[clusterv1.KubeletConfigAnnotation]); ok {
		m.Status.KubeletConfig = &clusterv1.KubeletConfigStatus{Name: name, Hash: hash}
	}
	if hasRole(m.Spec.Roles, clusterv1.ControlPlaneRole) {
		m.Status.Versions.ControlPlane = controlPlaneVersions(node)
	}
	setNodeReady(m, node)
	if desired != nil {
		if err := setDesiredVersions(ctx, cl.Client, node, *desired); err != nil {
			return ctrl.Result{}, err
		}
	}
	if resolved == nil {
		return ctrl.Result{}, nil // the configuration does not resolve: see ProviderSpecResolved
	}
	if err := syncNodeMetadata(ctx, cl.Client, node, m, resolved.Labels, resolved.Taints); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// cluster returns access to the machine's workload cluster, or reports on
// condition t why there is none.
func (r *Reconciler) cluster(ctx context.Context, m *clusterv1.Machine, t string) (*remote.Cluster, ctrl.Result, error) {
	// A control plane marina makes does not answer for a while: waiting
	// for it to say so beats retrying into an ever longer backoff.
	cluster := &clusterv1.Cluster{}
	if err := r.client.Get(ctx, clusterKey(m), cluster); err == nil && !controlPlaneInitialized(cluster) {
		setCondition(m, t, metav1.ConditionFalse, clusterv1.MachineWaitingForControlPlaneReason,
			fmt.Sprintf("waiting for cluster %s's control plane to answer", m.Spec.ClusterName))
		setReady(m)
		return nil, ctrl.Result{}, nil // the Cluster watch brings the machine back
	}
	cl, err := r.clusters.Get(ctx, clusterKey(m))
	switch {
	case err == nil:
		return cl, ctrl.Result{}, nil
	case errors.Is(err, remote.ErrKubeconfigUnlabelled):
		setCondition(m, t, metav1.ConditionFalse, clusterv1.MachineWaitingForControlPlaneReason,
			fmt.Sprintf("waiting for cluster %s: %v", m.Spec.ClusterName, err))
		setReady(m)
		return nil, ctrl.Result{}, nil // labelling the Secret brings the machine back
	case errors.Is(err, remote.ErrKubeconfigRefused):
		setCondition(m, t, metav1.ConditionFalse, clusterv1.MachineKubeconfigRefusedReason,
			fmt.Sprintf("marina does not use cluster %s's kubeconfig: %v", m.Spec.ClusterName, err))
		setReady(m)
		return nil, ctrl.Result{}, nil // fixing the Secret brings the machine back
	case errors.Is(err, remote.ErrKubeconfigMissing):
		setCondition(m, t, metav1.ConditionFalse, clusterv1.MachineWaitingForControlPlaneReason,
			fmt.Sprintf("waiting for cluster %s: its kubeconfig Secret %s does not exist yet", m.Spec.ClusterName, remote.KubeconfigSecretName(m.Spec.ClusterName)))
		setReady(m)
		return nil, ctrl.Result{}, nil // the Secret watch brings the machine back
	default:
		setCondition(m, t, metav1.ConditionUnknown, clusterv1.MachineClusterUnreachableReason,
			fmt.Sprintf("cannot reach cluster %s (retrying with backoff): %v", m.Spec.ClusterName, err))
		setReady(m)
		// An error, so the rate limiter backs off exponentially per machine
		// instead of a hot loop.
		return nil, ctrl.Result{}, fmt.Errorf("reaching cluster %s: %w", m.Spec.ClusterName, err)
	}
}

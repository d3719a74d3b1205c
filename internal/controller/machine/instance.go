package machine

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/provider"
)

// reconcileInstance follows the real machine's own state. A machine its
// provider reports stopped (its host rebooted, its process was killed) is
// reported at once (InstanceRunning=False, Stopped, written before
// anything else is tried, and an event), then started again by a Starter
// provider with everything it holds, unless an operator stopped it on
// purpose (StoppedOnPurposeAnnotation). It is never replaced here:
// starting it keeps its Machine, providerID, disk, data and etcd member.
// A zero Result and nil error let the pass go on to the Node.
func (r *Reconciler) reconcileInstance(ctx context.Context, before, m *clusterv1.Machine, prov provider.Provider, inst *provider.Instance) (ctrl.Result, error) {
	if inst == nil || inst.State != provider.InstanceStopped {
		if inst != nil {
			setInstanceState(m, inst.State)
		}
		return ctrl.Result{}, nil
	}
	starter, canStart := prov.(provider.Starter)
	willStart := canStart && !stoppedOnPurpose(m)
	msg := stoppedMessage(m, prov, canStart)
	c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineInstanceRunningCondition)
	if c == nil || c.Status == metav1.ConditionTrue {
		r.recorder.Eventf(m, nil, corev1.EventTypeWarning, clusterv1.MachineStoppedReason, "Describe", "%s", msg)
	}
	// A start that failed keeps saying why while it is retried, rather
	// than flip between Stopped and StartFailed at every try.
	if c == nil || c.Reason != clusterv1.MachineStartFailedReason || !willStart {
		setCondition(m, clusterv1.MachineInstanceRunningCondition, metav1.ConditionFalse, clusterv1.MachineStoppedReason, msg)
	}
	setReady(m)
	if !willStart {
		return ctrl.Result{}, nil // the Node follows, NotReady
	}
	// Written first: the start may take a while or fail, and whoever
	// looks meanwhile should see why the machine is down.
	if err := r.patchStatus(ctx, before, m); err != nil {
		return ctrl.Result{}, err
	}
	started, err := starter.Start(ctx, clusterv1.InstanceKey(m), nil)
	if provider.IsBootstrapNeeded(err) {
		ctrl.LoggerFrom(ctx).Info("Stopped machine needs fresh credentials to start", "reason", err.Error())
		boot, res, berr := r.bootstrapFor(ctx, m, clusterv1.MachineInstanceRunningCondition)
		if boot == nil {
			return res, berr
		}
		started, err = starter.Start(ctx, clusterv1.InstanceKey(m), boot)
	}
	if err != nil {
		setCondition(m, clusterv1.MachineInstanceRunningCondition, metav1.ConditionFalse, clusterv1.MachineStartFailedReason,
			fmt.Sprintf("provider %s could not start the stopped machine (retrying with backoff): %v", prov.Name(), err))
		setReady(m)
		return ctrl.Result{}, fmt.Errorf("starting stopped machine with provider %s: %w", prov.Name(), err)
	}
	m.Status.Addresses = started.Addresses
	setInstanceState(m, started.State)
	setReady(m)
	r.recorder.Eventf(m, nil, corev1.EventTypeNormal, clusterv1.MachineStartedReason, "Start",
		"provider %s started the stopped machine %s again, with its disk, data and certificates", prov.Name(), m.Status.ProviderID)
	return ctrl.Result{}, nil
}

// stoppedMessage says what a stopped machine's condition should: what
// happens next, and what the reader can do.
func stoppedMessage(m *clusterv1.Machine, prov provider.Provider, canStart bool) string {
	switch {
	case stoppedOnPurpose(m):
		return fmt.Sprintf("the machine is stopped, and annotation %s says an operator wants it so: marina does not start it; remove the annotation to have it started",
			clusterv1.StoppedOnPurposeAnnotation)
	case !canStart:
		return fmt.Sprintf("the machine is stopped, and provider %s cannot start it: start it at the provider, or delete this Machine (its MachineSet replaces it)", prov.Name())
	default:
		return "the machine stopped (its host rebooted, or its process was killed): starting it again with its disk, data and certificates"
	}
}

func stoppedOnPurpose(m *clusterv1.Machine) bool {
	return m.Annotations[clusterv1.StoppedOnPurposeAnnotation] == "true"
}

// setInstanceState records the provider's view of a machine that is not
// stopped.
func setInstanceState(m *clusterv1.Machine, s provider.InstanceState) {
	switch s {
	case provider.InstanceRunning:
		setCondition(m, clusterv1.MachineInstanceRunningCondition, metav1.ConditionTrue, clusterv1.MachineInstanceRunningReason, "")
	case provider.InstancePending:
		setCondition(m, clusterv1.MachineInstanceRunningCondition, metav1.ConditionFalse, clusterv1.MachineInstancePendingReason,
			"the provider reports the machine starting")
	}
}

// instanceDown is the InstanceRunning condition when it says the machine
// does not run, else nil.
func instanceDown(m *clusterv1.Machine) *metav1.Condition {
	c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineInstanceRunningCondition)
	if c == nil || c.Status == metav1.ConditionTrue {
		return nil
	}
	return c
}

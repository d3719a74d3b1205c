package machinehealthcheck

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/health"
	"marina.dev/marina/internal/metrics"
)

// skipDrainNote starts the value of the exclude-node-draining annotation a
// health check sets, so that it can tell its own from a person's.
const skipDrainNote = "node not Ready; machine remediated by MachineHealthCheck "

// mark writes each machine's verdict: its HealthCheckSucceeded condition,
// and the remediation-reason annotation on those to be remediated or only
// marked. Machines being deleted keep the marks they have.
func (r *Reconciler) mark(ctx context.Context, s *scope) error {
	if s.planErr != nil {
		return nil // nothing is known to be worth a mark
	}
	var errs []error
	for i, m := range s.machines {
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		if err := r.markOne(ctx, s, i); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (r *Reconciler) markOne(ctx context.Context, s *scope, i int) error {
	m, v := s.machines[i], s.plan.Machines[i]
	want := metav1.Condition{
		Type:    clusterv1.MachineHealthCheckSucceededCondition,
		Status:  metav1.ConditionTrue,
		Reason:  clusterv1.MachineHealthyReason,
		Message: fmt.Sprintf("healthy by the rules of MachineHealthCheck %s", s.mhc.Name),
	}
	var annotation string
	if !v.Healthy {
		want.Status, want.Reason, want.Message = metav1.ConditionFalse, v.Reason, v.Message
		switch {
		case v.Action != health.None:
			annotation = v.Reason + ": " + v.Message
		case !s.plan.Allowed:
			want.Message += "; " + shortCircuitMessage(s)
		}
	}
	if err := r.annotate(ctx, s, i, annotation); err != nil {
		return err
	}
	return r.setMachineCondition(ctx, m, want)
}

// annotate puts the remediation reason on the machine (or removes it from a
// healthy one) and, on a machine about to be remediated, bounds its drain.
func (r *Reconciler) annotate(ctx context.Context, s *scope, i int, reason string) error {
	m, v := s.machines[i], s.plan.Machines[i]
	patched := m.DeepCopy()
	if reason == "" {
		if v.Healthy {
			delete(patched.Annotations, clusterv1.RemediationReasonAnnotation)
			// A machine that recovered between its mark and its deletion (a
			// crash in between) drains as usual again.
			if strings.HasPrefix(patched.Annotations[clusterv1.ExcludeNodeDrainingAnnotation], skipDrainNote) {
				delete(patched.Annotations, clusterv1.ExcludeNodeDrainingAnnotation)
			}
		}
	} else {
		if patched.Annotations == nil {
			patched.Annotations = map[string]string{}
		}
		patched.Annotations[clusterv1.RemediationReasonAnnotation] = reason
	}
	if v.Action == health.Remediate {
		if !nodeReachable(s.facts[i].Node) {
			// No kubelet would confirm an evicted pod gone: skip the drain.
			// The Node object goes with the machine, and the pod garbage
			// collector then removes its pods, which their controllers
			// recreate elsewhere.
			patched.Annotations[clusterv1.ExcludeNodeDrainingAnnotation] = skipDrainNote + s.mhc.Name
		} else if patched.Spec.NodeDrainTimeout == nil {
			patched.Spec.NodeDrainTimeout = &metav1.Duration{Duration: r.opts.DrainTimeout}
		}
	}
	if equalStrings(m.Annotations, patched.Annotations) && equalDuration(m.Spec.NodeDrainTimeout, patched.Spec.NodeDrainTimeout) {
		return nil
	}
	if err := r.client.Patch(ctx, patched, client.MergeFrom(m)); err != nil {
		return fmt.Errorf("marking machine %s: %w", m.Name, client.IgnoreNotFound(err))
	}
	*m = *patched
	return nil
}

// setMachineCondition writes the machine's HealthCheckSucceeded condition
// when it changed. The machine controller writes the other conditions of
// the same list, so the write is guarded by the resourceVersion and retried
// on a fresh copy rather than overwriting theirs.
func (r *Reconciler) setMachineCondition(ctx context.Context, m *clusterv1.Machine, want metav1.Condition) error {
	changed := func(m *clusterv1.Machine) bool {
		have := meta.FindStatusCondition(m.Status.Conditions, want.Type)
		return have == nil || have.Status != want.Status || have.Reason != want.Reason || have.Message != want.Message
	}
	if !changed(m) {
		return nil
	}
	current := m.DeepCopy()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !changed(current) {
			return nil
		}
		patched := current.DeepCopy()
		c := want
		c.ObservedGeneration = current.Generation
		meta.SetStatusCondition(&patched.Status.Conditions, c)
		err := r.client.Status().Patch(ctx, patched, client.MergeFromWithOptions(current, client.MergeFromWithOptimisticLock{}))
		if apierrors.IsConflict(err) {
			if getErr := r.client.Get(ctx, client.ObjectKeyFromObject(current), current); getErr != nil {
				return getErr
			}
		}
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("writing the health condition of machine %s: %w", m.Name, err)
	}
	return nil
}

// remediate deletes the machines the plan remediates. Their sets replace
// them; the machine controller drains them, bounded (see annotate).
func (r *Reconciler) remediate(ctx context.Context, s *scope) error {
	if s.planErr != nil || !s.plan.Allowed {
		return nil
	}
	if r.crashed("before-delete") {
		return errCrash
	}
	if err := r.recordRemediations(ctx, s); err != nil {
		return err
	}
	log := ctrl.LoggerFrom(ctx)
	var errs []error
	for i, m := range s.machines {
		v := s.plan.Machines[i]
		if v.Action != health.Remediate {
			continue
		}
		// The UID precondition keeps a stale read from deleting a new
		// machine that took the old one's name.
		err := r.client.Delete(ctx, m, client.Preconditions{UID: &m.UID})
		switch {
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			continue // already gone, or another machine by now
		case err != nil:
			errs = append(errs, fmt.Errorf("deleting unhealthy machine %s: %w", m.Name, err))
			continue
		}
		log.Info("Remediating unhealthy machine", "machine", klog.KObj(m), "reason", v.Reason, "message", v.Message)
		metrics.Remediations.WithLabelValues(s.mhc.Namespace, s.mhc.Name).Inc()
		r.recorder.Eventf(m, s.mhc, corev1.EventTypeNormal, "Remediated", "Delete",
			"deleted by MachineHealthCheck %s so that its MachineSet replaces it: %s", s.mhc.Name, v.Message)
		r.recorder.Eventf(s.mhc, m, corev1.EventTypeNormal, "Remediated", "Delete",
			"deleted unhealthy machine %s so that its MachineSet replaces it: %s", m.Name, v.Message)
		if r.crashed("after-delete") {
			return errCrash
		}
	}
	return errors.Join(errs...)
}

// recordRemediations writes the remediations of this pass into
// status.recentRemediations before any machine is deleted: a remediation
// counts toward maxUnhealthy after its machine is gone, so a controller
// killed between the deletion and the record must not forget it. A deletion
// that then fails is recorded all the same, which errs on the side of
// remediating less.
func (r *Reconciler) recordRemediations(ctx context.Context, s *scope) error {
	if !slices.ContainsFunc(s.plan.Machines, func(v health.Verdict) bool { return v.Action == health.Remediate }) {
		return nil
	}
	records := health.Record(s.plan, s.now)
	before := s.mhc.DeepCopy()
	s.records = records
	s.mhc.Status.RecentRemediations = remediationsStatus(records)
	if err := r.client.Status().Patch(ctx, s.mhc, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("recording remediations of machinehealthcheck %s: %w", s.mhc.Name, err)
	}
	return nil
}

func remediationsStatus(records []health.Remediation) []clusterv1.MachineRemediation {
	var out []clusterv1.MachineRemediation
	for _, rec := range records {
		out = append(out, clusterv1.MachineRemediation{Machine: rec.Machine, Time: metav1.NewTime(rec.At)})
	}
	return out
}

func equalStrings(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func equalDuration(a, b *metav1.Duration) bool {
	return (a == nil) == (b == nil) && (a == nil || a.Duration == b.Duration)
}

package machinedeployment

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// rollbackTarget resolves the rollback annotation's value against the
// deployment's sets: the set whose template to restore, or a message
// saying why there is none. "0" is the revision before the current one.
func rollbackTarget(value string, sets []*clusterv1.MachineSet, current *clusterv1.MachineSet) (*clusterv1.MachineSet, string) {
	want, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
	if err != nil || want < 0 {
		return nil, fmt.Sprintf("annotation %s is %q, not a revision number: write the revision of a MachineSet of this deployment, or 0 for the previous one",
			clusterv1.RollbackToRevisionAnnotation, value)
	}
	var currentRev int64
	if current != nil {
		currentRev = revision(current)
	}
	var target *clusterv1.MachineSet
	var known []string
	for _, ms := range sets {
		rev := revision(ms)
		known = append(known, strconv.FormatInt(rev, 10))
		switch {
		case want == 0 && ms != current && rev < currentRev && (target == nil || rev > revision(target)):
			target = ms
		case want != 0 && rev == want:
			target = ms
		}
	}
	if target == nil {
		return nil, fmt.Sprintf("annotation %s asks for revision %s, which has no MachineSet (revisions kept: %s; see revisionHistoryLimit): fix or remove the annotation",
			clusterv1.RollbackToRevisionAnnotation, value, strings.Join(known, ", "))
	}
	return target, ""
}

// rollback obeys the rollback annotation: it copies the template of the
// asked revision into spec.template and removes the annotation, in one
// patch; the template change then rolls the machines. done is true when the
// deployment was changed and this pass should end.
func (r *Reconciler) rollback(ctx context.Context, s *scope) (done bool, err error) {
	md := s.md
	value, ok := md.Annotations[clusterv1.RollbackToRevisionAnnotation]
	if !ok {
		return false, nil
	}
	target, problem := rollbackTarget(value, s.sets, s.newSet)
	if target == nil {
		// The annotation stays, so the condition keeps saying what is wrong;
		// the deployment goes on as if it were not there.
		s.rollbackProblem = problem
		return false, nil
	}
	before := md.DeepCopy()
	tmpl := target.Spec.Template.DeepCopy()
	delete(tmpl.ObjectMeta.Labels, clusterv1.MachineTemplateHashLabel)
	if len(tmpl.ObjectMeta.Labels) == 0 {
		tmpl.ObjectMeta.Labels = nil
	}
	md.Spec.Template = *tmpl
	delete(md.Annotations, clusterv1.RollbackToRevisionAnnotation)
	if err := r.client.Patch(ctx, md, client.MergeFrom(before)); err != nil {
		return false, fmt.Errorf("rolling machinedeployment %s back to revision %d: %w", klog.KObj(md), revision(target), err)
	}
	ctrl.LoggerFrom(ctx).Info("Rolled back the template", "revision", revision(target), "machineset", klog.KObj(target))
	return true, nil
}

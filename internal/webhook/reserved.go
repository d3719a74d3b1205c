package webhook

import (
	"context"
	"fmt"
	"slices"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// Who may set the labels marina's controllers set. The tenancy policy
// (config/tenancy) exempts the same requesters.
const (
	// AdminGroup is the group of marina's administrators.
	AdminGroup = "marina:admins"
	// ControllerUser is the service account `marina controller` runs as in
	// a cluster (config/default). Under `marina up` it runs as an
	// administrator of the plane (system:masters).
	ControllerUser = "system:serviceaccount:marina-system:marina-controller"
)

// ReservedLabels are set only by marina's controllers (and administrators):
// they make a machine count in a control plane, a MachineSet of a
// deployment or one of its revisions. cluster.marina.dev/cluster-name is
// not among them: anyone may set it, to the machine's own spec.clusterName
// (internal/validation).
var ReservedLabels = []string{clusterv1.ControlPlaneLabel, clusterv1.MachineTemplateHashLabel, clusterv1.MachineDeploymentNameLabel}

// ReservedAnnotations are set only by marina's controllers and
// administrators (marina move): the instance key names the provider's
// machine or endpoint an object acts on, so a tenant who set it to another
// machine's key could delete or take over that machine.
var ReservedAnnotations = []string{clusterv1.InstanceKeyAnnotation}

// privileged reports whether the request comes from marina's controllers
// or an administrator. A request without user information (none reaches
// the webhook that way) is not.
func privileged(ctx context.Context) bool {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return false
	}
	return isPrivileged(req.UserInfo)
}

func isPrivileged(u authenticationv1.UserInfo) bool {
	return u.Username == ControllerUser || slices.Contains(u.Groups, "system:masters") || slices.Contains(u.Groups, AdminGroup)
}

// reservedLabelChanges are the reserved labels that newObj adds, changes or
// removes compared with oldObj (nil on create), in its metadata and in a
// set's machine template.
func reservedLabelChanges(oldObj, newObj client.Object) field.ErrorList {
	var before map[string]map[string]string
	if oldObj != nil {
		before = labelsOf(oldObj)
	}
	var errs field.ErrorList
	labels := labelsOf(newObj)
	for _, path := range []string{"metadata.labels", "spec.template.metadata.labels"} { // in a stable order
		after, ok := labels[path]
		if !ok {
			continue
		}
		for _, k := range ReservedLabels {
			v, has := after[k]
			old, had := before[path][k]
			if has == had && v == old {
				continue
			}
			errs = append(errs, field.Forbidden(field.NewPath(path).Key(k), fmt.Sprintf(
				"only marina's controllers and administrators (group %s) may add, change or remove this label: it decides which machines a control plane or a deployment counts", AdminGroup)))
		}
	}
	return errs
}

// labelsOf are an object's label maps by their field path: its own, and
// those a set gives its machines.
func labelsOf(obj client.Object) map[string]map[string]string {
	out := map[string]map[string]string{"metadata.labels": obj.GetLabels()}
	switch o := obj.(type) {
	case *clusterv1.MachineSet:
		out["spec.template.metadata.labels"] = o.Spec.Template.ObjectMeta.Labels
	case *clusterv1.MachineDeployment:
		out["spec.template.metadata.labels"] = o.Spec.Template.ObjectMeta.Labels
	}
	return out
}

// reservedAnnotationChanges are the reserved annotations that newObj adds,
// changes or removes compared with oldObj (nil on create), in its metadata
// and in a set's machine template.
func reservedAnnotationChanges(oldObj, newObj client.Object) field.ErrorList {
	var before map[string]map[string]string
	if oldObj != nil {
		before = annotationsOf(oldObj)
	}
	var errs field.ErrorList
	annotations := annotationsOf(newObj)
	for _, path := range []string{"metadata.annotations", "spec.template.metadata.annotations"} {
		after, ok := annotations[path]
		if !ok {
			continue
		}
		for _, k := range ReservedAnnotations {
			v, has := after[k]
			old, had := before[path][k]
			if has == had && v == old {
				continue
			}
			errs = append(errs, field.Forbidden(field.NewPath(path).Key(k), fmt.Sprintf(
				"only marina's controllers and administrators (group %s) may add, change or remove this annotation: it names the real machine or endpoint the object acts on (marina move sets it)", AdminGroup)))
		}
	}
	return errs
}

func annotationsOf(obj client.Object) map[string]map[string]string {
	out := map[string]map[string]string{"metadata.annotations": obj.GetAnnotations()}
	switch o := obj.(type) {
	case *clusterv1.MachineSet:
		out["spec.template.metadata.annotations"] = o.Spec.Template.ObjectMeta.Annotations
	case *clusterv1.MachineDeployment:
		out["spec.template.metadata.annotations"] = o.Spec.Template.ObjectMeta.Annotations
	}
	return out
}

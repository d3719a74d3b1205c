package webhook

import (
	"context"
	"fmt"
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
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

// ReservedAnnotations are the annotations by which the control plane
// steers its machines: the component settings an upgrade moved a machine
// to (handed to its components as flags), the etcd member it records, the
// machine that starts etcd, the upgrade step taken, the endpoint drain and
// the etcd member's hook. Only marina's controllers and administrators set
// them, on a Machine or in a set's template.
var ReservedAnnotations = []string{
	clusterv1.ComponentSettingsAnnotation, clusterv1.EtcdInitAnnotation, clusterv1.EtcdMemberIDAnnotation,
	clusterv1.UpgradeStepAnnotation, clusterv1.EndpointDrainAnnotation, clusterv1.EtcdMemberHook,
	// The instance key names the provider's machine or endpoint an object
	// acts on (marina move sets it): a tenant who set it to another
	// machine's key could delete or take over that machine.
	clusterv1.InstanceKeyAnnotation,
}

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

// reservedChanges are the reserved labels and annotations that newObj
// adds, changes or removes compared with oldObj (nil on create), in its
// metadata and in a set's machine template.
func reservedChanges(oldObj, newObj client.Object) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, reservedKeyChanges(oldObj, newObj, "labels", ReservedLabels,
		"it decides which machines a control plane or a deployment counts")...)
	errs = append(errs, reservedKeyChanges(oldObj, newObj, "annotations", ReservedAnnotations,
		"marina steers a machine by it (its components, its etcd member, the real machine or endpoint it names)")...)
	errs = append(errs, clusterControllerChange(oldObj, newObj)...)
	return errs
}

// clusterControllerChange refuses a Machine whose controller reference to a
// Cluster newObj adds or changes: with the control-plane label, it makes
// the machine a member of that cluster's control plane
// (controlplane.Owns). The control plane sets it on the machines it makes.
func clusterControllerChange(oldObj, newObj client.Object) field.ErrorList {
	if _, ok := newObj.(*clusterv1.Machine); !ok {
		return nil
	}
	ref := clusterController(newObj)
	if ref == nil {
		return nil
	}
	if oldObj != nil {
		if old := clusterController(oldObj); old != nil && old.UID == ref.UID && old.Name == ref.Name {
			return nil
		}
	}
	return field.ErrorList{field.Forbidden(field.NewPath("metadata", "ownerReferences"), fmt.Sprintf(
		"only marina's controllers and administrators (group %s) may make a Cluster (%s) a machine's controller: it makes the machine a member of the cluster's control plane",
		AdminGroup, ref.Name))}
}

// clusterController is obj's controller reference when it is a Cluster.
func clusterController(obj client.Object) *metav1.OwnerReference {
	ref := metav1.GetControllerOf(obj)
	if ref == nil || ref.Kind != "Cluster" {
		return nil
	}
	if gv, err := schema.ParseGroupVersion(ref.APIVersion); err != nil || gv.Group != clusterv1.GroupVersion.Group {
		return nil
	}
	return ref
}

// reservedKeyChanges compares the keys of one kind of metadata map
// ("labels" or "annotations").
func reservedKeyChanges(oldObj, newObj client.Object, kind string, keys []string, why string) field.ErrorList {
	var before map[string]map[string]string
	if oldObj != nil {
		before = mapsOf(oldObj, kind)
	}
	var errs field.ErrorList
	maps := mapsOf(newObj, kind)
	for _, path := range []string{"metadata." + kind, "spec.template.metadata." + kind} { // in a stable order
		after, ok := maps[path]
		if !ok {
			continue
		}
		for _, k := range keys {
			v, has := after[k]
			old, had := before[path][k]
			if has == had && v == old {
				continue
			}
			errs = append(errs, field.Forbidden(field.NewPath(path).Key(k), fmt.Sprintf(
				"only marina's controllers and administrators (group %s) may add, change or remove this %s: %s",
				AdminGroup, strings.TrimSuffix(kind, "s"), why)))
		}
	}
	return errs
}

// mapsOf are an object's label (or annotation) maps by their field path:
// its own, and those a set gives its machines.
func mapsOf(obj client.Object, kind string) map[string]map[string]string {
	pick := func(labels, annotations map[string]string) map[string]string {
		if kind == "labels" {
			return labels
		}
		return annotations
	}
	out := map[string]map[string]string{"metadata." + kind: pick(obj.GetLabels(), obj.GetAnnotations())}
	var tmpl *clusterv1.MachineTemplateMeta
	switch o := obj.(type) {
	case *clusterv1.MachineSet:
		tmpl = &o.Spec.Template.ObjectMeta
	case *clusterv1.MachineDeployment:
		tmpl = &o.Spec.Template.ObjectMeta
	}
	if tmpl != nil {
		out["spec.template.metadata."+kind] = pick(tmpl.Labels, tmpl.Annotations)
	}
	return out
}

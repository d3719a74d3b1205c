package validation

import (
	"fmt"
	"slices"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/ownedflags"
)

// Cluster checks a Cluster: its name (a DNS label: it is the value of the
// cluster-name label on every machine and prefixes the names of the
// cluster's Secrets, such as <name>-kubeconfig), its service networks, its
// endpoint host,
// its control plane's references and provider configuration, and the flags
// it adds to the control-plane components.
func Cluster(c *clusterv1.Cluster) field.ErrorList {
	var errs field.ErrorList
	if c.Name != "" { // generateName is resolved before admission; an empty name is the API server's to refuse
		errs = dnsLabel(c.Name, field.NewPath("metadata", "name"))
	}
	spec := field.NewPath("spec")
	errs = append(errs, serviceNetworks(c.Spec.ClusterNetwork.Services, spec.Child("clusterNetwork", "services"))...)
	errs = append(errs, endpointHost(c.Spec.ControlPlaneEndpoint.Host, spec.Child("controlPlaneEndpoint", "host"))...)

	cp, cpPath := &c.Spec.ControlPlane, spec.Child("controlPlane")
	if cp.ClassRef != nil {
		errs = append(errs, dnsSubdomain(cp.ClassRef.Name, cpPath.Child("classRef", "name"))...)
	}
	errs = append(errs, providerSpec(cp.ProviderSpec, cpPath.Child("providerSpec"))...)
	if cp.CASecretRef != nil {
		errs = append(errs, dnsSubdomain(cp.CASecretRef.Name, cpPath.Child("caSecretRef", "name"))...)
	}
	if ext := cp.Etcd.External; ext != nil && ext.SecretRef != nil {
		errs = append(errs, dnsSubdomain(ext.SecretRef.Name, cpPath.Child("etcd", "external", "secretRef", "name"))...)
	}
	comps := cpPath.Child("components")
	errs = append(errs, extraArgs(ownedflags.APIServer, cp.Components.APIServer.ExtraArgs, comps.Child("apiServer", "extraArgs"))...)
	errs = append(errs, extraArgs(ownedflags.ControllerManager, cp.Components.ControllerManager.ExtraArgs, comps.Child("controllerManager", "extraArgs"))...)
	errs = append(errs, extraArgs(ownedflags.Scheduler, cp.Components.Scheduler.ExtraArgs, comps.Child("scheduler", "extraArgs"))...)
	return errs
}

// Machine checks a Machine's spec (see MachineSpec) and that its reserved
// labels say what its spec says (see membershipLabels).
func Machine(m *clusterv1.Machine) field.ErrorList {
	errs := membershipLabels(m.Labels, &m.Spec, field.NewPath("metadata", "labels"))
	return append(errs, MachineSpec(&m.Spec, field.NewPath("spec"))...)
}

// membershipLabels checks the labels that make a machine count in a
// cluster and its control plane: cluster.marina.dev/cluster-name, when set,
// is the machine's spec.clusterName, and cluster.marina.dev/control-plane is
// only on a machine with the ControlPlane role. Otherwise a worker could be
// counted in another cluster, or in a control plane's decisions (issue 24).
func membershipLabels(labels map[string]string, spec *clusterv1.MachineSpec, fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	if v, ok := labels[clusterv1.ClusterNameLabel]; ok && v != spec.ClusterName {
		errs = append(errs, field.Invalid(fldPath.Key(clusterv1.ClusterNameLabel), v, fmt.Sprintf(
			"must be the machine's spec.clusterName (%q): set it to that, or remove it (marina sets it)", spec.ClusterName)))
	}
	if _, ok := labels[clusterv1.ControlPlaneLabel]; ok && !slices.Contains(spec.Roles, clusterv1.ControlPlaneRole) {
		errs = append(errs, field.Forbidden(fldPath.Key(clusterv1.ControlPlaneLabel),
			"marks the machines a Cluster's control plane made, which have the ControlPlane role: remove it"))
	}
	return errs
}

// MachineClass checks a MachineClass: the size of its provider
// configuration and its node template's labels, taints and capacity.
func MachineClass(c *clusterv1.MachineClass) field.ErrorList {
	spec := field.NewPath("spec")
	errs := providerSpec(&c.Spec.ProviderSpec, spec.Child("providerSpec"))
	tmpl := spec.Child("nodeTemplate")
	errs = append(errs, labelMap(c.Spec.NodeTemplate.Labels, tmpl.Child("labels"))...)
	errs = append(errs, taints(c.Spec.NodeTemplate.Taints, tmpl.Child("taints"))...)
	errs = append(errs, capacity(c.Spec.NodeTemplate.Capacity, tmpl.Child("capacity"))...)
	return errs
}

// MachineSet checks a MachineSet: its autoscaler annotations, cluster name,
// selector, and template (which the selector must match).
func MachineSet(s *clusterv1.MachineSet) field.ErrorList {
	errs := autoscalerAnnotations(s.Annotations, field.NewPath("metadata", "annotations"))
	spec := field.NewPath("spec")
	errs = append(errs, dnsLabel(s.Spec.ClusterName, spec.Child("clusterName"))...)
	errs = append(errs, machineSet(&s.Spec.Selector, &s.Spec.Template, spec)...)
	return errs
}

// MachineDeployment checks a MachineDeployment as MachineSet checks a set.
func MachineDeployment(d *clusterv1.MachineDeployment) field.ErrorList {
	errs := autoscalerAnnotations(d.Annotations, field.NewPath("metadata", "annotations"))
	spec := field.NewPath("spec")
	errs = append(errs, dnsLabel(d.Spec.ClusterName, spec.Child("clusterName"))...)
	errs = append(errs, machineSet(&d.Spec.Selector, &d.Spec.Template, spec)...)
	return errs
}

// MachineHealthCheck checks a MachineHealthCheck: its cluster name, its
// selector, and that each unhealthy condition names a condition type as
// Kubernetes spells them.
func MachineHealthCheck(h *clusterv1.MachineHealthCheck) field.ErrorList {
	spec := field.NewPath("spec")
	errs := dnsLabel(h.Spec.ClusterName, spec.Child("clusterName"))
	errs = append(errs, selector(&h.Spec.Selector, spec.Child("selector"))...)
	for i, c := range h.Spec.UnhealthyConditions {
		t := string(c.Type)
		errs = append(errs, invalid(spec.Child("unhealthyConditions").Index(i).Child("type"), t, qualifiedName(t))...)
	}
	return errs
}

// machineSet checks what sets and deployments share: the selector, the
// template's metadata and spec, and that the selector picks the machines the
// template makes (or the set would create machines forever).
func machineSet(sel *metav1.LabelSelector, tmpl *clusterv1.MachineTemplateSpec, spec *field.Path) field.ErrorList {
	selPath, tmplPath := spec.Child("selector"), spec.Child("template")
	errs := selector(sel, selPath)
	meta := tmplPath.Child("metadata")
	errs = append(errs, labelMap(tmpl.ObjectMeta.Labels, meta.Child("labels"))...)
	errs = append(errs, membershipLabels(tmpl.ObjectMeta.Labels, &tmpl.Spec, meta.Child("labels"))...)
	errs = append(errs, annotationMap(tmpl.ObjectMeta.Annotations, meta.Child("annotations"))...)
	errs = append(errs, MachineSpec(&tmpl.Spec, tmplPath.Child("spec"))...)

	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return errs // reported above, at the expression at fault
	}
	if !s.Empty() && !s.Matches(labels.Set(tmpl.ObjectMeta.Labels)) {
		errs = append(errs, field.Invalid(meta.Child("labels"), labels.Set(tmpl.ObjectMeta.Labels).String(), fmt.Sprintf(
			"must match spec.selector (%s), or the machines made from the template would not be counted: add the selector's labels to the template", s)))
	}
	return errs
}

// autoscalerAnnotations checks the node-group size annotations an autoscaler
// reads: each a non-negative base-10 integer, and min no larger than max.
func autoscalerAnnotations(annotations map[string]string, fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	size := func(key string) (int64, bool) {
		v, ok := annotations[key]
		if !ok {
			return 0, false
		}
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 0 || v[0] == '+' {
			errs = append(errs, field.Invalid(fldPath.Key(key), v,
				"must be a non-negative whole number of machines written in decimal, like \"0\" or \"10\""))
			return 0, false
		}
		return n, true
	}
	minSize, okMin := size(clusterv1.AutoscalerMinSizeAnnotation)
	maxSize, okMax := size(clusterv1.AutoscalerMaxSizeAnnotation)
	if okMin && okMax && minSize > maxSize {
		errs = append(errs, field.Invalid(fldPath.Key(clusterv1.AutoscalerMaxSizeAnnotation), annotations[clusterv1.AutoscalerMaxSizeAnnotation], fmt.Sprintf(
			"must be at least the min size (%s: %d): raise the max size or lower the min size", clusterv1.AutoscalerMinSizeAnnotation, minSize)))
	}
	return errs
}

package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/class"
	"marina.dev/marina/provider"
)

// checker holds what the cross-object checks need.
type checker struct {
	// reader reads from the API server, not a cache: a class applied a
	// moment before the machine that names it (kubectl apply -f dir/) must
	// be found.
	reader    client.Reader
	providers *provider.Registry
	external  []schema.GroupVersionKind
}

// machineSpec checks what a machine's spec (or, with machine false, a set's
// template) needs other objects for: its class and provider configuration,
// and its versions against its Cluster. path is where the spec is in the
// object.
func (c *checker) machineSpec(ctx context.Context, namespace string, spec *clusterv1.MachineSpec, machine bool, path *field.Path) (field.ErrorList, admission.Warnings, error) {
	errs, warnings, kind, err := c.resolve(ctx, spec, path)
	if err != nil {
		return nil, nil, err
	}
	if spec.ClusterName == "" {
		return errs, warnings, nil
	}
	cluster := &clusterv1.Cluster{}
	switch err := c.reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: spec.ClusterName}, cluster); {
	case apierrors.IsNotFound(err):
		// No controller checks it later: the Cluster's creation refuses a
		// control plane too far ahead of this kubelet (kubeletsBehind), not
		// one older than it. Say exactly that.
		warnings = append(warnings, fmt.Sprintf("Cluster %s/%s does not exist: the kubelet version was not checked against its control plane. "+
			"Creating the Cluster refuses a control-plane version more than %d minor versions above this kubelet, but nothing refuses one older than it: create the Cluster first",
			namespace, spec.ClusterName, MaxKubeletMinorsBehind))
		return errs, warnings, nil
	case err != nil:
		return nil, nil, fmt.Errorf("reading Cluster %s/%s: %w", namespace, spec.ClusterName, err)
	}
	if cluster.DeletionTimestamp != nil {
		errs = append(errs, field.Forbidden(path.Child("clusterName"), fmt.Sprintf("Cluster %q is being deleted: machines cannot be added to it", spec.ClusterName)))
	}
	// A worker's kubelet talks to the API servers as they run now, and so
	// will the machines a set makes from its template: the set could not
	// make them (this check refuses each). A control-plane machine's
	// kubelet talks to its own API server and follows the Cluster's
	// version.
	running := ""
	if !slices.Contains(spec.Roles, clusterv1.ControlPlaneRole) {
		running = cluster.Status.ControlPlane.Components.APIServer
	}
	errs = append(errs, kubeletSkew(spec.Versions.Kubelet, cluster.Spec.ControlPlane.Version, running, path.Child("versions", "kubelet"))...)
	if slices.Contains(spec.Roles, clusterv1.ControlPlaneRole) && spec.Versions.ControlPlane != "" {
		errs = append(errs, c.runnable(spec.Versions.ControlPlane, kind, path.Child("versions", "controlPlane"))...)
	}
	return errs, warnings, nil
}

// controlPlane checks a Cluster's control-plane machine configuration as if
// it were a control-plane machine's, and that its provider can run the
// version asked for.
func (c *checker) controlPlane(ctx context.Context, cl *clusterv1.Cluster) (field.ErrorList, admission.Warnings, error) {
	cp := &cl.Spec.ControlPlane
	spec := &clusterv1.MachineSpec{
		ClusterName:  cl.Name,
		Roles:        []clusterv1.MachineRole{clusterv1.ControlPlaneRole},
		ClassRef:     cp.ClassRef,
		ProviderSpec: cp.ProviderSpec,
	}
	path := field.NewPath("spec", "controlPlane")
	errs, warnings, kind, err := c.resolve(ctx, spec, path)
	if err != nil {
		return nil, nil, err
	}
	errs = append(errs, c.runnable(cp.Version, kind, path.Child("version"))...)
	return errs, warnings, nil
}

// kubeletsBehind refuses a control-plane version the cluster's workers'
// kubelets cannot follow: more than MaxKubeletMinorsBehind minors above a
// worker machine's kubelet or a set's or deployment's template's. The
// skew policy binds both ends: a Machine cannot be made that far behind
// the Cluster, nor the Cluster moved that far ahead of its Machines (which
// the upgrade would only find out when it rolled them).
func (c *checker) kubeletsBehind(ctx context.Context, cl *clusterv1.Cluster) (field.ErrorList, error) {
	cp, err := version.ParseSemantic(string(cl.Spec.ControlPlane.Version))
	if err != nil {
		return nil, nil // the schema refuses what is not a version
	}
	type kubelet struct{ what, version string }
	var kubelets []kubelet
	var machines clusterv1.MachineList
	if err := c.reader.List(ctx, &machines, client.InNamespace(cl.Namespace), client.MatchingFields{"spec.clusterName": cl.Name}); err != nil {
		return nil, fmt.Errorf("listing the machines of cluster %s: %w", cl.Name, err)
	}
	for _, m := range machines.Items {
		if m.Spec.ClusterName == cl.Name && m.DeletionTimestamp.IsZero() && !slices.Contains(m.Spec.Roles, clusterv1.ControlPlaneRole) {
			kubelets = append(kubelets, kubelet{"Machine " + m.Name, string(m.Spec.Versions.Kubelet)})
		}
	}
	var sets clusterv1.MachineSetList
	if err := c.reader.List(ctx, &sets, client.InNamespace(cl.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the machine sets of cluster %s: %w", cl.Name, err)
	}
	for _, s := range sets.Items {
		if s.Spec.ClusterName == cl.Name && s.DeletionTimestamp.IsZero() {
			kubelets = append(kubelets, kubelet{"MachineSet " + s.Name, string(s.Spec.Template.Spec.Versions.Kubelet)})
		}
	}
	var deployments clusterv1.MachineDeploymentList
	if err := c.reader.List(ctx, &deployments, client.InNamespace(cl.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the machine deployments of cluster %s: %w", cl.Name, err)
	}
	for _, d := range deployments.Items {
		if d.Spec.ClusterName == cl.Name && d.DeletionTimestamp.IsZero() {
			kubelets = append(kubelets, kubelet{"MachineDeployment " + d.Name, string(d.Spec.Template.Spec.Versions.Kubelet)})
		}
	}
	var behind []string
	for _, k := range kubelets {
		if v, err := version.ParseSemantic(k.version); err == nil && (v.Major() != cp.Major() || v.Minor()+MaxKubeletMinorsBehind < cp.Minor()) {
			behind = append(behind, fmt.Sprintf("%s (kubelet %s)", k.what, k.version))
		}
	}
	if len(behind) == 0 {
		return nil, nil
	}
	slices.Sort(behind)
	return field.ErrorList{field.Invalid(field.NewPath("spec", "controlPlane", "version"), cl.Spec.ControlPlane.Version, fmt.Sprintf(
		"would leave kubelets more than %d minor versions older than the control plane: %s; move them to v%d.%d or newer first",
		MaxKubeletMinorsBehind, strings.Join(behind, ", "), cp.Major(), max(int(cp.Minor())-MaxKubeletMinorsBehind, 0)))}, nil
}

// resolve merges the spec with its class, as the machine controller will,
// and checks the result with its provider. It returns the providerSpec kind
// the spec resolves to, empty when it does not resolve.
func (c *checker) resolve(ctx context.Context, spec *clusterv1.MachineSpec, path *field.Path) (field.ErrorList, admission.Warnings, schema.GroupVersionKind, error) {
	mc, err := c.class(ctx, spec)
	if err != nil {
		return nil, nil, schema.GroupVersionKind{}, err
	}
	// A missing class is the merge's error too, with what to do about it.
	resolved, err := class.Merge(mc, spec)
	if err != nil {
		return reroot(fieldErrors(err), path), nil, schema.GroupVersionKind{}, nil
	}
	errs, warnings := c.providerSpec(resolved.ProviderSpec.Raw, path.Child("providerSpec"))
	return errs, warnings, resolved.GroupVersionKind, nil
}

// class reads the spec's MachineClass; nil when it names none or it does not
// exist.
func (c *checker) class(ctx context.Context, spec *clusterv1.MachineSpec) (*clusterv1.MachineClass, error) {
	if spec.ClassRef == nil {
		return nil, nil
	}
	mc := &clusterv1.MachineClass{}
	err := c.reader.Get(ctx, types.NamespacedName{Name: spec.ClassRef.Name}, mc)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading MachineClass %q: %w", spec.ClassRef.Name, err)
	}
	return mc, nil
}

// providerSpec checks a complete provider object with the provider that owns
// its kind, when that provider runs in this manager.
func (c *checker) providerSpec(raw []byte, path *field.Path) (field.ErrorList, admission.Warnings) {
	gvk, ok := kindOfRaw(raw)
	if !ok {
		return nil, nil // the schema and the merge report a missing kind
	}
	prov := c.providers.For(gvk)
	if prov == nil {
		if slices.Contains(c.external, gvk) {
			return nil, admission.Warnings{fmt.Sprintf("providerSpec kind %s is owned by a provider outside this controller: that provider checks it when it makes the machine", gvk.Kind)}
		}
		return nil, admission.Warnings{fmt.Sprintf("no provider in this controller owns providerSpec kind %s (%s): the machine waits, with a condition saying so, until one does", gvk.Kind, gvk.GroupVersion())}
	}
	err := prov.Validate(raw)
	if err == nil {
		return nil, nil
	}
	var invalid *provider.InvalidSpecError
	if !errors.As(err, &invalid) {
		return field.ErrorList{field.Invalid(path, field.OmitValueType{}, err.Error())}, nil
	}
	p := path
	if invalid.Field != "" {
		for _, part := range strings.Split(invalid.Field, ".") {
			p = p.Child(part)
		}
	}
	return field.ErrorList{field.Invalid(p, field.OmitValueType{}, invalid.Message)}, nil
}

// runnable refuses a control-plane version the provider of kind cannot run.
func (c *checker) runnable(v clusterv1.KubernetesVersion, kind schema.GroupVersionKind, path *field.Path) field.ErrorList {
	lister, ok := c.providers.For(kind).(provider.VersionLister)
	if !ok || v == "" {
		return nil
	}
	available, err := lister.KubernetesVersions()
	if err != nil || available == nil || slices.Contains(available, string(v)) {
		return nil
	}
	return field.ErrorList{field.NotSupported(path, v, available)}
}

// MaxKubeletMinorsBehind is how many minor versions a kubelet may be older
// than its control plane (Kubernetes version skew policy).
const MaxKubeletMinorsBehind = 3

// kubeletSkew applies the version skew policy to a kubelet: never newer
// than the control plane's version (desired), nor than the oldest API
// server running (running; empty when unknown or not the kubelet's to
// follow), and at most MaxKubeletMinorsBehind minor versions older than
// desired.
func kubeletSkew(kubelet, desired clusterv1.KubernetesVersion, running string, path *field.Path) field.ErrorList {
	k, err1 := version.ParseSemantic(string(kubelet))
	cp, err2 := version.ParseSemantic(string(desired))
	if err1 != nil || err2 != nil {
		return nil // the schema refuses what is not a version
	}
	if cp.LessThan(k) {
		return field.ErrorList{field.Invalid(path, kubelet, fmt.Sprintf(
			"must not be newer than the cluster's control plane (%s): lower it, or upgrade the Cluster's spec.controlPlane.version first", desired))}
	}
	if api, err := version.ParseSemantic(running); err == nil && api.LessThan(k) {
		return field.ErrorList{field.Invalid(path, kubelet, fmt.Sprintf(
			"must not be newer than the oldest API server the cluster runs (%s, status.controlPlane.components.apiServer): wait for the control-plane upgrade to finish, or lower it", running))}
	}
	if k.Major() != cp.Major() || k.Minor()+MaxKubeletMinorsBehind < cp.Minor() {
		return field.ErrorList{field.Invalid(path, kubelet, fmt.Sprintf(
			"must be at most %d minor versions older than the cluster's control plane (%s): raise it to v%d.%d or newer",
			MaxKubeletMinorsBehind, desired, cp.Major(), max(int(cp.Minor())-MaxKubeletMinorsBehind, 0)))}
	}
	return nil
}

// kindOfRaw reads apiVersion and kind from a provider object.
func kindOfRaw(raw []byte) (schema.GroupVersionKind, bool) {
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := json.Unmarshal(raw, &meta); err != nil || meta.Kind == "" {
		return schema.GroupVersionKind{}, false
	}
	gv, err := schema.ParseGroupVersion(meta.APIVersion)
	if err != nil {
		return schema.GroupVersionKind{}, false
	}
	return gv.WithKind(meta.Kind), true
}

// fieldErrors turns the merge's error (a field error or an aggregate of
// them) back into a list.
func fieldErrors(err error) field.ErrorList {
	var agg utilerrors.Aggregate
	if errors.As(err, &agg) {
		var out field.ErrorList
		for _, e := range agg.Errors() {
			out = append(out, fieldErrors(e)...)
		}
		return out
	}
	var fe *field.Error
	if errors.As(err, &fe) {
		return field.ErrorList{fe}
	}
	return field.ErrorList{field.Invalid(field.NewPath("spec"), field.OmitValueType{}, err.Error())}
}

// reroot moves errors about a machine's "spec..." to where that spec is in
// the object being checked (a set's spec.template.spec, a Cluster's
// spec.controlPlane).
func reroot(errs field.ErrorList, path *field.Path) field.ErrorList {
	for _, e := range errs {
		if e.Field == "spec" || strings.HasPrefix(e.Field, "spec.") || strings.HasPrefix(e.Field, "spec[") {
			e.Field = path.String() + strings.TrimPrefix(e.Field, "spec")
		}
	}
	return errs
}

package webhook

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/validation"
	"marina.dev/marina/provider"
)

// The webhook configuration (config/webhook/manifests.yaml) is generated
// from these markers. Only CREATE and UPDATE are checked: a delete is never
// refused, and status writes (a subresource) do not pass through here, so a
// controller can always report what happened.
//
// failurePolicy=fail: an object that was not checked is never stored. The
// timeout is short because the server is marina's own, on loopback or in the
// cluster, and answers from one or two reads of the API.
//
// +kubebuilder:webhookconfiguration:mutating=false,name=marina-validation
// +kubebuilder:webhook:path=/validate-cluster-marina-dev-v1alpha1-cluster,mutating=false,failurePolicy=fail,sideEffects=None,groups=cluster.marina.dev,resources=clusters,verbs=create;update,versions=v1alpha1,name=clusters.cluster.marina.dev,admissionReviewVersions=v1,timeoutSeconds=5
// +kubebuilder:webhook:path=/validate-cluster-marina-dev-v1alpha1-machine,mutating=false,failurePolicy=fail,sideEffects=None,groups=cluster.marina.dev,resources=machines,verbs=create;update,versions=v1alpha1,name=machines.cluster.marina.dev,admissionReviewVersions=v1,timeoutSeconds=5
// +kubebuilder:webhook:path=/validate-cluster-marina-dev-v1alpha1-machineclass,mutating=false,failurePolicy=fail,sideEffects=None,groups=cluster.marina.dev,resources=machineclasses,verbs=create;update,versions=v1alpha1,name=machineclasses.cluster.marina.dev,admissionReviewVersions=v1,timeoutSeconds=5
// +kubebuilder:webhook:path=/validate-cluster-marina-dev-v1alpha1-machineset,mutating=false,failurePolicy=fail,sideEffects=None,groups=cluster.marina.dev,resources=machinesets,verbs=create;update,versions=v1alpha1,name=machinesets.cluster.marina.dev,admissionReviewVersions=v1,timeoutSeconds=5
// +kubebuilder:webhook:path=/validate-cluster-marina-dev-v1alpha1-machinedeployment,mutating=false,failurePolicy=fail,sideEffects=None,groups=cluster.marina.dev,resources=machinedeployments,verbs=create;update,versions=v1alpha1,name=machinedeployments.cluster.marina.dev,admissionReviewVersions=v1,timeoutSeconds=5
// +kubebuilder:webhook:path=/validate-cluster-marina-dev-v1alpha1-machinehealthcheck,mutating=false,failurePolicy=fail,sideEffects=None,groups=cluster.marina.dev,resources=machinehealthchecks,verbs=create;update,versions=v1alpha1,name=machinehealthchecks.cluster.marina.dev,admissionReviewVersions=v1,timeoutSeconds=5

// The checks read classes and clusters straight from the API server.
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=clusters;machineclasses,verbs=get;list;watch

// Options configure the webhook.
type Options struct {
	// Providers are the providers running in this manager: their Validate
	// checks providerSpecs, and those that implement provider.VersionLister
	// say which control-plane versions they can run.
	Providers *provider.Registry
	// ExternalKinds are providerSpec kinds owned by provider processes
	// elsewhere: allowed here, with a warning that they are checked there.
	ExternalKinds []schema.GroupVersionKind
}

// Setup registers a validating webhook for every marina kind with the
// manager's webhook server.
func Setup(mgr ctrl.Manager, opts Options) error {
	c := &checker{reader: mgr.GetAPIReader(), providers: opts.Providers, external: opts.ExternalKinds}
	return firstError(
		register(mgr, &clusterv1.Cluster{}, c.cluster),
		register(mgr, &clusterv1.Machine{}, c.machine),
		register(mgr, &clusterv1.MachineClass{}, c.machineClass),
		register(mgr, &clusterv1.MachineSet{}, c.machineSet),
		register(mgr, &clusterv1.MachineDeployment{}, c.machineDeployment),
		register(mgr, &clusterv1.MachineHealthCheck{}, c.machineHealthCheck),
	)
}

func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("registering the admission webhook: %w", err)
		}
	}
	return nil
}

// checkFunc judges one object: what is wrong with it (field errors), what
// the user should know (warnings), or why it could not be judged (err).
type checkFunc[T client.Object] func(ctx context.Context, obj T) (field.ErrorList, admission.Warnings, error)

func register[T client.Object](mgr ctrl.Manager, obj T, check checkFunc[T]) error {
	return ctrl.NewWebhookManagedBy(mgr, obj).WithValidator(&validator[T]{check: check}).Complete()
}

// validator adapts a checkFunc to controller-runtime's admission.Validator.
type validator[T client.Object] struct {
	check checkFunc[T]
}

// ValidateCreate refuses an object with any error, and one that carries a
// reserved label when its requester may not set it.
func (v *validator[T]) ValidateCreate(ctx context.Context, obj T) (admission.Warnings, error) {
	errs, warnings, err := v.check(ctx, obj)
	if err != nil {
		return warnings, apierrors.NewInternalError(err)
	}
	if !privileged(ctx) {
		errs = append(errs, reservedLabelChanges(nil, obj)...)
		errs = append(errs, reservedAnnotationChanges(nil, obj)...)
	}
	return warnings, invalid(obj, errs)
}

// ValidateUpdate refuses an update that brings a new error. An error the
// stored object already had, at a field whose value the update leaves as it
// was, is not the update's fault: a class deleted since, or a rule added in
// a newer marina, must not block the controllers' own metadata updates or a
// user's fix of another field. A field the update changes is judged afresh,
// so a bad stored value cannot be swapped for another bad value (a kubelet
// v1.38 above a v1.37 control plane edited to v1.39). An object being
// deleted is never refused, so its finalizers can always come off.
func (v *validator[T]) ValidateUpdate(ctx context.Context, oldObj, newObj T) (admission.Warnings, error) {
	if newObj.GetDeletionTimestamp() != nil {
		return nil, nil
	}
	var reserved field.ErrorList
	if !privileged(ctx) {
		reserved = append(reservedLabelChanges(oldObj, newObj), reservedAnnotationChanges(oldObj, newObj)...)
	}
	errs, warnings, err := v.check(ctx, newObj)
	if err != nil {
		return warnings, apierrors.NewInternalError(err)
	}
	if len(errs) == 0 {
		return warnings, invalid(newObj, reserved)
	}
	oldErrs, _, err := v.check(ctx, oldObj)
	if err != nil {
		return warnings, apierrors.NewInternalError(err)
	}
	fresh, err := newErrors(errs, oldErrs, oldObj, newObj)
	if err != nil {
		return warnings, apierrors.NewInternalError(err)
	}
	return warnings, invalid(newObj, append(fresh, reserved...))
}

// ValidateDelete allows every delete.
func (v *validator[T]) ValidateDelete(context.Context, T) (admission.Warnings, error) {
	return nil, nil
}

// newErrors are the errors of errs that the update brings: those old does
// not have (same field and type), and those at a field whose value differs
// between oldObj and newObj.
func newErrors(errs, old field.ErrorList, oldObj, newObj client.Object) (field.ErrorList, error) {
	type key struct{ field, typ string }
	had := map[key]bool{}
	for _, e := range old {
		had[key{e.Field, string(e.Type)}] = true
	}
	before, err := runtime.DefaultUnstructuredConverter.ToUnstructured(oldObj)
	if err != nil {
		return nil, fmt.Errorf("reading the stored object: %w", err)
	}
	after, err := runtime.DefaultUnstructuredConverter.ToUnstructured(newObj)
	if err != nil {
		return nil, fmt.Errorf("reading the updated object: %w", err)
	}
	var out field.ErrorList
	for _, e := range errs {
		if !had[key{e.Field, string(e.Type)}] || !sameAt(before, after, e.Field) {
			out = append(out, e)
		}
	}
	return out, nil
}

// sameAt reports whether two objects hold the same value (or both none) at
// path, a field.Path as errors print it: spec.taints[0].key,
// spec.labels[example.com/tier]. A path it cannot follow counts as changed.
func sameAt(a, b map[string]any, path string) bool {
	va, ok := valueAt(a, path)
	if !ok {
		return false
	}
	vb, ok := valueAt(b, path)
	return ok && reflect.DeepEqual(va, vb)
}

// valueAt follows path through maps and lists; nil when a part is missing,
// false when path does not parse.
func valueAt(obj map[string]any, path string) (any, bool) {
	var cur any = obj
	for rest := path; rest != ""; {
		var part string
		bracket := strings.HasPrefix(rest, "[")
		if bracket {
			end := strings.IndexByte(rest, ']')
			if end < 0 {
				return nil, false
			}
			part, rest = rest[1:end], rest[end+1:]
		} else {
			end := strings.IndexAny(rest, ".[")
			if end < 0 {
				end = len(rest)
			}
			part, rest = rest[:end], rest[end:]
			if part == "" {
				return nil, false
			}
		}
		rest = strings.TrimPrefix(rest, ".")
		switch c := cur.(type) {
		case map[string]any:
			cur = c[part]
		case []any:
			i, err := strconv.Atoi(part)
			if !bracket || err != nil {
				return nil, false
			}
			if i < 0 || i >= len(c) {
				cur = nil
			} else {
				cur = c[i]
			}
		case nil:
			return nil, true
		default:
			return nil, false
		}
	}
	return cur, true
}

// invalid is the API's own "is invalid" error, the one kubectl shows for a
// schema violation, with every field path; nil when errs is empty.
func invalid(obj client.Object, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	gk := obj.GetObjectKind().GroupVersionKind().GroupKind()
	if gk.Empty() {
		gk = clusterv1.GroupVersion.WithKind(kindOf(obj)).GroupKind()
	}
	return apierrors.NewInvalid(gk, obj.GetName(), errs)
}

func kindOf(obj client.Object) string {
	switch obj.(type) {
	case *clusterv1.Cluster:
		return "Cluster"
	case *clusterv1.Machine:
		return "Machine"
	case *clusterv1.MachineClass:
		return "MachineClass"
	case *clusterv1.MachineSet:
		return "MachineSet"
	case *clusterv1.MachineDeployment:
		return "MachineDeployment"
	case *clusterv1.MachineHealthCheck:
		return "MachineHealthCheck"
	}
	return ""
}

// The kinds' checks: Kubernetes' syntax rules, then what needs other objects.

func (c *checker) cluster(ctx context.Context, cl *clusterv1.Cluster) (field.ErrorList, admission.Warnings, error) {
	errs := validation.Cluster(cl)
	more, warnings, err := c.controlPlane(ctx, cl)
	return append(errs, more...), warnings, err
}

func (c *checker) machine(ctx context.Context, m *clusterv1.Machine) (field.ErrorList, admission.Warnings, error) {
	errs := validation.Machine(m)
	more, warnings, err := c.machineSpec(ctx, m.Namespace, &m.Spec, true, field.NewPath("spec"))
	return append(errs, more...), warnings, err
}

func (c *checker) machineClass(_ context.Context, mc *clusterv1.MachineClass) (field.ErrorList, admission.Warnings, error) {
	errs := validation.MachineClass(mc)
	more, warnings := c.providerSpec(mc.Spec.ProviderSpec.Raw, field.NewPath("spec", "providerSpec"))
	return append(errs, more...), warnings, nil
}

func (c *checker) machineSet(ctx context.Context, s *clusterv1.MachineSet) (field.ErrorList, admission.Warnings, error) {
	errs := validation.MachineSet(s)
	more, warnings, err := c.machineSpec(ctx, s.Namespace, &s.Spec.Template.Spec, false, field.NewPath("spec", "template", "spec"))
	return append(errs, more...), warnings, err
}

func (c *checker) machineDeployment(ctx context.Context, d *clusterv1.MachineDeployment) (field.ErrorList, admission.Warnings, error) {
	errs := validation.MachineDeployment(d)
	more, warnings, err := c.machineSpec(ctx, d.Namespace, &d.Spec.Template.Spec, false, field.NewPath("spec", "template", "spec"))
	return append(errs, more...), warnings, err
}

func (c *checker) machineHealthCheck(_ context.Context, h *clusterv1.MachineHealthCheck) (field.ErrorList, admission.Warnings, error) {
	return validation.MachineHealthCheck(h), nil, nil
}

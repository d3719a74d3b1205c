package class

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// Resolved is a machine's configuration after its class and overrides are
// merged: what its provider receives and what its Node will look like.
type Resolved struct {
	// ProviderSpec is the provider object, as JSON in Raw.
	ProviderSpec runtime.RawExtension
	// GroupVersionKind is ProviderSpec's apiVersion and kind, which choose the
	// provider (M2).
	GroupVersionKind schema.GroupVersionKind
	// Labels are the Node's labels.
	Labels map[string]string
	// Taints are the Node's taints.
	Taints []corev1.Taint
	// Capacity is the Node capacity the class states; nil without a class.
	Capacity corev1.ResourceList
}

var (
	providerSpecPath = field.NewPath("spec", "providerSpec")
	classRefPath     = field.NewPath("spec", "classRef", "name")
)

// Merge resolves a machine's configuration from its spec and, when the spec
// names one in classRef, its MachineClass (see the package documentation for
// the semantics). class is ignored when the machine has no classRef.
//
// Merge never modifies its arguments. Every error it returns is a mistake in
// the machine or the class that retrying cannot fix: it is a
// field.ErrorList aggregate whose entries name the offending fields, ready
// for a condition message.
func Merge(class *clusterv1.MachineClass, machine *clusterv1.MachineSpec) (*Resolved, error) {
	if machine == nil {
		return nil, field.Required(field.NewPath("spec"), "the machine has no spec")
	}
	if machine.ClassRef == nil {
		return withoutClass(machine)
	}
	return withClass(class, machine)
}

// withoutClass is M5's backward compatibility: the machine's own providerSpec,
// unchanged.
func withoutClass(machine *clusterv1.MachineSpec) (*Resolved, error) {
	raw, err := rawJSON(machine.ProviderSpec)
	if err != nil {
		return nil, field.Invalid(providerSpecPath, field.OmitValueType{}, err.Error())
	}
	if raw == nil {
		return nil, field.Required(providerSpecPath, "set classRef to a MachineClass or providerSpec to a full provider object")
	}
	obj, err := decodeObject(raw)
	if err != nil {
		return nil, field.Invalid(providerSpecPath, field.OmitValueType{}, err.Error())
	}
	gvk, errs := objectGVK(obj, providerSpecPath)
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return &Resolved{
		ProviderSpec:     runtime.RawExtension{Raw: bytes.Clone(raw)},
		GroupVersionKind: gvk,
		Labels:           mergeLabels(nil, machine.Labels),
		Taints:           mergeTaints(nil, machine.Taints),
	}, nil
}

func withClass(class *clusterv1.MachineClass, machine *clusterv1.MachineSpec) (*Resolved, error) {
	name := machine.ClassRef.Name
	if class == nil {
		return nil, field.Invalid(classRefPath, name, "no such MachineClass: name an existing class (kubectl get machineclasses) or ask an administrator to publish it")
	}
	if class.Name != name {
		return nil, field.Invalid(classRefPath, name, fmt.Sprintf("resolved against machine class %q, not the class the machine names", class.Name))
	}
	classSpecPath := field.NewPath("machineclass", name, "spec", "providerSpec")

	classRaw, err := rawJSON(&class.Spec.ProviderSpec)
	if err != nil {
		return nil, field.Invalid(classSpecPath, field.OmitValueType{}, fmt.Sprintf("machine class %q: %v", name, err))
	}
	if classRaw == nil {
		return nil, field.Required(classSpecPath, fmt.Sprintf("machine class %q has no providerSpec", name))
	}
	base, err := decodeObject(classRaw)
	if err != nil {
		return nil, field.Invalid(classSpecPath, field.OmitValueType{}, fmt.Sprintf("machine class %q: %v", name, err))
	}
	gvk, errs := objectGVK(base, classSpecPath)
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}

	patch := map[string]any{}
	overrideRaw, err := rawJSON(machine.ProviderSpec)
	if err != nil {
		return nil, field.Invalid(providerSpecPath, field.OmitValueType{}, err.Error())
	}
	if overrideRaw != nil {
		if patch, err = decodeObject(overrideRaw); err != nil {
			return nil, field.Invalid(providerSpecPath, field.OmitValueType{}, err.Error())
		}
	}

	errs = append(errs, checkIdentity(patch, base, name)...)
	errs = append(errs, checkNodeTemplate(class, machine)...)
	allowed := parsePaths(class.Spec.AllowedOverrides)
	for _, k := range sortedKeys(patch) {
		if k == "apiVersion" || k == "kind" {
			continue
		}
		errs = append(errs, checkAllowed([]string{k}, patch[k], base[k], true, allowed, name, class.Spec.AllowedOverrides)...)
	}
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	delete(patch, "apiVersion")
	delete(patch, "kind")

	merged, err := encode(mergePatch(base, patch))
	if err != nil {
		return nil, field.InternalError(providerSpecPath, err)
	}
	return &Resolved{
		ProviderSpec:     runtime.RawExtension{Raw: merged},
		GroupVersionKind: gvk,
		Labels:           mergeLabels(class.Spec.NodeTemplate.Labels, machine.Labels),
		Taints:           mergeTaints(class.Spec.NodeTemplate.Taints, machine.Taints),
		Capacity:         class.Spec.NodeTemplate.Capacity.DeepCopy(),
	}, nil
}

// checkNodeTemplate refuses machine labels and taints that would change
// one of the class's: those are the administrator's (M6).
func checkNodeTemplate(class *clusterv1.MachineClass, machine *clusterv1.MachineSpec) field.ErrorList {
	var errs field.ErrorList
	tmpl := class.Spec.NodeTemplate
	for _, k := range slices.Sorted(maps.Keys(machine.Labels)) {
		if v, ok := tmpl.Labels[k]; ok && v != machine.Labels[k] {
			errs = append(errs, field.Forbidden(field.NewPath("spec", "labels").Key(k), fmt.Sprintf(
				"MachineClass %q sets this label to %q, and a class's labels are its administrator's: remove it from the machine, or use another key", class.Name, v)))
		}
	}
	for i, t := range machine.Taints {
		for _, ct := range tmpl.Taints {
			if ct.Key == t.Key && ct.Effect == t.Effect && ct.Value != t.Value {
				errs = append(errs, field.Forbidden(field.NewPath("spec", "taints").Index(i), fmt.Sprintf(
					"MachineClass %q sets taint %s:%s with value %q, and a class's taints are its administrator's: remove it from the machine, or use another key",
					class.Name, ct.Key, ct.Effect, ct.Value)))
			}
		}
	}
	return errs
}

// checkIdentity refuses an override that names another apiVersion or kind
// than its class: those choose the provider, which the class fixes.
func checkIdentity(patch, base map[string]any, class string) field.ErrorList {
	var errs field.ErrorList
	for _, k := range []string{"apiVersion", "kind"} {
		v, ok := patch[k]
		if !ok {
			continue
		}
		if s, isString := v.(string); isString && s == base[k] {
			continue
		}
		errs = append(errs, field.Invalid(providerSpecPath.Child(k), v,
			fmt.Sprintf("must be %v, as in machine class %q, or be left out", base[k], class)))
	}
	return errs
}

// checkAllowed reports the fields of the override value v at path that the
// class's allowed paths do not cover. classV is the class's value at path;
// inClass tells whether the class has one.
func checkAllowed(path []string, v, classV any, inClass bool, allowed [][]string, class string, list []string) field.ErrorList {
	if covered(path, allowed) {
		return nil
	}
	obj, isObj := v.(map[string]any)
	classObj, classIsObj := classV.(map[string]any)
	// An object merges into the class's object key by key, so only its keys
	// need checking; anything else here (a scalar, a list, null, an object
	// replacing a non-object, or a new object off every allowed path) would
	// set, replace or remove something no allowed path covers.
	if !isObj || (inClass && !classIsObj) || (!inClass && !leadsTo(path, allowed)) {
		return field.ErrorList{field.Forbidden(fieldPath(path),
			fmt.Sprintf("machine class %q does not allow overriding this field (allowed: %s)", class, describe(list)))}
	}
	var errs field.ErrorList
	for _, k := range sortedKeys(obj) {
		cv, ok := classObj[k]
		errs = append(errs, checkAllowed(append(path[:len(path):len(path)], k), obj[k], cv, ok, allowed, class, list)...)
	}
	return errs
}

// covered tells whether path is an allowed path or lies below one.
func covered(path []string, allowed [][]string) bool {
	for _, a := range allowed {
		if len(a) <= len(path) && slices.Equal(a, path[:len(a)]) {
			return true
		}
	}
	return false
}

// leadsTo tells whether path is a proper prefix of an allowed path.
func leadsTo(path []string, allowed [][]string) bool {
	for _, a := range allowed {
		if len(a) > len(path) && slices.Equal(a[:len(path)], path) {
			return true
		}
	}
	return false
}

func parsePaths(list []string) [][]string {
	out := make([][]string, 0, len(list))
	for _, p := range list {
		if p == "" {
			continue
		}
		out = append(out, strings.Split(p, "."))
	}
	return out
}

func describe(list []string) string {
	if len(list) == 0 {
		return "nothing"
	}
	return strings.Join(list, ", ")
}

func fieldPath(path []string) *field.Path {
	p := providerSpecPath
	for _, k := range path {
		p = p.Child(k)
	}
	return p
}

// mergePatch applies patch to target as RFC 7386 says. It does not modify
// target or patch.
func mergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	out := make(map[string]any, len(t)+len(p))
	if ok {
		maps.Copy(out, t)
	}
	for k, v := range p {
		if v == nil {
			delete(out, k)
			continue
		}
		out[k] = mergePatch(out[k], v)
	}
	return out
}

// mergeLabels returns class's labels with the machine's added (a clash was
// refused before, by checkNodeTemplate).
func mergeLabels(class, machine map[string]string) map[string]string {
	if len(class)+len(machine) == 0 {
		return nil
	}
	out := make(map[string]string, len(class)+len(machine))
	maps.Copy(out, class)
	maps.Copy(out, machine)
	return out
}

// mergeTaints returns class's taints followed by the machine's other taints
// (a machine taint with a class taint's key and effect has its value, or was
// refused by checkNodeTemplate).
func mergeTaints(class, machine []corev1.Taint) []corev1.Taint {
	if len(class)+len(machine) == 0 {
		return nil
	}
	out := make([]corev1.Taint, 0, len(class)+len(machine))
	for i := range class {
		out = append(out, *class[i].DeepCopy())
	}
	for i := range machine {
		t := *machine[i].DeepCopy()
		replaced := false
		for j := range out {
			if out[j].Key == t.Key && out[j].Effect == t.Effect {
				out[j], replaced = t, true
				break
			}
		}
		if !replaced {
			out = append(out, t)
		}
	}
	return out
}

// rawJSON is the JSON of ext, nil when there is none.
func rawJSON(ext *runtime.RawExtension) ([]byte, error) {
	switch {
	case ext == nil:
		return nil, nil
	case len(ext.Raw) > 0:
		return ext.Raw, nil
	case ext.Object != nil:
		b, err := json.Marshal(ext.Object)
		if err != nil {
			return nil, fmt.Errorf("encoding the provider object: %w", err)
		}
		return b, nil
	default:
		return nil, nil
	}
}

// decodeObject decodes a JSON object, keeping numbers exactly as written.
func decodeObject(raw []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("not valid JSON: data after the object")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("must be a JSON object with apiVersion and kind, not %s", jsonType(v))
	}
	return obj, nil
}

// objectGVK reads the apiVersion and kind of a provider object.
func objectGVK(obj map[string]any, path *field.Path) (schema.GroupVersionKind, field.ErrorList) {
	var errs field.ErrorList
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	if apiVersion == "" {
		errs = append(errs, field.Required(path.Child("apiVersion"), "the provider object's API version, e.g. local.marina.dev/v1alpha1"))
	}
	if kind == "" {
		errs = append(errs, field.Required(path.Child("kind"), "the provider object's kind, e.g. LocalMachine"))
	}
	if len(errs) > 0 {
		return schema.GroupVersionKind{}, errs
	}
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return schema.GroupVersionKind{}, field.ErrorList{field.Invalid(path.Child("apiVersion"), apiVersion, err.Error())}
	}
	return gv.WithKind(kind), nil
}

// encode writes v as compact JSON with sorted object keys, so that equal
// values encode to equal bytes.
func encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case []any:
		return "a list"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	default:
		return fmt.Sprintf("%T", v)
	}
}

func sortedKeys(m map[string]any) []string {
	return slices.Sorted(maps.Keys(m))
}

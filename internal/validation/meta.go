package validation

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/validate/content"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// invalid reports value at fldPath with the messages apimachinery gave for
// it, joined, or nothing when there are none.
func invalid(fldPath *field.Path, value any, msgs []string) field.ErrorList {
	if len(msgs) == 0 {
		return nil
	}
	return field.ErrorList{field.Invalid(fldPath, value, strings.Join(msgs, "; "))}
}

// sortedKeys returns the keys of m in order, so that errors come out in the
// same order every time.
func sortedKeys[K ~string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// labelMap checks a label map the way Kubernetes checks an object's labels:
// each key a qualified name (an optional DNS subdomain prefix and '/', then
// at most 63 characters), each value at most 63 characters of a restricted
// alphabet. Errors are reported at fldPath[key].
func labelMap(m map[string]string, fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, k := range sortedKeys(m) {
		p := fldPath.Key(k)
		errs = append(errs, invalid(p, k, content.IsLabelKey(k))...)
		errs = append(errs, invalid(p, m[k], content.IsLabelValue(m[k]))...)
	}
	return errs
}

// annotationMap checks an annotation map the way Kubernetes checks an
// object's annotations: keys are qualified names (case does not matter) and
// keys and values together take at most 256 KiB.
func annotationMap(m map[string]string, fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, k := range sortedKeys(m) {
		errs = append(errs, invalid(fldPath.Key(k), k, content.IsLabelKey(strings.ToLower(k)))...)
	}
	if apivalidation.ValidateAnnotationsSize(m) != nil {
		errs = append(errs, field.TooLong(fldPath, "", apivalidation.TotalAnnotationSizeLimitB))
	}
	return errs
}

// selectorOperators are the operators a label selector's matchExpressions
// may use.
var selectorOperators = []metav1.LabelSelectorOperator{
	metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist,
}

// selector checks a label selector as Kubernetes does for a Deployment's:
// matchLabels are labels, and each expression has a qualified key, a known
// operator, values with In and NotIn and none with Exists and DoesNotExist.
func selector(s *metav1.LabelSelector, fldPath *field.Path) field.ErrorList {
	errs := labelMap(s.MatchLabels, fldPath.Child("matchLabels"))
	for i, r := range s.MatchExpressions {
		p := fldPath.Child("matchExpressions").Index(i)
		errs = append(errs, invalid(p.Child("key"), r.Key, content.IsLabelKey(r.Key))...)
		switch r.Operator {
		case metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn:
			if len(r.Values) == 0 {
				errs = append(errs, field.Required(p.Child("values"),
					fmt.Sprintf("operator %s needs at least one value: list the label values to match", r.Operator)))
			}
		case metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist:
			if len(r.Values) > 0 {
				errs = append(errs, field.Forbidden(p.Child("values"),
					fmt.Sprintf("operator %s matches on the key alone: remove values, or use In or NotIn", r.Operator)))
			}
		default:
			errs = append(errs, field.NotSupported(p.Child("operator"), r.Operator, selectorOperators))
		}
		for j, v := range r.Values {
			errs = append(errs, invalid(p.Child("values").Index(j), v, content.IsLabelValue(v))...)
		}
	}
	return errs
}

// dnsLabel checks a name that is used as a DNS label (RFC 1123): at most 63
// lower-case letters, digits and '-'.
func dnsLabel(name string, fldPath *field.Path) field.ErrorList {
	return invalid(fldPath, name, content.IsDNS1123Label(name))
}

// dnsSubdomain checks a name that is used as a DNS subdomain (RFC 1123),
// which is what Kubernetes requires of most object names.
func dnsSubdomain(name string, fldPath *field.Path) field.ErrorList {
	return invalid(fldPath, name, content.IsDNS1123Subdomain(name))
}

// qualifiedName checks a name Kubernetes spells like a label key, such as a
// condition type.
func qualifiedName(name string) []string { return content.IsLabelKey(name) }

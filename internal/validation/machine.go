package validation

import (
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// ProviderSpecMaxBytes bounds a providerSpec (of a Machine, a template, a
// MachineClass or a control plane) to 64 KiB of JSON. A provider's
// configuration is a handful of settings; the bound keeps a mistaken paste
// (a disk image, a whole kubeconfig) from being copied into every machine
// and every merge, and keeps objects far below the API server's size limit.
const ProviderSpecMaxBytes = 64 << 10

// taintEffects are the effects a Node's taint may have.
var taintEffects = []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute}

// MachineSpec checks the spec of a Machine, or of a set's or deployment's
// machine template, rooted at fldPath (spec, or spec.template.spec).
func MachineSpec(spec *clusterv1.MachineSpec, fldPath *field.Path) field.ErrorList {
	errs := dnsLabel(spec.ClusterName, fldPath.Child("clusterName"))
	errs = append(errs, labelMap(spec.Labels, fldPath.Child("labels"))...)
	errs = append(errs, taints(spec.Taints, fldPath.Child("taints"))...)
	if spec.ClassRef != nil {
		errs = append(errs, dnsSubdomain(spec.ClassRef.Name, fldPath.Child("classRef", "name"))...)
	}
	if spec.KubeletConfigRef != nil {
		errs = append(errs, dnsSubdomain(spec.KubeletConfigRef.Name, fldPath.Child("kubeletConfigRef", "name"))...)
	}
	errs = append(errs, providerSpec(spec.ProviderSpec, fldPath.Child("providerSpec"))...)
	errs = append(errs, componentVersions(spec.Versions.Components, fldPath.Child("versions", "components"))...)
	return errs
}

var versionFormat = regexp.MustCompile(clusterv1.VersionPattern)

// componentVersions checks the format of each component's version: a
// version names the component's binary (kube-apiserver-v1.37.2) in a
// path on the management host and in a shell command on an SSH host.
func componentVersions(c *clusterv1.ComponentVersions, fldPath *field.Path) field.ErrorList {
	if c == nil {
		return nil
	}
	var errs field.ErrorList
	for _, v := range []struct{ name, value string }{
		{"apiServer", c.APIServer}, {"controllerManager", c.ControllerManager}, {"scheduler", c.Scheduler}, {"etcd", c.Etcd},
	} {
		if v.value != "" && (len(v.value) > 64 || !versionFormat.MatchString(v.value)) {
			errs = append(errs, field.Invalid(fldPath.Child(v.name), v.value,
				"must be a release version like v1.37.2 (etcd: v3.6.16): a leading v, then major.minor.patch, at most 64 characters; or empty to follow versions.controlPlane"))
		}
	}
	return errs
}

// taints checks Node taints as Kubernetes checks a Node's: the key a
// qualified name, the value a label value, a known effect.
func taints(ts []corev1.Taint, fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, t := range ts {
		p := fldPath.Index(i)
		errs = append(errs, invalid(p.Child("key"), t.Key, content.IsLabelKey(t.Key))...)
		errs = append(errs, invalid(p.Child("value"), t.Value, content.IsLabelValue(t.Value))...)
		switch {
		case t.Effect == "":
			errs = append(errs, field.Required(p.Child("effect"), "set the effect: NoSchedule, PreferNoSchedule or NoExecute"))
		case !containsEffect(t.Effect):
			errs = append(errs, field.NotSupported(p.Child("effect"), t.Effect, taintEffects))
		}
	}
	return errs
}

func containsEffect(e corev1.TaintEffect) bool {
	for _, known := range taintEffects {
		if e == known {
			return true
		}
	}
	return false
}

// providerSpec bounds the size of a provider configuration.
func providerSpec(raw *runtime.RawExtension, fldPath *field.Path) field.ErrorList {
	if raw == nil || len(raw.Raw) <= ProviderSpecMaxBytes {
		return nil
	}
	err := field.TooLong(fldPath, "", ProviderSpecMaxBytes)
	// The size is left out of the message so that the error reads the same
	// for every oversized value.
	err.Detail = fmt.Sprintf("may hold at most %d bytes of JSON: keep large data (scripts, images, certificates) in a Secret or ConfigMap the provider reads",
		ProviderSpecMaxBytes)
	return field.ErrorList{err}
}

// capacity checks a Node's resource capacity as Kubernetes checks a Node's
// status.capacity: known resource names or extended resources with a domain
// prefix, quantities that are not negative, and whole numbers for pods and
// extended resources.
func capacity(rl corev1.ResourceList, fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, rn := range sortedKeys(rl) {
		name, p, q := string(rn), fldPath.Key(string(rn)), rl[rn]
		errs = append(errs, resourceName(name, p)...)
		if q.Sign() < 0 {
			errs = append(errs, field.Invalid(p, q.String(), "must not be negative: give the capacity a Node of this class has, e.g. 8 or 32Gi"))
			continue
		}
		if isIntegerResource(name) && q.MilliValue()%1000 != 0 {
			errs = append(errs, field.Invalid(p, q.String(), "must be a whole number: "+name+" is counted in units, not fractions"))
		}
	}
	return errs
}

// nodeResources are the resources without a domain prefix a Node reports.
var nodeResources = []string{string(corev1.ResourceCPU), string(corev1.ResourceMemory), string(corev1.ResourceEphemeralStorage), string(corev1.ResourcePods)}

func resourceName(name string, fldPath *field.Path) field.ErrorList {
	if msgs := content.IsLabelKey(name); len(msgs) > 0 {
		return invalid(fldPath, name, msgs)
	}
	if strings.Contains(name, "/") {
		return nil
	}
	for _, known := range nodeResources {
		if name == known {
			return nil
		}
	}
	if size, ok := strings.CutPrefix(name, corev1.ResourceHugePagesPrefix); ok {
		if _, err := resource.ParseQuantity(size); err == nil {
			return nil
		}
	}
	return field.ErrorList{field.Invalid(fldPath, name, fmt.Sprintf(
		"must be one of %s, hugepages-<size> (hugepages-2Mi), or an extended resource with a domain prefix (nvidia.com/gpu)",
		strings.Join(nodeResources, ", ")))}
}

// isIntegerResource reports whether a resource is counted in whole units:
// pods, and extended resources (a domain prefix other than kubernetes.io).
func isIntegerResource(name string) bool {
	if name == string(corev1.ResourcePods) {
		return true
	}
	domain, _, prefixed := strings.Cut(name, "/")
	return prefixed && domain != "kubernetes.io" && !strings.HasSuffix(domain, ".kubernetes.io")
}

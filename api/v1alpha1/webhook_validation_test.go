package v1alpha1_test

import (
	"encoding/json"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation/field"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/validation"
)

// webhookInvalidCases break Kubernetes' own syntax rules in ways the CRDs'
// schemas do not check; marina's admission webhook refuses them with the
// errors of internal/validation. Each want starts with the field path.
var webhookInvalidCases = []invalidCase{
	// Machine.
	{name: "node label value longer than 63", base: validMachine,
		create: []change{set(obj{"pool": strings.Repeat("a", 64)}, "spec", "labels")},
		want:   `spec.labels[pool]: Invalid value: "` + strings.Repeat("a", 64) + `": must be no more than 63 bytes`},
	{name: "node label key with two slashes", base: validMachine,
		create: []change{set(obj{"a/b/c": "x"}, "spec", "labels")},
		want:   `spec.labels[a/b/c]: Invalid value: "a/b/c": a valid label key must consist of`},
	{name: "node label value with a space", base: validClassMachine,
		create: []change{set(obj{"tier": "gold tier"}, "spec", "labels")},
		want:   `spec.labels[tier]: Invalid value: "gold tier": a valid label must be an empty string or consist of`},
	{name: "taint key that is not a qualified name", base: validMachine,
		create: []change{set(list(obj{"key": "dedicated node", "value": "infra", "effect": "NoSchedule"}), "spec", "taints")},
		want:   `spec.taints[0].key: Invalid value: "dedicated node": name part must consist of alphanumeric characters`},
	{name: "taint value longer than 63", base: validMachine,
		create: []change{set(list(obj{"key": "dedicated", "value": strings.Repeat("v", 64), "effect": "NoSchedule"}), "spec", "taints")},
		want:   `spec.taints[0].value: Invalid value: "` + strings.Repeat("v", 64) + `": must be no more than 63 bytes`},
	{name: "machine class name in upper case", base: validClassMachine,
		create: []change{set("GPU", "spec", "classRef", "name")},
		want:   `spec.classRef.name: Invalid value: "GPU": a lowercase RFC 1123 subdomain`},
	{name: "kubelet config name in upper case", base: validMachine,
		create: []change{set(obj{"name": "Kubelet-V2"}, "spec", "kubeletConfigRef")},
		want:   `spec.kubeletConfigRef.name: Invalid value: "Kubelet-V2": a lowercase RFC 1123 subdomain`},
	{name: "machine providerSpec over 64 KiB", base: validMachine,
		create: []change{set(strings.Repeat("x", 70_000), "spec", "providerSpec", "spec", "userData")},
		want:   `spec.providerSpec: Too long: may hold at most 65536 bytes of JSON`},

	// Cluster.
	{name: "cluster name with a dot", base: validCluster,
		create: []change{set("prod.eu", "metadata", "name")},
		want:   `metadata.name: Invalid value: "prod.eu": must not contain dots`},
	{name: "endpoint host that is a URL", base: validCluster,
		create: []change{set(obj{"host": "https://api:6443", "port": int64(6443)}, "spec", "controlPlaneEndpoint")},
		want:   `spec.controlPlaneEndpoint.host: Invalid value: "https://api:6443": must be an IP address or a DNS name`},
	{name: "extraArgs key with its value", base: validCluster,
		create: []change{set(obj{"v=2": ""}, "spec", "controlPlane", "components", "apiServer", "extraArgs")},
		want:   `spec.controlPlane.components.apiServer.extraArgs[v=2]: Invalid value: "v=2": must be a flag name`},
	{name: "extraArgs key in upper case", base: validCluster,
		create: []change{set(obj{"Leader-Elect": "false"}, "spec", "controlPlane", "components", "controllerManager", "extraArgs")},
		want:   `spec.controlPlane.components.controllerManager.extraArgs[Leader-Elect]: Invalid value: "Leader-Elect": must be a flag name`},
	{name: "extraArgs binding the API server to every interface", base: validCluster,
		create: []change{set(obj{"bind-address": "0.0.0.0"}, "spec", "controlPlane", "components", "apiServer", "extraArgs")},
		want:   `spec.controlPlane.components.apiServer.extraArgs[bind-address]: Forbidden: kube-apiserver --bind-address is owned by marina`},
	{name: "extraArgs naming the controller manager's signing key", base: validCluster,
		create: []change{set(obj{"cluster-signing-key-file": "/state/pki/ca.key"}, "spec", "controlPlane", "components", "controllerManager", "extraArgs")},
		want:   `spec.controlPlane.components.controllerManager.extraArgs[cluster-signing-key-file]: Forbidden: kube-controller-manager --cluster-signing-key-file is owned by marina: it names service-account or signing keys`},
	{name: "control-plane class name in upper case", base: validCluster,
		create: []change{set(obj{"name": "Large"}, "spec", "controlPlane", "classRef")},
		want:   `spec.controlPlane.classRef.name: Invalid value: "Large": a lowercase RFC 1123 subdomain`},
	{name: "CA secret name with a slash", base: validCluster,
		create: []change{set(obj{"name": "other/ca"}, "spec", "controlPlane", "caSecretRef")},
		want:   `spec.controlPlane.caSecretRef.name: Invalid value: "other/ca": a lowercase RFC 1123 subdomain`},
	{name: "etcd client secret name in upper case", base: validCluster,
		create: []change{set(obj{"type": "External", "external": obj{"endpoints": list("https://10.0.0.5:2379"), "secretRef": obj{"name": "Etcd-Client"}}}, "spec", "controlPlane", "etcd")},
		want:   `spec.controlPlane.etcd.external.secretRef.name: Invalid value: "Etcd-Client": a lowercase RFC 1123 subdomain`},
	{name: "control-plane providerSpec over 64 KiB", base: validCluster,
		create: []change{set(strings.Repeat("x", 70_000), "spec", "controlPlane", "providerSpec", "spec", "userData")},
		want:   `spec.controlPlane.providerSpec: Too long: may hold at most 65536 bytes of JSON`},

	// MachineClass.
	{name: "class with negative memory", base: validClass,
		create: []change{set("-1Gi", "spec", "nodeTemplate", "capacity", "memory")},
		want:   `spec.nodeTemplate.capacity[memory]: Invalid value: "-1Gi": must not be negative`},
	{name: "class with a negative number of GPUs", base: validClass,
		create: []change{set("-1", "spec", "nodeTemplate", "capacity", "nvidia.com/gpu")},
		want:   `spec.nodeTemplate.capacity[nvidia.com/gpu]: Invalid value: "-1": must not be negative`},
	{name: "class with half a GPU", base: validClass,
		create: []change{set("500m", "spec", "nodeTemplate", "capacity", "nvidia.com/gpu")},
		want:   `spec.nodeTemplate.capacity[nvidia.com/gpu]: Invalid value: "500m": must be a whole number`},
	{name: "class with a fractional pod count", base: validClass,
		create: []change{set("110.5", "spec", "nodeTemplate", "capacity", "pods")},
		want:   `spec.nodeTemplate.capacity[pods]: Invalid value: "110500m": must be a whole number`},
	{name: "class capacity of a resource without a domain", base: validClass,
		create: []change{set("1", "spec", "nodeTemplate", "capacity", "gpu")},
		want:   `spec.nodeTemplate.capacity[gpu]: Invalid value: "gpu": must be one of cpu, memory, ephemeral-storage, pods`},
	{name: "class node label value longer than 63", base: validClass,
		create: []change{set(obj{"tier": strings.Repeat("g", 64)}, "spec", "nodeTemplate", "labels")},
		want:   `spec.nodeTemplate.labels[tier]: Invalid value: "` + strings.Repeat("g", 64) + `": must be no more than 63 bytes`},
	{name: "class taint key with a space", base: validClass,
		create: []change{set(list(obj{"key": "nvidia gpu", "value": "present", "effect": "NoSchedule"}), "spec", "nodeTemplate", "taints")},
		want:   `spec.nodeTemplate.taints[0].key: Invalid value: "nvidia gpu": name part must consist of`},
	{name: "class providerSpec over 64 KiB", base: validClass,
		create: []change{set(strings.Repeat("x", 70_000), "spec", "providerSpec", "spec", "userData")},
		want:   `spec.providerSpec: Too long: may hold at most 65536 bytes of JSON`},

	// MachineSet.
	{name: "set selector that does not match its template", base: validMachineSet,
		create: []change{set(obj{"pool": "b"}, "spec", "template", "metadata", "labels")},
		want:   `spec.template.metadata.labels: Invalid value: "pool=b": must match spec.selector (pool=a)`},
	{name: "set selector with an unknown operator", base: validMachineSet,
		create: []change{set(list(obj{"key": "zone", "operator": "Equals", "values": list("z1")}), "spec", "selector", "matchExpressions")},
		want:   `spec.selector.matchExpressions[0].operator: Unsupported value: "Equals": supported values: "In", "NotIn", "Exists", "DoesNotExist"`},
	{name: "set selector In without values", base: validMachineSet,
		create: []change{set(list(obj{"key": "zone", "operator": "In"}), "spec", "selector", "matchExpressions")},
		want:   `spec.selector.matchExpressions[0].values: Required value: operator In needs at least one value`},
	{name: "set selector Exists with values", base: validMachineSet,
		create: []change{set(list(obj{"key": "pool", "operator": "Exists", "values": list("a")}), "spec", "selector", "matchExpressions")},
		want:   `spec.selector.matchExpressions[0].values: Forbidden: operator Exists matches on the key alone`},
	{name: "set template label key with two slashes", base: validMachineSet,
		create: []change{set(obj{"pool": "a", "a/b/c": "x"}, "spec", "template", "metadata", "labels")},
		want:   `spec.template.metadata.labels[a/b/c]: Invalid value: "a/b/c": a valid label key`},
	{name: "set template annotation key with a space", base: validMachineSet,
		create: []change{set(obj{"owner team": "infra"}, "spec", "template", "metadata", "annotations")},
		want:   `spec.template.metadata.annotations[owner team]: Invalid value: "owner team": name part must consist of`},
	{name: "set template taint key with a space", base: validMachineSet,
		create: []change{set(list(obj{"key": "a b", "effect": "NoSchedule"}), "spec", "template", "spec", "taints")},
		want:   `spec.template.spec.taints[0].key: Invalid value: "a b": name part must consist of`},
	{name: "set autoscaler min larger than max", base: validMachineSet,
		create: []change{set(obj{clusterv1.AutoscalerMinSizeAnnotation: "5", clusterv1.AutoscalerMaxSizeAnnotation: "3"}, "metadata", "annotations")},
		want:   `metadata.annotations[` + clusterv1.AutoscalerMaxSizeAnnotation + `]: Invalid value: "3": must be at least the min size`},
	{name: "set autoscaler negative min", base: validMachineSet,
		create: []change{set(obj{clusterv1.AutoscalerMinSizeAnnotation: "-1", clusterv1.AutoscalerMaxSizeAnnotation: "3"}, "metadata", "annotations")},
		want:   `metadata.annotations[` + clusterv1.AutoscalerMinSizeAnnotation + `]: Invalid value: "-1": must be a non-negative whole number`},

	// MachineDeployment.
	{name: "deployment selector that does not match its template", base: validMachineDeployment,
		create: []change{set(obj{"pool": "a"}, "spec", "selector", "matchLabels"), set(list(obj{"key": "zone", "operator": "Exists"}), "spec", "selector", "matchExpressions")},
		want:   `spec.template.metadata.labels: Invalid value: "pool=a": must match spec.selector (pool=a,zone)`},
	{name: "deployment selector label value longer than 63", base: validMachineDeployment,
		create: []change{set(obj{"pool": strings.Repeat("p", 64)}, "spec", "selector", "matchLabels")},
		want:   `spec.selector.matchLabels[pool]: Invalid value: "` + strings.Repeat("p", 64) + `": must be no more than 63 bytes`},
	{name: "deployment autoscaler max in words", base: validMachineDeployment,
		create: []change{set(obj{clusterv1.AutoscalerMaxSizeAnnotation: "ten"}, "metadata", "annotations")},
		want:   `metadata.annotations[` + clusterv1.AutoscalerMaxSizeAnnotation + `]: Invalid value: "ten": must be a non-negative whole number`},
	{name: "deployment autoscaler min with a sign", base: validMachineDeployment,
		create: []change{set(obj{clusterv1.AutoscalerMinSizeAnnotation: "+1"}, "metadata", "annotations")},
		want:   `metadata.annotations[` + clusterv1.AutoscalerMinSizeAnnotation + `]: Invalid value: "+1": must be a non-negative whole number`},
	{name: "deployment template node label value longer than 63", base: validMachineDeployment,
		create: []change{set(obj{"tier": strings.Repeat("g", 64)}, "spec", "template", "spec", "labels")},
		want:   `spec.template.spec.labels[tier]: Invalid value: "` + strings.Repeat("g", 64) + `": must be no more than 63 bytes`},
	{name: "deployment selector DoesNotExist on a template label", base: validMachineDeployment,
		create: []change{set(list(obj{"key": "spot", "operator": "DoesNotExist"}), "spec", "selector", "matchExpressions"),
			set(obj{"pool": "a", "spot": "true"}, "spec", "template", "metadata", "labels")},
		want: `spec.template.metadata.labels: Invalid value: "pool=a,spot=true": must match spec.selector (pool=a,!spot)`},

	// MachineHealthCheck.
	{name: "health check condition type with a space", base: validHealthCheck,
		create: []change{set(list(obj{"type": "Kernel Deadlock", "status": "True", "timeout": "5m"}), "spec", "unhealthyConditions")},
		want:   `spec.unhealthyConditions[0].type: Invalid value: "Kernel Deadlock": name part must consist of`},
	{name: "health check selector with an unknown operator", base: validHealthCheck,
		create: []change{set(list(obj{"key": "pool", "operator": "Like", "values": list("a")}), "spec", "selector", "matchExpressions")},
		want:   `spec.selector.matchExpressions[0].operator: Unsupported value: "Like": supported values: "In", "NotIn", "Exists", "DoesNotExist"`},
	{name: "health check cluster name in upper case", base: validHealthCheck,
		create: []change{set("Prod", "spec", "clusterName")},
		want:   `spec.clusterName: Invalid value: "Prod": a lowercase RFC 1123 label`},
	{name: "health check selector value with a slash", base: validHealthCheck,
		create: []change{set(obj{"pool": "a/b"}, "spec", "selector", "matchLabels")},
		want:   `spec.selector.matchLabels[pool]: Invalid value: "a/b": a valid label must be`},
}

// TestWebhookRefusesInvalidObjects sends the cases through the API server:
// the schema lets each through, and marina's admission webhook refuses it
// with its field path.
func TestWebhookRefusesInvalidObjects(t *testing.T) {
	runInvalidCases(t, webhookInvalidCases, true)
}

// TestWebhookRulesInGo checks that each case is valid to the schema's eyes
// only because internal/validation, which the webhook runs, is what refuses
// it: the object decodes and the function for its kind gives the error.
func TestWebhookRulesInGo(t *testing.T) {
	for _, tc := range webhookInvalidCases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.update != nil {
				t.Fatal("webhook cases check syntax, which does not depend on the old object: use create")
			}
			u := decode(t, tc.base)
			u.SetName("case")
			for _, c := range tc.create {
				c(u.Object)
			}
			errs := validateInGo(t, u.GetKind(), u.Object)
			for _, e := range errs {
				if strings.Contains(e.Error(), tc.want) {
					return
				}
			}
			t.Fatalf("no error says %q; got %v", tc.want, errs)
		})
	}
}

// TestValidObjectsPassInGo guards against syntax rules that refuse too
// much: the valid objects the cases start from, and every manifest under
// examples/, pass internal/validation.
func TestValidObjectsPassInGo(t *testing.T) {
	check := func(t *testing.T, u *unstructured.Unstructured) {
		t.Helper()
		if errs := validateInGo(t, u.GetKind(), u.Object); len(errs) > 0 {
			t.Errorf("%s %s: %v", u.GetKind(), u.GetName(), errs)
		}
	}
	for _, base := range []string{validCluster, validMachine, validClassMachine, validClass, validMachineSet, validMachineDeployment, validHealthCheck} {
		u := decode(t, base)
		u.SetName("valid")
		check(t, u)
	}
	checked := 0
	err := filepath.WalkDir(filepath.Join(env.RepoRoot, "examples"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || (!strings.HasSuffix(path, ".yaml") && !strings.HasSuffix(path, ".yml")) {
			return err
		}
		for _, u := range decodeFile(t, path) {
			if u.GetAPIVersion() == clusterv1.GroupVersion.String() {
				check(t, u)
				checked++
			}
		}
		return nil
	})
	if err != nil || checked == 0 {
		t.Fatalf("reading the examples: %v (%d marina objects)", err, checked)
	}
}

// validateInGo decodes an object as the webhook does (from JSON) and runs
// the internal/validation function of its kind.
func validateInGo(t *testing.T, kind string, object map[string]any) field.ErrorList {
	t.Helper()
	data, err := json.Marshal(object)
	if err != nil {
		t.Fatal(err)
	}
	decodeJSON := func(into any) {
		t.Helper()
		if err := json.Unmarshal(data, into); err != nil {
			t.Fatalf("decoding the %s: %v", kind, err)
		}
	}
	switch kind {
	case "Cluster":
		o := &clusterv1.Cluster{}
		decodeJSON(o)
		return validation.Cluster(o)
	case "Machine":
		o := &clusterv1.Machine{}
		decodeJSON(o)
		return validation.Machine(o)
	case "MachineClass":
		o := &clusterv1.MachineClass{}
		decodeJSON(o)
		return validation.MachineClass(o)
	case "MachineSet":
		o := &clusterv1.MachineSet{}
		decodeJSON(o)
		return validation.MachineSet(o)
	case "MachineDeployment":
		o := &clusterv1.MachineDeployment{}
		decodeJSON(o)
		return validation.MachineDeployment(o)
	case "MachineHealthCheck":
		o := &clusterv1.MachineHealthCheck{}
		decodeJSON(o)
		return validation.MachineHealthCheck(o)
	}
	t.Fatalf("no validation for kind %s", kind)
	return nil
}

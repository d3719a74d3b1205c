package validation

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// want is the one error a case must produce; a zero want means none.
type want struct {
	typ   field.ErrorType
	path  string
	about string // part of the detail
}

func check(t *testing.T, errs field.ErrorList, w want) {
	t.Helper()
	if w.path == "" {
		if len(errs) > 0 {
			t.Fatalf("want no errors, got %v", errs)
		}
		return
	}
	if len(errs) != 1 {
		t.Fatalf("want one %s error at %s, got %d: %v", w.typ, w.path, len(errs), errs)
	}
	e := errs[0]
	if e.Type != w.typ || e.Field != w.path || !strings.Contains(e.Detail, w.about) {
		t.Fatalf("got %q (type %s, path %s), want type %s at %s saying %q", e.Error(), e.Type, e.Field, w.typ, w.path, w.about)
	}
}

func raw(s string) *runtime.RawExtension { return &runtime.RawExtension{Raw: []byte(s)} }

const localSpec = `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2}}`

func machineSpec() clusterv1.MachineSpec {
	return clusterv1.MachineSpec{
		ClusterName:  "prod",
		Roles:        []clusterv1.MachineRole{clusterv1.WorkerRole},
		Versions:     clusterv1.MachineVersions{Kubelet: "v1.37.2"},
		Labels:       map[string]string{"node.example.com/tier": "gold", "pool": ""},
		Taints:       []corev1.Taint{{Key: "dedicated", Value: "infra", Effect: corev1.TaintEffectNoSchedule}},
		ClassRef:     &clusterv1.MachineClassReference{Name: "gpu.large"},
		ProviderSpec: raw(localSpec),
	}
}

func TestMachine(t *testing.T) {
	cases := []struct {
		name   string
		change func(s *clusterv1.MachineSpec)
		want   want
	}{
		{name: "valid", change: func(*clusterv1.MachineSpec) {}},
		{name: "valid without labels, taints or class", change: func(s *clusterv1.MachineSpec) { s.Labels, s.Taints, s.ClassRef = nil, nil, nil }},
		{name: "label value longer than 63", change: func(s *clusterv1.MachineSpec) { s.Labels["pool"] = strings.Repeat("a", 64) },
			want: want{field.ErrorTypeInvalid, "spec.labels[pool]", "must be no more than 63 bytes"}},
		{name: "label value with a space", change: func(s *clusterv1.MachineSpec) { s.Labels["pool"] = "a b" },
			want: want{field.ErrorTypeInvalid, "spec.labels[pool]", "a valid label must be an empty string"}},
		{name: "label key with two slashes", change: func(s *clusterv1.MachineSpec) { s.Labels["a/b/c"] = "x" },
			want: want{field.ErrorTypeInvalid, "spec.labels[a/b/c]", "with an optional DNS subdomain prefix"}},
		{name: "label key with an upper-case prefix", change: func(s *clusterv1.MachineSpec) { s.Labels["Example.com/tier"] = "x" },
			want: want{field.ErrorTypeInvalid, "spec.labels[Example.com/tier]", "prefix part a lowercase RFC 1123 subdomain"}},
		{name: "label key name longer than 63", change: func(s *clusterv1.MachineSpec) { s.Labels[strings.Repeat("k", 64)] = "x" },
			want: want{field.ErrorTypeInvalid, "spec.labels[" + strings.Repeat("k", 64) + "]", "name part must be no more than 63 bytes"}},
		{name: "taint key that is not a qualified name", change: func(s *clusterv1.MachineSpec) { s.Taints[0].Key = "dedicated node" },
			want: want{field.ErrorTypeInvalid, "spec.taints[0].key", "name part must consist of alphanumeric characters"}},
		{name: "taint without key", change: func(s *clusterv1.MachineSpec) { s.Taints[0].Key = "" },
			want: want{field.ErrorTypeInvalid, "spec.taints[0].key", "name part must be non-empty"}},
		{name: "taint value longer than 63", change: func(s *clusterv1.MachineSpec) { s.Taints[0].Value = strings.Repeat("v", 64) },
			want: want{field.ErrorTypeInvalid, "spec.taints[0].value", "must be no more than 63 bytes"}},
		{name: "taint with unknown effect", change: func(s *clusterv1.MachineSpec) { s.Taints[0].Effect = "NoWay" },
			want: want{field.ErrorTypeNotSupported, "spec.taints[0].effect", `supported values: "NoSchedule", "PreferNoSchedule", "NoExecute"`}},
		{name: "taint without effect", change: func(s *clusterv1.MachineSpec) { s.Taints[0].Effect = "" },
			want: want{field.ErrorTypeRequired, "spec.taints[0].effect", "set the effect"}},
		{name: "cluster name with a dot", change: func(s *clusterv1.MachineSpec) { s.ClusterName = "prod.eu" },
			want: want{field.ErrorTypeInvalid, "spec.clusterName", "must not contain dots"}},
		{name: "cluster name in upper case", change: func(s *clusterv1.MachineSpec) { s.ClusterName = "Prod" },
			want: want{field.ErrorTypeInvalid, "spec.clusterName", "a lowercase RFC 1123 label"}},
		{name: "class name with underscore", change: func(s *clusterv1.MachineSpec) { s.ClassRef.Name = "gpu_large" },
			want: want{field.ErrorTypeInvalid, "spec.classRef.name", "a lowercase RFC 1123 subdomain"}},
		{name: "kubelet config name in upper case", change: func(s *clusterv1.MachineSpec) {
			s.KubeletConfigRef = &clusterv1.KubeletConfigReference{Name: "Kubelet-V2"}
		}, want: want{field.ErrorTypeInvalid, "spec.kubeletConfigRef.name", "a lowercase RFC 1123 subdomain"}},
		{name: "providerSpec of exactly the bound", change: func(s *clusterv1.MachineSpec) {
			s.ProviderSpec = raw(padded(ProviderSpecMaxBytes))
		}},
		{name: "providerSpec over the bound", change: func(s *clusterv1.MachineSpec) {
			s.ProviderSpec = raw(padded(ProviderSpecMaxBytes + 1))
		}, want: want{field.ErrorTypeTooLong, "spec.providerSpec", "may hold at most 65536 bytes of JSON"}},
		{name: "component versions", change: func(s *clusterv1.MachineSpec) {
			s.Versions.Components = &clusterv1.ComponentVersions{APIServer: "v1.37.2", Scheduler: "v1.38.0-rc.1", Etcd: "v3.6.16"}
		}},
		{name: "component version that is a shell command", change: func(s *clusterv1.MachineSpec) {
			s.Versions.Components = &clusterv1.ComponentVersions{APIServer: "v1.37.2; touch /tmp/owned"}
		}, want: want{field.ErrorTypeInvalid, "spec.versions.components.apiServer", "must be a release version like v1.37.2"}},
		{name: "component version that leaves the binaries' directory", change: func(s *clusterv1.MachineSpec) {
			s.Versions.Components = &clusterv1.ComponentVersions{Etcd: "v3.6.16/../../../usr/bin/sh"}
		}, want: want{field.ErrorTypeInvalid, "spec.versions.components.etcd", "a leading v, then major.minor.patch"}},
		{name: "component version without its v", change: func(s *clusterv1.MachineSpec) {
			s.Versions.Components = &clusterv1.ComponentVersions{ControllerManager: "1.37.2"}
		}, want: want{field.ErrorTypeInvalid, "spec.versions.components.controllerManager", "a leading v"}},
		{name: "component version too long", change: func(s *clusterv1.MachineSpec) {
			s.Versions.Components = &clusterv1.ComponentVersions{Scheduler: "v1.37.2-" + strings.Repeat("a", 60)}
		}, want: want{field.ErrorTypeInvalid, "spec.versions.components.scheduler", "at most 64 characters"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: machineSpec()}
			tc.change(&m.Spec)
			check(t, Machine(m), tc.want)
		})
	}
}

// padded is a provider object of exactly n bytes of JSON.
func padded(n int) string {
	head := `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","pad":"`
	return head + strings.Repeat("x", n-len(head)-2) + `"}`
}

func validCluster() *clusterv1.Cluster {
	return &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: "prod"},
		Spec: clusterv1.ClusterSpec{
			ClusterNetwork: clusterv1.ClusterNetwork{
				Pods:     []clusterv1.CIDR{"10.244.0.0/16", "fd00:10:244::/56"},
				Services: []clusterv1.CIDR{"10.96.0.0/12", "fd00:10:96::/108"},
			},
			ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "api.prod.example.com", Port: 6443},
			ControlPlane: clusterv1.ControlPlaneSpec{
				Version:      "v1.37.2",
				Replicas:     3,
				ProviderSpec: raw(localSpec),
				Components: clusterv1.ControlPlaneComponents{
					APIServer: clusterv1.ComponentSettings{ExtraArgs: map[string]string{"v": "2", "audit-log-maxage": "30"}},
				},
				CASecretRef: &clusterv1.SecretReference{Name: "prod-ca"},
			},
		},
	}
}

func TestCluster(t *testing.T) {
	cases := []struct {
		name   string
		change func(c *clusterv1.Cluster)
		want   want
	}{
		{name: "valid", change: func(*clusterv1.Cluster) {}},
		{name: "valid with an IP endpoint and the smallest networks", change: func(c *clusterv1.Cluster) {
			c.Spec.ControlPlaneEndpoint.Host = "fd00::10"
			c.Spec.ClusterNetwork.Services = []clusterv1.CIDR{"10.96.0.0/24"}
		}},
		{name: "name with a dot", change: func(c *clusterv1.Cluster) { c.Name = "prod.eu" },
			want: want{field.ErrorTypeInvalid, "metadata.name", "must not contain dots"}},
		{name: "IPv4 service network larger than /12", change: func(c *clusterv1.Cluster) { c.Spec.ClusterNetwork.Services[0] = "10.0.0.0/8" },
			want: want{field.ErrorTypeInvalid, "spec.clusterNetwork.services[0]", "use a prefix of /12 or longer"}},
		{name: "IPv6 service network larger than /108", change: func(c *clusterv1.Cluster) { c.Spec.ClusterNetwork.Services[1] = "fd00:10:96::/64" },
			want: want{field.ErrorTypeInvalid, "spec.clusterNetwork.services[1]", "use a prefix of /108 or longer"}},
		{name: "service network that does not parse is left to the schema", change: func(c *clusterv1.Cluster) {
			c.Spec.ClusterNetwork.Services[0] = "10.96.0.0/40"
		}},
		{name: "endpoint host that is neither IP nor name", change: func(c *clusterv1.Cluster) { c.Spec.ControlPlaneEndpoint.Host = "https://api:6443" },
			want: want{field.ErrorTypeInvalid, "spec.controlPlaneEndpoint.host", "must be an IP address or a DNS name"}},
		{name: "extraArgs key with leading dashes", change: func(c *clusterv1.Cluster) {
			c.Spec.ControlPlane.Components.Scheduler.ExtraArgs = map[string]string{"--v": "4"}
		}, want: want{field.ErrorTypeInvalid, "spec.controlPlane.components.scheduler.extraArgs[--v]", "without leading dashes"}},
		{name: "extraArgs key with its value", change: func(c *clusterv1.Cluster) {
			c.Spec.ControlPlane.Components.ControllerManager.ExtraArgs = map[string]string{"v=2": ""}
		}, want: want{field.ErrorTypeInvalid, "spec.controlPlane.components.controllerManager.extraArgs[v=2]", "put the value in the map's value"}},
		// Issue 24, finding 1: extraArgs tune, they do not rewire.
		{name: "extraArgs that tune are allowed", change: func(c *clusterv1.Cluster) {
			c.Spec.ControlPlane.Components.ControllerManager.ExtraArgs = map[string]string{"node-monitor-grace-period": "20s", "v": "2"}
			c.Spec.ControlPlane.Components.Scheduler.ExtraArgs = map[string]string{"v": "4", "feature-gates": "A=true"}
		}},
		{name: "API server bound to every interface", change: func(c *clusterv1.Cluster) {
			c.Spec.ControlPlane.Components.APIServer.ExtraArgs["bind-address"] = "0.0.0.0"
		}, want: want{field.ErrorTypeForbidden, "spec.controlPlane.components.apiServer.extraArgs[bind-address]", "kube-apiserver --bind-address is owned by marina: it sets an address or port"}},
		{name: "API server that authorizes everyone", change: func(c *clusterv1.Cluster) {
			c.Spec.ControlPlane.Components.APIServer.ExtraArgs["authorization-mode"] = "AlwaysAllow"
		}, want: want{field.ErrorTypeForbidden, "spec.controlPlane.components.apiServer.extraArgs[authorization-mode]", "(authorization and admission)"}},
		{name: "API server on another cluster's etcd", change: func(c *clusterv1.Cluster) {
			c.Spec.ControlPlane.Components.APIServer.ExtraArgs["etcd-servers"] = "https://127.0.0.1:2379"
		}, want: want{field.ErrorTypeForbidden, "spec.controlPlane.components.apiServer.extraArgs[etcd-servers]", "wires the API server to etcd"}},
		{name: "controller manager signing with another CA", change: func(c *clusterv1.Cluster) {
			c.Spec.ControlPlane.Components.ControllerManager.ExtraArgs = map[string]string{"cluster-signing-key-file": "/var/lib/marina/pki/ca.key"}
		}, want: want{field.ErrorTypeForbidden, "spec.controlPlane.components.controllerManager.extraArgs[cluster-signing-key-file]", "signing keys"}},
		{name: "a path flag no rule names", change: func(c *clusterv1.Cluster) {
			c.Spec.ControlPlane.Components.APIServer.ExtraArgs["audit-log-path"] = "/etc/passwd"
		}, want: want{field.ErrorTypeForbidden, "spec.controlPlane.components.apiServer.extraArgs[audit-log-path]", "names a file or directory"}},
		{name: "scheduler config file", change: func(c *clusterv1.Cluster) {
			c.Spec.ControlPlane.Components.Scheduler.ExtraArgs = map[string]string{"config": "/tmp/x"}
		}, want: want{field.ErrorTypeForbidden, "spec.controlPlane.components.scheduler.extraArgs[config]", "remove this flag"}},
		{name: "control-plane class name in upper case", change: func(c *clusterv1.Cluster) {
			c.Spec.ControlPlane.ClassRef = &clusterv1.MachineClassReference{Name: "Large"}
		}, want: want{field.ErrorTypeInvalid, "spec.controlPlane.classRef.name", "a lowercase RFC 1123 subdomain"}},
		{name: "control-plane providerSpec over the bound", change: func(c *clusterv1.Cluster) {
			c.Spec.ControlPlane.ProviderSpec = raw(padded(ProviderSpecMaxBytes + 10))
		}, want: want{field.ErrorTypeTooLong, "spec.controlPlane.providerSpec", "keep large data"}},
		{name: "CA secret name with a slash", change: func(c *clusterv1.Cluster) { c.Spec.ControlPlane.CASecretRef.Name = "ns/ca" },
			want: want{field.ErrorTypeInvalid, "spec.controlPlane.caSecretRef.name", "a lowercase RFC 1123 subdomain"}},
		{name: "etcd client secret name in upper case", change: func(c *clusterv1.Cluster) {
			c.Spec.ControlPlane.Etcd = clusterv1.EtcdSpec{Type: clusterv1.EtcdExternal, External: &clusterv1.ExternalEtcd{
				Endpoints: []string{"https://10.0.0.5:2379"}, SecretRef: &clusterv1.SecretReference{Name: "Etcd"}}}
		}, want: want{field.ErrorTypeInvalid, "spec.controlPlane.etcd.external.secretRef.name", "a lowercase RFC 1123 subdomain"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := validCluster()
			tc.change(c)
			check(t, Cluster(c), tc.want)
		})
	}
}

func TestMachineClass(t *testing.T) {
	cases := []struct {
		name   string
		change func(c *clusterv1.MachineClass)
		want   want
	}{
		{name: "valid", change: func(*clusterv1.MachineClass) {}},
		{name: "fractional cpu and hugepages", change: func(c *clusterv1.MachineClass) {
			c.Spec.NodeTemplate.Capacity["cpu"] = resource.MustParse("500m")
			c.Spec.NodeTemplate.Capacity["hugepages-2Mi"] = resource.MustParse("1Gi")
		}},
		{name: "negative memory", change: func(c *clusterv1.MachineClass) { c.Spec.NodeTemplate.Capacity["memory"] = resource.MustParse("-1Gi") },
			want: want{field.ErrorTypeInvalid, "spec.nodeTemplate.capacity[memory]", "must not be negative"}},
		{name: "negative extended resource", change: func(c *clusterv1.MachineClass) {
			c.Spec.NodeTemplate.Capacity["nvidia.com/gpu"] = resource.MustParse("-1")
		}, want: want{field.ErrorTypeInvalid, "spec.nodeTemplate.capacity[nvidia.com/gpu]", "must not be negative"}},
		{name: "half a GPU", change: func(c *clusterv1.MachineClass) {
			c.Spec.NodeTemplate.Capacity["nvidia.com/gpu"] = resource.MustParse("500m")
		},
			want: want{field.ErrorTypeInvalid, "spec.nodeTemplate.capacity[nvidia.com/gpu]", "must be a whole number"}},
		{name: "fractional pods", change: func(c *clusterv1.MachineClass) { c.Spec.NodeTemplate.Capacity["pods"] = resource.MustParse("1.5") },
			want: want{field.ErrorTypeInvalid, "spec.nodeTemplate.capacity[pods]", "must be a whole number"}},
		{name: "unknown resource without a domain", change: func(c *clusterv1.MachineClass) { c.Spec.NodeTemplate.Capacity["gpu"] = resource.MustParse("1") },
			want: want{field.ErrorTypeInvalid, "spec.nodeTemplate.capacity[gpu]", "an extended resource with a domain prefix"}},
		{name: "resource name that is not a qualified name", change: func(c *clusterv1.MachineClass) {
			c.Spec.NodeTemplate.Capacity["nvidia.com/gpu/a100"] = resource.MustParse("1")
		}, want: want{field.ErrorTypeInvalid, "spec.nodeTemplate.capacity[nvidia.com/gpu/a100]", "a valid label key"}},
		{name: "node template label value too long", change: func(c *clusterv1.MachineClass) {
			c.Spec.NodeTemplate.Labels["tier"] = strings.Repeat("g", 64)
		}, want: want{field.ErrorTypeInvalid, "spec.nodeTemplate.labels[tier]", "must be no more than 63 bytes"}},
		{name: "node template taint key with a space", change: func(c *clusterv1.MachineClass) {
			c.Spec.NodeTemplate.Taints[0].Key = "nvidia gpu"
		}, want: want{field.ErrorTypeInvalid, "spec.nodeTemplate.taints[0].key", "name part must consist of"}},
		{name: "node template taint with unknown effect", change: func(c *clusterv1.MachineClass) {
			c.Spec.NodeTemplate.Taints[0].Effect = "NoScale"
		}, want: want{field.ErrorTypeNotSupported, "spec.nodeTemplate.taints[0].effect", "supported values"}},
		{name: "providerSpec over the bound", change: func(c *clusterv1.MachineClass) {
			c.Spec.ProviderSpec = *raw(padded(ProviderSpecMaxBytes + 1))
		}, want: want{field.ErrorTypeTooLong, "spec.providerSpec", "may hold at most 65536 bytes"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &clusterv1.MachineClass{
				ObjectMeta: metav1.ObjectMeta{Name: "gpu"},
				Spec: clusterv1.MachineClassSpec{
					ProviderSpec: *raw(localSpec),
					NodeTemplate: clusterv1.NodeTemplate{
						Labels: map[string]string{"tier": "gpu"},
						Taints: []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}},
						Capacity: corev1.ResourceList{
							"cpu": resource.MustParse("8"), "memory": resource.MustParse("32Gi"),
							"pods": resource.MustParse("110"), "nvidia.com/gpu": resource.MustParse("1"),
						},
					},
				},
			}
			tc.change(c)
			check(t, MachineClass(c), tc.want)
		})
	}
}

// setCase changes the parts a MachineSet and a MachineDeployment share, so
// that every case runs against both kinds.
type setCase struct {
	name   string
	change func(meta *metav1.ObjectMeta, sel *metav1.LabelSelector, tmpl *clusterv1.MachineTemplateSpec)
	want   want
}

var setCases = []setCase{
	{name: "valid", change: func(*metav1.ObjectMeta, *metav1.LabelSelector, *clusterv1.MachineTemplateSpec) {}},
	{name: "valid with expressions", change: func(_ *metav1.ObjectMeta, sel *metav1.LabelSelector, tmpl *clusterv1.MachineTemplateSpec) {
		sel.MatchExpressions = []metav1.LabelSelectorRequirement{
			{Key: "zone", Operator: metav1.LabelSelectorOpIn, Values: []string{"z1", "z2"}},
			{Key: "spot", Operator: metav1.LabelSelectorOpDoesNotExist},
		}
		tmpl.ObjectMeta.Labels["zone"] = "z1"
	}},
	{name: "valid autoscaler bounds, scale to zero", change: func(meta *metav1.ObjectMeta, _ *metav1.LabelSelector, _ *clusterv1.MachineTemplateSpec) {
		meta.Annotations = map[string]string{clusterv1.AutoscalerMinSizeAnnotation: "0", clusterv1.AutoscalerMaxSizeAnnotation: "10"}
	}},
	{name: "selector does not match the template", change: func(_ *metav1.ObjectMeta, _ *metav1.LabelSelector, tmpl *clusterv1.MachineTemplateSpec) {
		tmpl.ObjectMeta.Labels["pool"] = "b"
	}, want: want{field.ErrorTypeInvalid, "spec.template.metadata.labels", "must match spec.selector (pool=a)"}},
	{name: "expression the template does not satisfy", change: func(_ *metav1.ObjectMeta, sel *metav1.LabelSelector, _ *clusterv1.MachineTemplateSpec) {
		sel.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "zone", Operator: metav1.LabelSelectorOpExists}}
	}, want: want{field.ErrorTypeInvalid, "spec.template.metadata.labels", "add the selector's labels to the template"}},
	{name: "unknown selector operator", change: func(_ *metav1.ObjectMeta, sel *metav1.LabelSelector, _ *clusterv1.MachineTemplateSpec) {
		sel.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "zone", Operator: "Equals", Values: []string{"z1"}}}
	}, want: want{field.ErrorTypeNotSupported, "spec.selector.matchExpressions[0].operator", `supported values: "In", "NotIn", "Exists", "DoesNotExist"`}},
	{name: "In without values", change: func(_ *metav1.ObjectMeta, sel *metav1.LabelSelector, _ *clusterv1.MachineTemplateSpec) {
		sel.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "zone", Operator: metav1.LabelSelectorOpIn}}
	}, want: want{field.ErrorTypeRequired, "spec.selector.matchExpressions[0].values", "operator In needs at least one value"}},
	{name: "Exists with values", change: func(_ *metav1.ObjectMeta, sel *metav1.LabelSelector, tmpl *clusterv1.MachineTemplateSpec) {
		sel.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "zone", Operator: metav1.LabelSelectorOpExists, Values: []string{"z1"}}}
		tmpl.ObjectMeta.Labels["zone"] = "z1"
	}, want: want{field.ErrorTypeForbidden, "spec.selector.matchExpressions[0].values", "remove values"}},
	{name: "selector expression value too long", change: func(_ *metav1.ObjectMeta, sel *metav1.LabelSelector, _ *clusterv1.MachineTemplateSpec) {
		sel.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "zone", Operator: metav1.LabelSelectorOpNotIn, Values: []string{strings.Repeat("z", 64)}}}
	}, want: want{field.ErrorTypeInvalid, "spec.selector.matchExpressions[0].values[0]", "must be no more than 63 bytes"}},
	{name: "selector expression key with a space", change: func(_ *metav1.ObjectMeta, sel *metav1.LabelSelector, _ *clusterv1.MachineTemplateSpec) {
		sel.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "my zone", Operator: metav1.LabelSelectorOpDoesNotExist}}
	}, want: want{field.ErrorTypeInvalid, "spec.selector.matchExpressions[0].key", "name part must consist of"}},
	{name: "selector matchLabels value with a slash", change: func(_ *metav1.ObjectMeta, sel *metav1.LabelSelector, _ *clusterv1.MachineTemplateSpec) {
		sel.MatchLabels["pool"] = "a/b"
	}, want: want{field.ErrorTypeInvalid, "spec.selector.matchLabels[pool]", "a valid label must be"}},
	{name: "template label key with two slashes", change: func(_ *metav1.ObjectMeta, _ *metav1.LabelSelector, tmpl *clusterv1.MachineTemplateSpec) {
		tmpl.ObjectMeta.Labels["a/b/c"] = "x"
	}, want: want{field.ErrorTypeInvalid, "spec.template.metadata.labels[a/b/c]", "a valid label key"}},
	{name: "template annotation key with a space", change: func(_ *metav1.ObjectMeta, _ *metav1.LabelSelector, tmpl *clusterv1.MachineTemplateSpec) {
		tmpl.ObjectMeta.Annotations = map[string]string{"owner team": "infra"}
	}, want: want{field.ErrorTypeInvalid, "spec.template.metadata.annotations[owner team]", "name part must consist of"}},
	{name: "template annotations over 256 KiB", change: func(_ *metav1.ObjectMeta, _ *metav1.LabelSelector, tmpl *clusterv1.MachineTemplateSpec) {
		tmpl.ObjectMeta.Annotations = map[string]string{"example.com/blob": strings.Repeat("x", 256<<10)}
	}, want: want{field.ErrorTypeTooLong, "spec.template.metadata.annotations", "may not be more than 262144 bytes"}},
	{name: "template node label value too long", change: func(_ *metav1.ObjectMeta, _ *metav1.LabelSelector, tmpl *clusterv1.MachineTemplateSpec) {
		tmpl.Spec.Labels = map[string]string{"tier": strings.Repeat("g", 64)}
	}, want: want{field.ErrorTypeInvalid, "spec.template.spec.labels[tier]", "must be no more than 63 bytes"}},
	{name: "template taint key with a space", change: func(_ *metav1.ObjectMeta, _ *metav1.LabelSelector, tmpl *clusterv1.MachineTemplateSpec) {
		tmpl.Spec.Taints = []corev1.Taint{{Key: "a b", Effect: corev1.TaintEffectNoSchedule}}
	}, want: want{field.ErrorTypeInvalid, "spec.template.spec.taints[0].key", "name part must consist of"}},
	{name: "template cluster name with a dot", change: func(_ *metav1.ObjectMeta, _ *metav1.LabelSelector, tmpl *clusterv1.MachineTemplateSpec) {
		tmpl.Spec.ClusterName = "prod.eu"
	}, want: want{field.ErrorTypeInvalid, "spec.template.spec.clusterName", "must not contain dots"}},
	{name: "autoscaler min larger than max", change: func(meta *metav1.ObjectMeta, _ *metav1.LabelSelector, _ *clusterv1.MachineTemplateSpec) {
		meta.Annotations = map[string]string{clusterv1.AutoscalerMinSizeAnnotation: "5", clusterv1.AutoscalerMaxSizeAnnotation: "3"}
	}, want: want{field.ErrorTypeInvalid, "metadata.annotations[" + clusterv1.AutoscalerMaxSizeAnnotation + "]", "must be at least the min size"}},
	{name: "autoscaler negative min", change: func(meta *metav1.ObjectMeta, _ *metav1.LabelSelector, _ *clusterv1.MachineTemplateSpec) {
		meta.Annotations = map[string]string{clusterv1.AutoscalerMinSizeAnnotation: "-1"}
	}, want: want{field.ErrorTypeInvalid, "metadata.annotations[" + clusterv1.AutoscalerMinSizeAnnotation + "]", "non-negative whole number"}},
	{name: "autoscaler max in words", change: func(meta *metav1.ObjectMeta, _ *metav1.LabelSelector, _ *clusterv1.MachineTemplateSpec) {
		meta.Annotations = map[string]string{clusterv1.AutoscalerMaxSizeAnnotation: "ten"}
	}, want: want{field.ErrorTypeInvalid, "metadata.annotations[" + clusterv1.AutoscalerMaxSizeAnnotation + "]", "non-negative whole number"}},
	{name: "autoscaler max with a sign", change: func(meta *metav1.ObjectMeta, _ *metav1.LabelSelector, _ *clusterv1.MachineTemplateSpec) {
		meta.Annotations = map[string]string{clusterv1.AutoscalerMaxSizeAnnotation: "+3"}
	}, want: want{field.ErrorTypeInvalid, "metadata.annotations[" + clusterv1.AutoscalerMaxSizeAnnotation + "]", "non-negative whole number"}},
	{name: "autoscaler max in hex", change: func(meta *metav1.ObjectMeta, _ *metav1.LabelSelector, _ *clusterv1.MachineTemplateSpec) {
		meta.Annotations = map[string]string{clusterv1.AutoscalerMaxSizeAnnotation: "0x10"}
	}, want: want{field.ErrorTypeInvalid, "metadata.annotations[" + clusterv1.AutoscalerMaxSizeAnnotation + "]", "written in decimal"}},
	{name: "autoscaler max empty", change: func(meta *metav1.ObjectMeta, _ *metav1.LabelSelector, _ *clusterv1.MachineTemplateSpec) {
		meta.Annotations = map[string]string{clusterv1.AutoscalerMaxSizeAnnotation: ""}
	}, want: want{field.ErrorTypeInvalid, "metadata.annotations[" + clusterv1.AutoscalerMaxSizeAnnotation + "]", "non-negative whole number"}},
}

func template() clusterv1.MachineTemplateSpec {
	spec := machineSpec()
	spec.Labels, spec.Taints = nil, nil
	return clusterv1.MachineTemplateSpec{ObjectMeta: clusterv1.MachineTemplateMeta{Labels: map[string]string{"pool": "a"}}, Spec: spec}
}

func TestMachineSet(t *testing.T) {
	for _, tc := range setCases {
		t.Run(tc.name, func(t *testing.T) {
			s := &clusterv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: clusterv1.MachineSetSpec{
				ClusterName: "prod", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}}, Template: template()}}
			tc.change(&s.ObjectMeta, &s.Spec.Selector, &s.Spec.Template)
			check(t, MachineSet(s), tc.want)
		})
	}
	t.Run("cluster name with a dot", func(t *testing.T) {
		s := &clusterv1.MachineSet{Spec: clusterv1.MachineSetSpec{
			ClusterName: "a.b", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}}, Template: template()}}
		s.Spec.Template.Spec.ClusterName = "a.b"
		errs := MachineSet(s)
		if len(errs) != 2 || errs[0].Field != "spec.clusterName" || errs[1].Field != "spec.template.spec.clusterName" {
			t.Fatalf("want errors at spec.clusterName and spec.template.spec.clusterName, got %v", errs)
		}
	})
}

func TestMachineDeployment(t *testing.T) {
	for _, tc := range setCases {
		t.Run(tc.name, func(t *testing.T) {
			d := &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Name: "d"}, Spec: clusterv1.MachineDeploymentSpec{
				ClusterName: "prod", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}}, Template: template()}}
			tc.change(&d.ObjectMeta, &d.Spec.Selector, &d.Spec.Template)
			check(t, MachineDeployment(d), tc.want)
		})
	}
}

func TestMachineHealthCheck(t *testing.T) {
	cases := []struct {
		name   string
		change func(h *clusterv1.MachineHealthCheck)
		want   want
	}{
		{name: "valid", change: func(*clusterv1.MachineHealthCheck) {}},
		{name: "custom condition type with a domain", change: func(h *clusterv1.MachineHealthCheck) {
			h.Spec.UnhealthyConditions[0].Type = "example.com/KernelDeadlock"
		}},
		{name: "condition type with a space", change: func(h *clusterv1.MachineHealthCheck) { h.Spec.UnhealthyConditions[0].Type = "Kernel Deadlock" },
			want: want{field.ErrorTypeInvalid, "spec.unhealthyConditions[0].type", "name part must consist of"}},
		{name: "cluster name in upper case", change: func(h *clusterv1.MachineHealthCheck) { h.Spec.ClusterName = "Prod" },
			want: want{field.ErrorTypeInvalid, "spec.clusterName", "a lowercase RFC 1123 label"}},
		{name: "selector with unknown operator", change: func(h *clusterv1.MachineHealthCheck) {
			h.Spec.Selector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "pool", Operator: "Like", Values: []string{"a"}}}
		}, want: want{field.ErrorTypeNotSupported, "spec.selector.matchExpressions[0].operator", "supported values"}},
		{name: "selector label value too long", change: func(h *clusterv1.MachineHealthCheck) {
			h.Spec.Selector.MatchLabels["pool"] = strings.Repeat("a", 64)
		}, want: want{field.ErrorTypeInvalid, "spec.selector.matchLabels[pool]", "must be no more than 63 bytes"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := &clusterv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Name: "h"}, Spec: clusterv1.MachineHealthCheckSpec{
				ClusterName: "prod",
				Selector:    metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}},
				UnhealthyConditions: []clusterv1.UnhealthyCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse,
					Timeout: metav1.Duration{Duration: 300e9}}},
			}}
			tc.change(h)
			check(t, MachineHealthCheck(h), tc.want)
		})
	}
}

// Issue 24, finding 3: the labels a control plane and a cluster count
// machines by say what the machine's spec says.
func TestMembershipLabels(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels map[string]string
		roles  []clusterv1.MachineRole
		want   want
	}{
		{"its own cluster", map[string]string{clusterv1.ClusterNameLabel: "prod"}, []clusterv1.MachineRole{clusterv1.WorkerRole}, want{}},
		{"a control-plane machine", map[string]string{clusterv1.ControlPlaneLabel: ""}, []clusterv1.MachineRole{clusterv1.ControlPlaneRole}, want{}},
		{"another cluster", map[string]string{clusterv1.ClusterNameLabel: "victim"}, []clusterv1.MachineRole{clusterv1.WorkerRole},
			want{field.ErrorTypeInvalid, "metadata.labels[cluster.marina.dev/cluster-name]", `must be the machine's spec.clusterName ("prod")`}},
		{"a worker claiming a control plane", map[string]string{clusterv1.ControlPlaneLabel: ""}, []clusterv1.MachineRole{clusterv1.WorkerRole},
			want{field.ErrorTypeForbidden, "metadata.labels[cluster.marina.dev/control-plane]", "which have the ControlPlane role"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m", Labels: tc.labels}, Spec: machineSpec()}
			m.Spec.Roles = tc.roles
			check(t, Machine(m), tc.want)
		})
	}
	t.Run("a set's template", func(t *testing.T) {
		s := &clusterv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: clusterv1.MachineSetSpec{
			ClusterName: "prod", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}}, Template: template()}}
		s.Spec.Template.ObjectMeta.Labels[clusterv1.ControlPlaneLabel] = ""
		check(t, MachineSet(s), want{field.ErrorTypeForbidden, "spec.template.metadata.labels[cluster.marina.dev/control-plane]", "ControlPlane role"})
	})
}

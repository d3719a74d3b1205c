package class

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

const (
	localAPIVersion = "local.marina.dev/v1alpha1"
	localHead       = `"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine"`
)

func gpuClass(allowed ...string) *clusterv1.MachineClass {
	return &clusterv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu"},
		Spec: clusterv1.MachineClassSpec{
			ProviderSpec: runtime.RawExtension{Raw: []byte(`{` + localHead +
				`,"spec":{"cpu":8,"memory":"32Gi","gpus":1,"diskSize":50,"tags":["a","b"],"billing":{"team":"ml"}}}`)},
			NodeTemplate: clusterv1.NodeTemplate{
				Labels: map[string]string{"gpu": "true", "tier": "batch"},
				Taints: []corev1.Taint{
					{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule},
					{Key: "dedicated", Value: "ml", Effect: corev1.TaintEffectNoExecute},
				},
				Capacity: corev1.ResourceList{
					corev1.ResourceCPU:    resource.MustParse("8"),
					"nvidia.com/gpu":      resource.MustParse("1"),
					corev1.ResourceMemory: resource.MustParse("32Gi"),
				},
			},
			AllowedOverrides: allowed,
		},
	}
}

func machine(classRef string, providerSpec string) *clusterv1.MachineSpec {
	m := &clusterv1.MachineSpec{
		ClusterName: "prod",
		Roles:       []clusterv1.MachineRole{clusterv1.WorkerRole},
		Versions:    clusterv1.MachineVersions{Kubelet: "v1.37.2"},
	}
	if classRef != "" {
		m.ClassRef = &clusterv1.MachineClassReference{Name: classRef}
	}
	if providerSpec != "" {
		m.ProviderSpec = &runtime.RawExtension{Raw: []byte(providerSpec)}
	}
	return m
}

// canonical re-encodes JSON so that tests compare values, not spelling.
func canonical(t *testing.T, s string) string {
	t.Helper()
	obj, err := decodeObject([]byte(s))
	if err != nil {
		t.Fatalf("bad test JSON %s: %v", s, err)
	}
	b, err := encode(obj)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestMergeProviderSpec(t *testing.T) {
	classSpec := `"spec":{"cpu":8,"memory":"32Gi","gpus":1,"diskSize":50,"tags":["a","b"],"billing":{"team":"ml"}}`
	tests := []struct {
		name     string
		class    *clusterv1.MachineClass
		machine  *clusterv1.MachineSpec
		want     string   // merged providerSpec, compared as JSON values
		wantRaw  string   // exact bytes expected, when set
		wantErrs []string // substrings of the error; none means success
	}{{
		name:    "no class: the full blob is returned byte for byte (M5)",
		machine: machine("", `{ "kind": "LocalMachine",  "apiVersion": "local.marina.dev/v1alpha1", "spec": {"cpu": 2.50} }`),
		wantRaw: `{ "kind": "LocalMachine",  "apiVersion": "local.marina.dev/v1alpha1", "spec": {"cpu": 2.50} }`,
	}, {
		name:    "no class: a class passed anyway is ignored",
		class:   gpuClass(),
		machine: machine("", `{`+localHead+`,"spec":{"cpu":2}}`),
		wantRaw: `{` + localHead + `,"spec":{"cpu":2}}`,
	}, {
		name:     "no class and no providerSpec",
		machine:  machine("", ""),
		wantErrs: []string{"spec.providerSpec: Required value", "set classRef"},
	}, {
		name:     "no class: providerSpec without kind",
		machine:  machine("", `{"apiVersion":"local.marina.dev/v1alpha1","spec":{}}`),
		wantErrs: []string{"spec.providerSpec.kind: Required value"},
	}, {
		name:     "no class: providerSpec that is not an object",
		machine:  machine("", `["LocalMachine"]`),
		wantErrs: []string{"spec.providerSpec", "must be a JSON object", "not a list"},
	}, {
		name:    "class without overrides: the class blob",
		class:   gpuClass("spec.diskSize"),
		machine: machine("gpu", ""),
		want:    `{` + localHead + `,` + classSpec + `}`,
	}, {
		name:    "allowed override is merged",
		class:   gpuClass("spec.diskSize"),
		machine: machine("gpu", `{`+localHead+`,"spec":{"diskSize":200}}`),
		want:    `{` + localHead + `,"spec":{"cpu":8,"memory":"32Gi","gpus":1,"diskSize":200,"tags":["a","b"],"billing":{"team":"ml"}}}`,
	}, {
		name:    "apiVersion and kind may be left out of the override",
		class:   gpuClass("spec.diskSize"),
		machine: machine("gpu", `{"spec":{"diskSize":200}}`),
		want:    `{` + localHead + `,"spec":{"cpu":8,"memory":"32Gi","gpus":1,"diskSize":200,"tags":["a","b"],"billing":{"team":"ml"}}}`,
	}, {
		name:     "a field not allowed is refused, named",
		class:    gpuClass("spec.diskSize"),
		machine:  machine("gpu", `{`+localHead+`,"spec":{"gpus":4}}`),
		wantErrs: []string{`spec.providerSpec.spec.gpus: Forbidden: machine class "gpu" does not allow overriding this field (allowed: spec.diskSize)`},
	}, {
		name:     "a class without allowedOverrides allows nothing",
		class:    gpuClass(),
		machine:  machine("gpu", `{"spec":{"diskSize":1}}`),
		wantErrs: []string{"spec.providerSpec.spec.diskSize: Forbidden", "(allowed: nothing)"},
	}, {
		name:     "every refused field is named, allowed ones are not",
		class:    gpuClass("spec.diskSize"),
		machine:  machine("gpu", `{"spec":{"gpus":4,"diskSize":1,"billing":{"team":"me"}},"status":{}}`),
		wantErrs: []string{"spec.providerSpec.spec.gpus", "spec.providerSpec.spec.billing", "spec.providerSpec.status"},
	}, {
		name:    "allowing a path allows everything below it",
		class:   gpuClass("spec.billing"),
		machine: machine("gpu", `{"spec":{"billing":{"team":"infra","project":{"id":7}}}}`),
		want:    `{` + localHead + `,"spec":{"cpu":8,"memory":"32Gi","gpus":1,"diskSize":50,"tags":["a","b"],"billing":{"team":"infra","project":{"id":7}}}}`,
	}, {
		name:    "null removes an allowed field",
		class:   gpuClass("spec.billing"),
		machine: machine("gpu", `{"spec":{"billing":null}}`),
		want:    `{` + localHead + `,"spec":{"cpu":8,"memory":"32Gi","gpus":1,"diskSize":50,"tags":["a","b"]}}`,
	}, {
		name:     "null on a parent of an allowed field is refused",
		class:    gpuClass("spec.diskSize"),
		machine:  machine("gpu", `{"spec":null}`),
		wantErrs: []string{"spec.providerSpec.spec: Forbidden"},
	}, {
		name:     "replacing a parent of an allowed field by a scalar is refused",
		class:    gpuClass("spec.diskSize"),
		machine:  machine("gpu", `{"spec":5}`),
		wantErrs: []string{"spec.providerSpec.spec: Forbidden"},
	}, {
		name:    "lists are replaced whole",
		class:   gpuClass("spec.tags"),
		machine: machine("gpu", `{"spec":{"tags":["c"]}}`),
		want:    `{` + localHead + `,"spec":{"cpu":8,"memory":"32Gi","gpus":1,"diskSize":50,"tags":["c"],"billing":{"team":"ml"}}}`,
	}, {
		name:    "an allowed path the class does not set is added, with its parents",
		class:   gpuClass("spec.network.vlan"),
		machine: machine("gpu", `{"spec":{"network":{"vlan":12}}}`),
		want:    `{` + localHead + `,"spec":{"cpu":8,"memory":"32Gi","gpus":1,"diskSize":50,"tags":["a","b"],"billing":{"team":"ml"},"network":{"vlan":12}}}`,
	}, {
		name:     "siblings of an allowed path on the way are refused",
		class:    gpuClass("spec.network.vlan"),
		machine:  machine("gpu", `{"spec":{"network":{"vlan":12,"mtu":9000}}}`),
		wantErrs: []string{"spec.providerSpec.spec.network.mtu: Forbidden"},
	}, {
		name:     "reaching through a value the class holds that is not an object is refused",
		class:    gpuClass("spec.tags.first"),
		machine:  machine("gpu", `{"spec":{"tags":{"first":"x"}}}`),
		wantErrs: []string{"spec.providerSpec.spec.tags: Forbidden"},
	}, {
		name:    "numbers keep their exact spelling",
		class:   gpuClass("spec.diskSize"),
		machine: machine("gpu", `{"spec":{"diskSize":12345678901234567890123}}`),
		want:    `{` + localHead + `,"spec":{"cpu":8,"memory":"32Gi","gpus":1,"diskSize":12345678901234567890123,"tags":["a","b"],"billing":{"team":"ml"}}}`,
	}, {
		name:     "another kind than the class's is refused",
		class:    gpuClass("spec.diskSize"),
		machine:  machine("gpu", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"SSHMachine","spec":{"diskSize":1}}`),
		wantErrs: []string{`spec.providerSpec.kind: Invalid value: "SSHMachine": must be LocalMachine, as in machine class "gpu", or be left out`},
	}, {
		name:     "another apiVersion than the class's is refused",
		class:    gpuClass("spec.diskSize"),
		machine:  machine("gpu", `{"apiVersion":"ssh.marina.dev/v1alpha1","spec":{"diskSize":1}}`),
		wantErrs: []string{"spec.providerSpec.apiVersion: Invalid value", "must be local.marina.dev/v1alpha1"},
	}, {
		name:     "a kind that is not a string is refused without panicking",
		class:    gpuClass("spec.diskSize"),
		machine:  machine("gpu", `{"kind":{"a":1}}`),
		wantErrs: []string{"spec.providerSpec.kind: Invalid value"},
	}, {
		name:     "metadata cannot be overridden",
		class:    gpuClass("spec.diskSize"),
		machine:  machine("gpu", `{"metadata":{"name":"x"}}`),
		wantErrs: []string{"spec.providerSpec.metadata: Forbidden"},
	}, {
		name:     "the class is missing",
		machine:  machine("gpu", ""),
		wantErrs: []string{`spec.classRef.name: Invalid value: "gpu": no such MachineClass`},
	}, {
		name:     "the class passed is not the one named",
		class:    gpuClass(),
		machine:  machine("large", ""),
		wantErrs: []string{`spec.classRef.name: Invalid value: "large": resolved against machine class "gpu"`},
	}, {
		name: "a class without kind",
		class: func() *clusterv1.MachineClass {
			c := gpuClass()
			c.Spec.ProviderSpec.Raw = []byte(`{"apiVersion":"v1"}`)
			return c
		}(),
		machine:  machine("gpu", ""),
		wantErrs: []string{"machineclass.gpu.spec.providerSpec.kind: Required value"},
	}, {
		name:     "an override that is not JSON",
		class:    gpuClass("spec.diskSize"),
		machine:  machine("gpu", `{"spec":`),
		wantErrs: []string{"spec.providerSpec: Invalid value", "not valid JSON"},
	}, {
		name:     "an override followed by garbage",
		class:    gpuClass("spec.diskSize"),
		machine:  machine("gpu", `{} {}`),
		wantErrs: []string{"data after the object"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var classBefore *clusterv1.MachineClass
			if tt.class != nil {
				classBefore = tt.class.DeepCopy()
			}
			machineBefore := tt.machine.DeepCopy()

			got, err := Merge(tt.class, tt.machine)

			if tt.class != nil && !reflect.DeepEqual(classBefore, tt.class) {
				t.Errorf("Merge modified the class")
			}
			if !reflect.DeepEqual(machineBefore, tt.machine) {
				t.Errorf("Merge modified the machine")
			}
			if len(tt.wantErrs) > 0 {
				if err == nil {
					t.Fatalf("Merge succeeded with %s, want an error containing %q", got.ProviderSpec.Raw, tt.wantErrs)
				}
				for _, want := range tt.wantErrs {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not contain %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Merge: %v", err)
			}
			if tt.wantRaw != "" && string(got.ProviderSpec.Raw) != tt.wantRaw {
				t.Errorf("providerSpec = %s, want exactly %s", got.ProviderSpec.Raw, tt.wantRaw)
			}
			if tt.want != "" && string(got.ProviderSpec.Raw) != canonical(t, tt.want) {
				t.Errorf("providerSpec = %s, want %s", got.ProviderSpec.Raw, canonical(t, tt.want))
			}
			if got.GroupVersionKind.GroupVersion().String() != localAPIVersion || got.GroupVersionKind.Kind != "LocalMachine" {
				t.Errorf("GroupVersionKind = %v, want LocalMachine in %s", got.GroupVersionKind, localAPIVersion)
			}
		})
	}
}

// The class's labels and taints are the administrator's (M6): a machine
// that would change one is refused, naming the field.
func TestMachineCannotChangeTheClassNodeTemplate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels map[string]string
		taints []corev1.Taint
		want   string
	}{
		{name: "label with another value", labels: map[string]string{"tier": "training"}, want: "spec.labels[tier]: Forbidden"},
		{name: "taint with another value", taints: []corev1.Taint{{Key: "dedicated", Value: "mine", Effect: corev1.TaintEffectNoExecute}}, want: "spec.taints[0]: Forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := machine("gpu", "")
			m.Labels, m.Taints = tc.labels, tc.taints
			_, err := Merge(gpuClass(), m)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `MachineClass "gpu"`) {
				t.Errorf("Merge = %v, want an error containing %q naming the class", err, tc.want)
			}
		})
	}
}

func TestMergeNodeTemplate(t *testing.T) {
	m := machine("gpu", "")
	m.Labels = map[string]string{"tier": "batch", "team": "vision"}
	m.Taints = []corev1.Taint{
		{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule},
		{Key: "nvidia.com/gpu", Value: "x", Effect: corev1.TaintEffectPreferNoSchedule},
		{Key: "spot", Effect: corev1.TaintEffectNoSchedule},
	}
	got, err := Merge(gpuClass(), m)
	if err != nil {
		t.Fatal(err)
	}
	wantLabels := map[string]string{"gpu": "true", "tier": "batch", "team": "vision"}
	if !reflect.DeepEqual(got.Labels, wantLabels) {
		t.Errorf("labels = %v, want %v", got.Labels, wantLabels)
	}
	wantTaints := []corev1.Taint{
		{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule},
		{Key: "dedicated", Value: "ml", Effect: corev1.TaintEffectNoExecute},
		{Key: "nvidia.com/gpu", Value: "x", Effect: corev1.TaintEffectPreferNoSchedule},
		{Key: "spot", Effect: corev1.TaintEffectNoSchedule},
	}
	if !reflect.DeepEqual(got.Taints, wantTaints) {
		t.Errorf("taints = %v, want %v", got.Taints, wantTaints)
	}
	if q := got.Capacity["nvidia.com/gpu"]; q.String() != "1" {
		t.Errorf("capacity nvidia.com/gpu = %s, want 1", q.String())
	}

	// Without a class, the machine's own labels and taints, and no capacity.
	m = machine("", `{`+localHead+`}`)
	m.Labels = map[string]string{"a": "b"}
	m.Taints = []corev1.Taint{{Key: "spot", Effect: corev1.TaintEffectNoSchedule}}
	got, err = Merge(nil, m)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Labels, m.Labels) || !reflect.DeepEqual(got.Taints, m.Taints) || got.Capacity != nil {
		t.Errorf("without a class got labels %v taints %v capacity %v, want the machine's and no capacity", got.Labels, got.Taints, got.Capacity)
	}
}

func TestMergeNilSpec(t *testing.T) {
	if _, err := Merge(nil, nil); err == nil {
		t.Fatal("Merge(nil, nil) succeeded")
	}
}

// FuzzMerge checks that Merge never panics and is idempotent: merging its
// result again, as the class, with the same overrides changes nothing.
func FuzzMerge(f *testing.F) {
	seeds := []struct {
		class, override, allowed string
		wrap                     bool
	}{
		{`{"cpu":8,"disk":{"size":50,"type":"ssd"},"tags":["a"]}`, `{"disk":{"size":100}}`, "spec.disk.size", true},
		{`{"cpu":8}`, `{"disk":{"size":null,"x":{"y":null}}}`, "spec.disk", true},
		{`{"cpu":8}`, `null`, "spec", true},
		{`{"a":{"b":{"c":1}}}`, `{"a":{"b":[1,{"c":null}]}}`, "spec.a.b,spec.x", true},
		{`"str"`, `{"a":1}`, "spec.a", true},
		{`{"a":1}`, `{"a":1e400}`, "spec.a", true},
		{`{` + localHead + `,"spec":{}}`, `{"kind":"LocalMachine","spec":{"z":"\u003c"}}`, "spec", false},
		{`{` + localHead + `}`, `{"kind":"Other"}`, "", false},
		{`[]`, `{}`, "", false},
		{`{"apiVersion":"a/b/c","kind":"K"}`, ``, "", false},
	}
	for _, s := range seeds {
		f.Add(s.class, s.override, s.allowed, s.wrap)
	}
	f.Fuzz(func(t *testing.T, classBody, overrideBody, allowed string, wrap bool) {
		classRaw, overrideRaw := classBody, overrideBody
		if wrap {
			classRaw = `{` + localHead + `,"spec":` + classBody + `}`
			overrideRaw = `{"spec":` + overrideBody + `}`
		}
		c := gpuClass(strings.Split(allowed, ",")...)
		c.Spec.ProviderSpec.Raw = []byte(classRaw)
		m := machine("gpu", overrideRaw)
		m.Labels = map[string]string{"team": "fuzz"}
		m.Taints = []corev1.Taint{
			{Key: "nvidia.com/gpu", Value: "fuzz", Effect: corev1.TaintEffectPreferNoSchedule},
			// Keys and effects are unique, as the API's list map makes them.
			{Key: "fuzz", Effect: corev1.TaintEffectNoSchedule},
			{Key: "fuzz", Value: "again", Effect: corev1.TaintEffectNoExecute},
		}

		// The path without a class must not panic either.
		_, _ = Merge(nil, machine("", overrideRaw))

		first, err := Merge(c, m)
		if err != nil {
			return
		}
		if !json.Valid(first.ProviderSpec.Raw) {
			t.Fatalf("merged providerSpec is not valid JSON: %s", first.ProviderSpec.Raw)
		}
		again := c.DeepCopy()
		again.Spec.ProviderSpec.Raw = bytes.Clone(first.ProviderSpec.Raw)
		again.Spec.NodeTemplate.Labels = first.Labels
		again.Spec.NodeTemplate.Taints = first.Taints
		second, err := Merge(again, m)
		if err != nil {
			t.Fatalf("merging the result again failed: %v (first result %s)", err, first.ProviderSpec.Raw)
		}
		if !bytes.Equal(first.ProviderSpec.Raw, second.ProviderSpec.Raw) {
			t.Fatalf("not idempotent:\nfirst  %s\nsecond %s", first.ProviderSpec.Raw, second.ProviderSpec.Raw)
		}
		if !reflect.DeepEqual(first.Labels, second.Labels) || !reflect.DeepEqual(first.Taints, second.Taints) {
			t.Fatalf("node template not idempotent:\nfirst  %v %v\nsecond %v %v", first.Labels, first.Taints, second.Labels, second.Taints)
		}
	})
}

package webhook

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

func machine(kubelet, cpu string, labels map[string]string) *clusterv1.Machine {
	return &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: "w", Labels: labels},
		Spec: clusterv1.MachineSpec{
			ClusterName:  "prod",
			Versions:     clusterv1.MachineVersions{Kubelet: clusterv1.KubernetesVersion(kubelet)},
			Labels:       map[string]string{"example.com/tier": "gold"},
			ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":` + cpu + `}}`)},
		},
	}
}

// Issue 24, finding 4: an error the stored object had is forgiven only
// where the update leaves the value alone.
func TestNewErrorsComparesValues(t *testing.T) {
	kubelet := field.Invalid(field.NewPath("spec", "versions", "kubelet"), "v1.38.0", "must not be newer than the cluster's control plane")
	cpu := field.Invalid(field.NewPath("spec", "providerSpec", "spec", "cpu"), field.OmitValueType{}, "cpu must be positive")
	label := field.Invalid(field.NewPath("spec", "labels").Key("example.com/tier"), "gold", "bad")
	for _, tc := range []struct {
		name     string
		old, new *clusterv1.Machine
		errs     field.ErrorList
		want     int
	}{
		{"a metadata update keeps a stored error", machine("v1.38.0", "-1", nil), machine("v1.38.0", "-1", map[string]string{"a": "b"}),
			field.ErrorList{kubelet, cpu, label}, 0},
		{"a kubelet edited to another bad version", machine("v1.38.0", "-1", nil), machine("v1.45.0", "-1", nil),
			field.ErrorList{kubelet}, 1},
		{"a provider field edited to another bad value (no value in the error)", machine("v1.38.0", "-1", nil), machine("v1.38.0", "-2", nil),
			field.ErrorList{cpu}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := newErrors(tc.errs, tc.errs, tc.old, tc.new)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tc.want {
				t.Errorf("newErrors = %v, want %d new errors", got, tc.want)
			}
		})
	}
	// An error the stored object did not have is new whatever the values.
	if got, _ := newErrors(field.ErrorList{kubelet}, nil, machine("v1.38.0", "1", nil), machine("v1.38.0", "1", nil)); len(got) != 1 {
		t.Errorf("an error the stored object lacked was forgiven")
	}
}

func TestValueAt(t *testing.T) {
	obj := map[string]any{"spec": map[string]any{
		"labels": map[string]any{"example.com/tier": "gold"},
		"taints": []any{map[string]any{"key": "a"}},
	}}
	for _, tc := range []struct {
		path string
		want any
		ok   bool
	}{
		{"spec.labels[example.com/tier]", "gold", true},
		{"spec.taints[0].key", "a", true},
		{"spec.taints[3].key", nil, true},
		{"spec.missing.deeper", nil, true},
		{"spec.taints.key", nil, false},
		{"spec.labels[unclosed", nil, false},
		{"spec..labels", nil, false},
	} {
		got, ok := valueAt(obj, tc.path)
		if got != tc.want || ok != tc.ok {
			t.Errorf("valueAt(%s) = %v, %v; want %v, %v", tc.path, got, ok, tc.want, tc.ok)
		}
	}
}

func TestKubeletSkew(t *testing.T) {
	p := field.NewPath("spec", "versions", "kubelet")
	for _, tc := range []struct {
		kubelet, desired, running string
		want                      string // part of the detail; "" for none
	}{
		{"v1.37.2", "v1.37.2", "v1.37.2", ""},
		{"v1.34.0", "v1.37.2", "", ""},
		{"v1.38.0", "v1.37.2", "", "newer than the cluster's control plane (v1.37.2)"},
		{"v1.37.2", "v1.37.2", "v1.36.3", "newer than the oldest API server the cluster runs (v1.36.3"},
		{"v1.37.2", "v1.37.2", "", ""}, // running unknown
		{"v1.33.9", "v1.37.2", "", "at most 3 minor versions older than the cluster's control plane (v1.37.2): raise it to v1.34"},
		{"v0.37.2", "v1.37.2", "", "at most 3 minor versions older"},
	} {
		errs := kubeletSkew(clusterv1.KubernetesVersion(tc.kubelet), clusterv1.KubernetesVersion(tc.desired), tc.running, p)
		switch {
		case tc.want == "" && len(errs) > 0:
			t.Errorf("kubelet %s, control plane %s, running %q: refused: %v", tc.kubelet, tc.desired, tc.running, errs)
		case tc.want != "" && (len(errs) != 1 || !strings.Contains(errs[0].Detail, tc.want)):
			t.Errorf("kubelet %s, control plane %s, running %q: got %v, want one error saying %q", tc.kubelet, tc.desired, tc.running, errs, tc.want)
		}
	}
}

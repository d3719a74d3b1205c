package kubeletconfig

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	good := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 64\n"
	for _, tc := range []struct {
		name, data, err string
		maxPods         int32
	}{
		{name: "a KubeletConfiguration", data: good, maxPods: 64},
		{name: "without maxPods", data: "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"},
		{name: "empty", data: "", err: `has no key "kubelet"`},
		{name: "another kind", data: "apiVersion: v1\nkind: ConfigMap\n", err: "want kubelet.config.k8s.io/v1beta1 KubeletConfiguration"},
		{name: "not YAML", data: "maxPods: [", err: "not a YAML or JSON document"},
		{name: "maxPods out of range", data: strings.Replace(good, "64", "0", 1), err: "maxPods 0 is out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("kubelet-v2", []byte(tc.data))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "kubelet-v2") {
					t.Fatalf("err = %v, want one naming the configmap and saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.MaxPods != tc.maxPods {
				t.Errorf("maxPods = %d, want %d", c.MaxPods, tc.maxPods)
			}
		})
	}
}

// The report names the ConfigMap and changes with the document.
func TestReported(t *testing.T) {
	a, _ := Parse("kubelet-v1", []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"))
	b, _ := Parse("kubelet-v1", []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 10\n"))
	if a.Reported() == b.Reported() {
		t.Errorf("two documents under one name report the same: %s", a.Reported())
	}
	name, hash, ok := ParseReported(a.Reported())
	if !ok || name != "kubelet-v1" || hash != a.Hash() || len(hash) != 16 {
		t.Errorf("ParseReported(%q) = %q, %q, %v", a.Reported(), name, hash, ok)
	}
	if _, _, ok := ParseReported("no-slash"); ok {
		t.Errorf("a malformed report was accepted")
	}
}

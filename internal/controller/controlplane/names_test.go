package controlplane

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// A control-plane machine's name is its Node's, and so the value of the
// Node's kubernetes.io/hostname label: a DNS label for every cluster name
// the API accepts (up to 63 characters), and one prefix per cluster.
func TestMachineNamesAreDNSLabelsForEveryClusterName(t *testing.T) {
	for n := 1; n <= validation.DNS1123LabelMaxLength; n++ {
		cluster := strings.Repeat("c", n)
		first, other := newName(cluster, nil, true), newName(cluster, nil, false)
		for _, name := range []string{first, other} {
			if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
				t.Fatalf("cluster name of %d characters: machine name %q: %v", n, name, errs)
			}
		}
		if strings.TrimSuffix(first, "0") != other[:len(other)-5] {
			t.Errorf("cluster name of %d characters: %q and %q do not share the cluster's prefix", n, first, other)
		}
	}
}

package nodeagent

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/kubeletconfig"
	"marina.dev/marina/internal/nodeagent/sandbox"
)

// readKubeletConfig reads the kubelet configuration the machine was
// given (M16); nil when it was given none.
func readKubeletConfig(dir string, b *sandbox.Bootstrap) (*kubeletconfig.Config, error) {
	if b.KubeletConfigName == "" {
		return nil, nil
	}
	data, err := os.ReadFile(filepath.Join(dir, sandbox.KubeletConfigFile))
	if err != nil {
		return nil, fmt.Errorf("reading the kubelet configuration: %w", err)
	}
	return kubeletconfig.Parse(b.KubeletConfigName, data)
}

// capacity is the machine's capacity, with the pods its kubelet
// configuration allows (maxPods), as a kubelet reports.
func (a *agent) capacity() corev1.ResourceList {
	if a.kubeletConfig == nil || a.kubeletConfig.MaxPods == 0 {
		return a.boot.Capacity
	}
	c := a.boot.Capacity.DeepCopy()
	if c == nil {
		c = corev1.ResourceList{}
	}
	c[corev1.ResourcePods] = *resource.NewQuantity(int64(a.kubeletConfig.MaxPods), resource.DecimalSI)
	return c
}

// annotations are what the agent keeps on its Node: the bootstrap's (the
// Machine's name), and the kubelet configuration it runs.
func (a *agent) annotations() map[string]string {
	out := maps.Clone(a.boot.Annotations)
	if a.kubeletConfig != nil {
		if out == nil {
			out = map[string]string{}
		}
		out[clusterv1.KubeletConfigAnnotation] = a.kubeletConfig.Reported()
	}
	return out
}

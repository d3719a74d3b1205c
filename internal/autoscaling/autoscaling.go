package autoscaling

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/class"
)

// The scale-from-zero annotations cluster-autoscaler reads on a node group.
// Their names are the autoscaler's, outside marina's group.
const (
	capacityPrefix = "capacity.cluster-autoscaler.kubernetes.io/"
	// CPUAnnotation is the node's CPU capacity, a quantity ("4", "3500m").
	CPUAnnotation = capacityPrefix + "cpu"
	// MemoryAnnotation is the node's memory capacity, a quantity ("8Gi").
	MemoryAnnotation = capacityPrefix + "memory"
	// EphemeralDiskAnnotation is the node's ephemeral-storage capacity.
	EphemeralDiskAnnotation = capacityPrefix + "ephemeral-disk"
	// MaxPodsAnnotation is how many pods the node takes (the autoscaler
	// assumes 110 without it).
	MaxPodsAnnotation = capacityPrefix + "maxPods"
	// GPUTypeAnnotation is the extended resource name of the node's GPUs
	// ("nvidia.com/gpu").
	GPUTypeAnnotation = capacityPrefix + "gpu-type"
	// GPUCountAnnotation is how many GPUs the node has.
	GPUCountAnnotation = capacityPrefix + "gpu-count"
	// LabelsAnnotation lists the node's labels: "k1=v1,k2=v2".
	LabelsAnnotation = capacityPrefix + "labels"
	// TaintsAnnotation lists the node's taints: "k1=v1:NoSchedule,k2:NoExecute".
	TaintsAnnotation = capacityPrefix + "taints"
)

// CapacityAnnotations are every key this package writes.
var CapacityAnnotations = []string{
	CPUAnnotation, MemoryAnnotation, EphemeralDiskAnnotation, MaxPodsAnnotation,
	GPUTypeAnnotation, GPUCountAnnotation, LabelsAnnotation, TaintsAnnotation,
}

// NodeGroupSize reads the min and max size annotations. present is false
// when neither is set (the group is not autoscaled). An error names the
// annotation at fault and says what to write instead.
func NodeGroupSize(annotations map[string]string) (minSize, maxSize int, present bool, err error) {
	minV, hasMin := annotations[clusterv1.AutoscalerMinSizeAnnotation]
	maxV, hasMax := annotations[clusterv1.AutoscalerMaxSizeAnnotation]
	if !hasMin && !hasMax {
		return 0, 0, false, nil
	}
	if !hasMin {
		return 0, 0, true, fmt.Errorf("annotation %s is set but %s is missing: set both, or neither", clusterv1.AutoscalerMaxSizeAnnotation, clusterv1.AutoscalerMinSizeAnnotation)
	}
	if !hasMax {
		return 0, 0, true, fmt.Errorf("annotation %s is set but %s is missing: set both, or neither", clusterv1.AutoscalerMinSizeAnnotation, clusterv1.AutoscalerMaxSizeAnnotation)
	}
	if minSize, err = size(clusterv1.AutoscalerMinSizeAnnotation, minV); err != nil {
		return 0, 0, true, err
	}
	if maxSize, err = size(clusterv1.AutoscalerMaxSizeAnnotation, maxV); err != nil {
		return 0, 0, true, err
	}
	if minSize > maxSize {
		return 0, 0, true, fmt.Errorf("annotation %s (%d) is greater than %s (%d): lower the min or raise the max",
			clusterv1.AutoscalerMinSizeAnnotation, minSize, clusterv1.AutoscalerMaxSizeAnnotation, maxSize)
	}
	return minSize, maxSize, true, nil
}

func size(key, v string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("annotation %s is %q, not a non-negative integer: write a number such as \"0\" or \"10\"", key, v)
	}
	return n, nil
}

// Capacity derives the scale-from-zero annotations for machines made from
// spec: labels and taints as the machine controller puts them on the Node
// (the class's merged with the machine's), and cpu, memory, ephemeral disk,
// pods and GPUs from the class's nodeTemplate.capacity. ok is false when
// spec names no class: marina then knows nothing of the node's size, and
// leaves such annotations to the user. cls must be spec's class.
func Capacity(cls *clusterv1.MachineClass, spec *clusterv1.MachineSpec) (out map[string]string, ok bool, err error) {
	if spec.ClassRef == nil {
		return nil, false, nil
	}
	resolved, err := class.Merge(cls, spec)
	if err != nil {
		return nil, false, fmt.Errorf("resolving MachineClass %q: %w", spec.ClassRef.Name, err)
	}
	out = map[string]string{}
	capacity := cls.Spec.NodeTemplate.Capacity
	put := func(key string, q resource.Quantity, ok bool) {
		if ok {
			out[key] = q.String()
		}
	}
	q, has := capacity[corev1.ResourceCPU]
	put(CPUAnnotation, q, has)
	q, has = capacity[corev1.ResourceMemory]
	put(MemoryAnnotation, q, has)
	q, has = capacity[corev1.ResourceEphemeralStorage]
	put(EphemeralDiskAnnotation, q, has)
	q, has = capacity[corev1.ResourcePods]
	put(MaxPodsAnnotation, q, has)
	for _, name := range slices.Sorted(maps.Keys(capacity)) {
		// The autoscaler models one GPU type per node group; the first
		// extended resource named like a GPU is it.
		if strings.Contains(string(name), "/") && strings.HasSuffix(string(name), "gpu") {
			out[GPUTypeAnnotation] = string(name)
			count := capacity[name]
			out[GPUCountAnnotation] = strconv.FormatInt(count.Value(), 10)
			break
		}
	}
	if len(resolved.Labels) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(resolved.Labels)) {
			parts = append(parts, k+"="+resolved.Labels[k])
		}
		out[LabelsAnnotation] = strings.Join(parts, ",")
	}
	if len(resolved.Taints) > 0 {
		var parts []string
		for _, t := range resolved.Taints {
			if t.Value == "" {
				parts = append(parts, t.Key+":"+string(t.Effect))
			} else {
				parts = append(parts, t.Key+"="+t.Value+":"+string(t.Effect))
			}
		}
		slices.Sort(parts)
		out[TaintsAnnotation] = strings.Join(parts, ",")
	}
	return out, true, nil
}

// Apply returns annotations with the derived capacity annotations set and
// the capacity annotations the class no longer gives removed, and whether
// anything changed. It never touches other annotations.
func Apply(annotations, derived map[string]string) (map[string]string, bool) {
	out := maps.Clone(annotations)
	if out == nil {
		out = map[string]string{}
	}
	changed := false
	for _, k := range CapacityAnnotations {
		want, ok := derived[k]
		have, had := out[k]
		switch {
		case ok && (!had || have != want):
			out[k] = want
			changed = true
		case !ok && had:
			delete(out, k)
			changed = true
		}
	}
	return out, changed
}

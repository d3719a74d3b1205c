package autoscaling

import (
	"maps"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

func TestNodeGroupSize(t *testing.T) {
	minKey, maxKey := clusterv1.AutoscalerMinSizeAnnotation, clusterv1.AutoscalerMaxSizeAnnotation
	tests := []struct {
		name          string
		annotations   map[string]string
		wantMin, wMax int
		wantPresent   bool
		wantErrNames  string
	}{
		{"none", nil, 0, 0, false, ""},
		{"both", map[string]string{minKey: "0", maxKey: "10"}, 0, 10, true, ""},
		{"equal", map[string]string{minKey: "3", maxKey: "3"}, 3, 3, true, ""},
		{"min above max", map[string]string{minKey: "5", maxKey: "2"}, 0, 0, true, minKey},
		{"negative", map[string]string{minKey: "-1", maxKey: "2"}, 0, 0, true, minKey},
		{"not a number", map[string]string{minKey: "1", maxKey: "ten"}, 0, 0, true, maxKey},
		{"max only", map[string]string{maxKey: "3"}, 0, 0, true, minKey},
		{"min only", map[string]string{minKey: "3"}, 0, 0, true, maxKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lo, hi, present, err := NodeGroupSize(tt.annotations)
			if present != tt.wantPresent {
				t.Errorf("present %v, want %v", present, tt.wantPresent)
			}
			if tt.wantErrNames != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErrNames) {
					t.Fatalf("error %v, want one naming %s", err, tt.wantErrNames)
				}
				return
			}
			if err != nil || lo != tt.wantMin || hi != tt.wMax {
				t.Errorf("got %d %d %v, want %d %d", lo, hi, err, tt.wantMin, tt.wMax)
			}
		})
	}
}

func gpuClass() *clusterv1.MachineClass {
	return &clusterv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu"},
		Spec: clusterv1.MachineClassSpec{
			ProviderSpec: runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":8}}`)},
			NodeTemplate: clusterv1.NodeTemplate{
				Labels: map[string]string{"node.marina.dev/class": "gpu"},
				Taints: []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}},
				Capacity: corev1.ResourceList{
					corev1.ResourceCPU:              resource.MustParse("8"),
					corev1.ResourceMemory:           resource.MustParse("32Gi"),
					corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
					corev1.ResourcePods:             resource.MustParse("110"),
					"nvidia.com/gpu":                resource.MustParse("2"),
				},
			},
		},
	}
}

func TestCapacity(t *testing.T) {
	spec := &clusterv1.MachineSpec{
		ClusterName: "c", Roles: []clusterv1.MachineRole{clusterv1.WorkerRole},
		ClassRef: &clusterv1.MachineClassReference{Name: "gpu"},
		Labels:   map[string]string{"pool": "a"},
		Taints:   []corev1.Taint{{Key: "dedicated", Effect: corev1.TaintEffectNoExecute}},
	}
	got, ok, err := Capacity(gpuClass(), spec)
	if err != nil || !ok {
		t.Fatalf("ok %v err %v", ok, err)
	}
	want := map[string]string{
		CPUAnnotation:           "8",
		MemoryAnnotation:        "32Gi",
		EphemeralDiskAnnotation: "100Gi",
		MaxPodsAnnotation:       "110",
		GPUTypeAnnotation:       "nvidia.com/gpu",
		GPUCountAnnotation:      "2",
		LabelsAnnotation:        "node.marina.dev/class=gpu,pool=a",
		TaintsAnnotation:        "dedicated:NoExecute,nvidia.com/gpu=present:NoSchedule",
	}
	if !maps.Equal(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}

	spec.ClassRef = nil
	if _, ok, _ := Capacity(nil, spec); ok {
		t.Error("a template without a class should leave capacity to the user")
	}
}

func TestApply(t *testing.T) {
	have := map[string]string{"keep": "me", CPUAnnotation: "2", GPUTypeAnnotation: "old/gpu"}
	got, changed := Apply(have, map[string]string{CPUAnnotation: "4"})
	if !changed || got["keep"] != "me" || got[CPUAnnotation] != "4" || got[GPUTypeAnnotation] != "" || have[CPUAnnotation] != "2" {
		t.Errorf("got %v changed %v (input %v)", got, changed, have)
	}
	if _, changed := Apply(got, map[string]string{CPUAnnotation: "4"}); changed {
		t.Error("applying the same annotations again changed something")
	}
}

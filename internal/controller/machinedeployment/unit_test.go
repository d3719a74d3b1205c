package machinedeployment

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

func template(kubelet string) *clusterv1.MachineTemplateSpec {
	return &clusterv1.MachineTemplateSpec{
		ObjectMeta: clusterv1.MachineTemplateMeta{Labels: map[string]string{"pool": "a"}},
		Spec: clusterv1.MachineSpec{
			ClusterName: "c", Roles: []clusterv1.MachineRole{clusterv1.WorkerRole},
			Versions:     clusterv1.MachineVersions{Kubelet: clusterv1.KubernetesVersion(kubelet)},
			ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine"}`)},
		},
	}
}

func TestTemplateHash(t *testing.T) {
	a, err := TemplateHash(template("v1.37.2"))
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := TemplateHash(template("v1.37.2")); again != a {
		t.Errorf("same template, hashes %s and %s", a, again)
	}
	if b, _ := TemplateHash(template("v1.37.1")); b == a {
		t.Error("a different kubelet version gave the same hash")
	}
	labelled := template("v1.37.2")
	labelled.ObjectMeta.Labels["tier"] = "x"
	if c, _ := TemplateHash(labelled); c == a {
		t.Error("a template label change gave the same hash: machines would keep old labels")
	}
	// M16: naming another kubelet configuration rolls the machines.
	v1, v2 := template("v1.37.2"), template("v1.37.2")
	v1.Spec.KubeletConfigRef = &clusterv1.KubeletConfigReference{Name: "kubelet-v1"}
	v2.Spec.KubeletConfigRef = &clusterv1.KubeletConfigReference{Name: "kubelet-v2"}
	h1, _ := TemplateHash(v1)
	if h2, _ := TemplateHash(v2); h1 == h2 || h1 == a {
		t.Error("a template naming another kubelet configuration gave the same hash: its machines would not roll")
	}
}

func msAt(name string, rev string) *clusterv1.MachineSet {
	return &clusterv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{clusterv1.RevisionAnnotation: rev}}}
}

func TestRollbackTarget(t *testing.T) {
	r1, r2, r3 := msAt("r1", "1"), msAt("r2", "2"), msAt("r3", "3")
	sets := []*clusterv1.MachineSet{r1, r2, r3}
	tests := []struct {
		value   string
		current *clusterv1.MachineSet
		want    *clusterv1.MachineSet
		problem string
	}{
		{"0", r3, r2, ""},
		{"0", r2, r1, ""},
		{"1", r3, r1, ""},
		{"0", r1, nil, "revisions kept: 1, 2, 3"},
		{"7", r3, nil, "revision 7"},
		{"two", r3, nil, "not a revision number"},
		{"-1", r3, nil, "not a revision number"},
	}
	for _, tt := range tests {
		got, problem := rollbackTarget(tt.value, sets, tt.current)
		if got != tt.want || (tt.problem != "" && !strings.Contains(problem, tt.problem)) || (tt.problem == "" && problem != "") {
			t.Errorf("rollback to %q from %s: got %v %q, want %v %q", tt.value, tt.current.Name, got, problem, tt.want, tt.problem)
		}
	}
}

func TestLastProgress(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0.Add(time.Hour)
	ms := &clusterv1.MachineSet{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(t0)}}
	created := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(t0.Add(time.Minute))}}
	ready := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(t0)},
		Status: clusterv1.MachineStatus{Conditions: []metav1.Condition{{
			Type: clusterv1.ReadyCondition, Status: metav1.ConditionTrue, LastTransitionTime: metav1.NewTime(t0.Add(2 * time.Minute)),
		}}},
	}
	if got := lastProgress(ms, nil, false, now); !got.Equal(t0) {
		t.Errorf("set only: %v", got)
	}
	if got := lastProgress(ms, []*clusterv1.Machine{created, ready}, false, now); !got.Equal(t0.Add(2 * time.Minute)) {
		t.Errorf("with machines: %v", got)
	}
	if got := lastProgress(ms, nil, true, now); !got.Equal(now) {
		t.Errorf("acted: %v", got)
	}
}

package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// describe machine shows a machine whose class was deleted, saying so,
// instead of failing on the class it cannot read; -o json has the same.
func TestDescribeMachineWhoseClassIsGone(t *testing.T) {
	env := managementPlane(t)
	isolate(t)
	ns := env.Namespace(t)
	path := writeKubeconfig(t, envKubeconfig(t, env, ns))
	ctx := context.Background()
	mc := &clusterv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gone-" + ns},
		Spec: clusterv1.MachineClassSpec{ProviderSpec: runtime.RawExtension{
			Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":4,"memory":"8Gi"}}`)}},
	}
	if err := env.Client.Create(ctx, mc); err != nil {
		t.Fatal(err)
	}
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: "worker-0", Namespace: ns},
		Spec: clusterv1.MachineSpec{
			ClusterName: "dev", Roles: []clusterv1.MachineRole{clusterv1.WorkerRole},
			Versions: clusterv1.MachineVersions{Kubelet: "v1.37.2"},
			ClassRef: &clusterv1.MachineClassReference{Name: mc.Name},
		},
	}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	if out, _, err := marina(t, "describe", "machine", "worker-0", "--kubeconfig", path, "-n", ns); err != nil || !strings.Contains(out, "Class: "+mc.Name+"\n") {
		t.Fatalf("describe machine with its class: %v\n%s", err, out)
	}
	if err := env.Client.Delete(ctx, mc); err != nil {
		t.Fatal(err)
	}

	out, _, err := marina(t, "describe", "machine", "worker-0", "--kubeconfig", path, "-n", ns)
	if err != nil {
		t.Fatalf("describe machine whose class is gone: %v", err)
	}
	for _, want := range []string{"Machine " + ns + "/worker-0 (cluster dev, roles [Worker])", "Machine/worker-0",
		"Class: " + mc.Name + " (deleted: ", "Provider configuration: cannot be merged: ", "no such MachineClass"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe machine does not show %q:\n%s", want, out)
		}
	}

	out, _, err = marina(t, "describe", "machine", "worker-0", "-o", "json", "--kubeconfig", path, "-n", ns)
	if err != nil {
		t.Fatalf("describe machine -o json whose class is gone: %v", err)
	}
	golden(t, "describe-machine-class-gone.json", normalizeMachineView(t, out, ns, mc.Name))
}

// normalizeMachineView blanks what differs from run to run: the machine's
// server-set metadata, the namespace and the class's name.
func normalizeMachineView(t *testing.T, out, namespace, class string) string {
	t.Helper()
	var view map[string]any
	if err := json.Unmarshal([]byte(out), &view); err != nil {
		t.Fatalf("describe -o json is no JSON: %v\n%s", err, out)
	}
	meta := view["machine"].(map[string]any)["metadata"].(map[string]any)
	for _, k := range []string{"uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"} {
		delete(meta, k)
	}
	data, err := json.MarshalIndent(view, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	s := strings.ReplaceAll(string(data), class, "CLASS")
	return strings.ReplaceAll(s, namespace, "NAMESPACE") + "\n"
}

// describe cluster -o json is the tree a script reads: each object with
// its readiness, phase and version.
func TestDescribeClusterJSON(t *testing.T) {
	env := managementPlane(t)
	isolate(t)
	ns := env.Namespace(t)
	path := writeKubeconfig(t, envKubeconfig(t, env, ns))
	if out, _, err := marina(t, "create", "cluster", "dev", "--workers", "3", "--kubeconfig", path); err != nil {
		t.Fatalf("create cluster: %v\n%s", err, out)
	}
	out, _, err := marina(t, "describe", "cluster", "dev", "-o", "json", "--kubeconfig", path)
	if err != nil {
		t.Fatalf("describe cluster -o json: %v", err)
	}
	var tree any
	if err := json.Unmarshal([]byte(out), &tree); err != nil {
		t.Fatalf("describe -o json is no JSON: %v\n%s", err, out)
	}
	dropAges(tree)
	data, err := json.MarshalIndent(tree, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "describe-cluster.json", string(data)+"\n")
}

// dropAges removes the "age" of every node: it depends on when the test ran.
func dropAges(v any) {
	switch v := v.(type) {
	case map[string]any:
		delete(v, "age")
		for _, child := range v {
			dropAges(child)
		}
	case []any:
		for _, child := range v {
			dropAges(child)
		}
	}
}

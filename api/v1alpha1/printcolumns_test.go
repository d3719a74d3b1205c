package v1alpha1_test

import (
	"context"
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// kubectl get machines prints the Roles column as the API server's table
// has it: a role's name, not a JSON list.
func TestMachineRolesColumn(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	for name, role := range map[string]clusterv1.MachineRole{"cp": clusterv1.ControlPlaneRole, "worker": clusterv1.WorkerRole} {
		m := &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: clusterv1.MachineSpec{
				ClusterName: "prod", Roles: []clusterv1.MachineRole{role},
				Versions:     clusterv1.MachineVersions{Kubelet: "v1.37.2"},
				ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi"}}`)},
			},
		}
		if role == clusterv1.ControlPlaneRole {
			m.Spec.Versions.ControlPlane = "v1.37.2"
		}
		if err := env.Client.Create(ctx, m); err != nil {
			t.Fatalf("creating machine %s: %v", name, err)
		}
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/apis", clusterv1.GroupVersion.Group, clusterv1.GroupVersion.Version, "namespaces", ns, "machines").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(ctx).Raw()
	if err != nil {
		t.Fatalf("listing machines as a table: %v", err)
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatalf("decoding the table: %v", err)
	}
	col := -1
	for i, c := range table.ColumnDefinitions {
		if c.Name == "Roles" {
			col = i
		}
	}
	if col < 0 {
		t.Fatalf("no Roles column in %+v", table.ColumnDefinitions)
	}
	want := map[string]string{"cp": "ControlPlane", "worker": "Worker"}
	for _, row := range table.Rows {
		name := row.Cells[0].(string)
		if got := row.Cells[col]; got != want[name] {
			t.Errorf("machine %s: Roles column is %#v, want %q", name, got, want[name])
		}
	}
	if len(table.Rows) != len(want) {
		t.Errorf("the table has %d rows, want %d", len(table.Rows), len(want))
	}
}

package desiredversions

import (
	"os/exec"
	"reflect"
	"strings"
	"testing"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// What the machine controller writes, the agent reads back the same; the
// field names are the contract, so a rename shows here.
func TestEncodeDecode(t *testing.T) {
	v := Versions{Kubelet: "v1.37.2", ControlPlane: clusterv1.ComponentVersions{APIServer: "v1.37.2", Etcd: "v3.6.16"},
		Settings: map[string]clusterv1.ControlPlaneComponents{"v1.37.2": {}}}
	raw, err := Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"kubelet":"v1.37.2","controlPlane":{"apiServer":"v1.37.2","etcd":"v3.6.16"},"settings":{"v1.37.2":{"apiServer":{},"controllerManager":{},"scheduler":{}}}}`; raw != want {
		t.Errorf("Encode = %s, want %s", raw, want)
	}
	got, err := Decode(raw)
	if err != nil || !reflect.DeepEqual(got, v) {
		t.Errorf("Decode = %+v, %v; want %+v", got, err, v)
	}
	if _, err := Decode("v1.37.2"); err == nil || !strings.Contains(err.Error(), clusterv1.DesiredVersionsAnnotation) {
		t.Errorf("Decode of a bare version = %v, want an error naming the annotation", err)
	}
}

// Controllers know no agent: the format they write is this package's, and
// nothing of the node agent is built into them (issue 35).
func TestControllersKnowNoAgent(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "../controller/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "marina.dev/marina/internal/nodeagent") {
			t.Errorf("a controller depends on %s", dep)
		}
	}
}

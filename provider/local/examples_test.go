package local_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/class"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider"
	"marina.dev/marina/provider/local"
	sshprov "marina.dev/marina/provider/ssh"
)

// Every machine the examples describe (Machines, MachineSet and
// MachineDeployment templates, the Cluster's control plane) must be one its
// provider (local, or ssh for examples/ssh) accepts once its class is
// merged: an example that fails on the first `kubectl apply` teaches the
// wrong thing.
func TestExampleMachinesAreValid(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "examples", "*", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples found (%v)", err)
	}
	classes := map[string]*clusterv1.MachineClass{}
	type machine struct {
		where string
		spec  clusterv1.MachineSpec
	}
	var machines []machine
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(data), "\n---") {
			var probe struct{ Kind string }
			if err := yaml.Unmarshal([]byte(doc), &probe); err != nil || probe.Kind == "" {
				continue
			}
			where := filepath.Base(filepath.Dir(f)) + "/" + filepath.Base(f) + " #" + strconv.Itoa(i)
			switch probe.Kind {
			case "MachineClass":
				c := &clusterv1.MachineClass{}
				mustUnmarshal(t, doc, c)
				classes[c.Name] = c
			case "Machine":
				m := &clusterv1.Machine{}
				mustUnmarshal(t, doc, m)
				machines = append(machines, machine{where + " " + m.Name, m.Spec})
			case "MachineSet":
				ms := &clusterv1.MachineSet{}
				mustUnmarshal(t, doc, ms)
				machines = append(machines, machine{where + " " + ms.Name, ms.Spec.Template.Spec})
			case "MachineDeployment":
				md := &clusterv1.MachineDeployment{}
				mustUnmarshal(t, doc, md)
				machines = append(machines, machine{where + " " + md.Name, md.Spec.Template.Spec})
			case "Cluster":
				c := &clusterv1.Cluster{}
				mustUnmarshal(t, doc, c)
				cp := c.Spec.ControlPlane
				machines = append(machines, machine{where + " " + c.Name + " control plane", clusterv1.MachineSpec{
					ClusterName: c.Name, ClassRef: cp.ClassRef, ProviderSpec: cp.ProviderSpec,
				}})
			}
		}
	}
	if len(machines) == 0 {
		t.Fatal("the examples describe no machines")
	}
	registry, err := provider.NewRegistry(&local.Provider{}, &sshprov.Provider{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range machines {
		var mc *clusterv1.MachineClass
		if m.spec.ClassRef != nil {
			if mc = classes[m.spec.ClassRef.Name]; mc == nil {
				t.Errorf("%s: class %q is not in the examples", m.where, m.spec.ClassRef.Name)
				continue
			}
		}
		resolved, err := class.Merge(mc, &m.spec)
		if err != nil {
			t.Errorf("%s: merging its class: %v", m.where, err)
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(resolved.ProviderSpec.Raw, &tm); err != nil {
			t.Errorf("%s: %v", m.where, err)
			continue
		}
		p := registry.For(tm.GroupVersionKind())
		if p == nil {
			t.Errorf("%s: no provider owns kind %s", m.where, tm.GroupVersionKind())
			continue
		}
		if err := p.Validate(resolved.ProviderSpec.Raw); err != nil {
			t.Errorf("%s: the %s provider refuses it: %v", m.where, p.Name(), err)
		}
	}
}

func mustUnmarshal(t *testing.T, doc string, into any) {
	t.Helper()
	if err := yaml.Unmarshal([]byte(doc), into); err != nil {
		t.Fatal(err)
	}
}

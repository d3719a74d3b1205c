package metrics

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	var err error
	if env, err = testenv.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

// marina_machines counts the Machines of the management plane by
// namespace and phase, as they are when scraped.
func TestMachinesByPhase(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	for i, phase := range []clusterv1.MachinePhase{clusterv1.MachinePhaseRunning, clusterv1.MachinePhaseRunning, clusterv1.MachinePhaseFailed, ""} {
		m := &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("m%d", i), Namespace: ns},
			Spec: clusterv1.MachineSpec{
				ClusterName: "c", Roles: []clusterv1.MachineRole{clusterv1.WorkerRole},
				Versions:     clusterv1.MachineVersions{Kubelet: "v1.37.2"},
				ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{}}`)},
			},
		}
		if err := env.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		if phase != "" {
			m.Status.Phase = phase
			if err := env.Client.Status().Update(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := fmt.Sprintf(`
# HELP marina_machines Machines, by namespace and phase.
# TYPE marina_machines gauge
marina_machines{namespace=%[1]q,phase="Failed"} 1
marina_machines{namespace=%[1]q,phase="Running"} 2
marina_machines{namespace=%[1]q,phase="Unknown"} 1
`, ns)
	// Only this test's namespace: other tests may leave machines elsewhere.
	c := &Machines{Reader: namespaced{env.Client, ns}}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "marina_machines"); err != nil {
		t.Error(err)
	}
}

// namespaced lists in one namespace.
type namespaced struct {
	client.Reader
	ns string
}

func (n namespaced) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return n.Reader.List(ctx, list, append(opts, client.InNamespace(n.ns))...)
}

package machine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/internal/testenv/localenv"
	"marina.dev/marina/provider"
	"marina.dev/marina/provider/local"
)

var (
	// suite holds the management plane, the workload API server (a stand-in
	// for a workload cluster's control plane) and the marina binary.
	suite          *localenv.Suite
	mgmt, workload *testenv.Env
)

func TestMain(m *testing.M) {
	localenv.Main(m, "marina-machine-", func(s *localenv.Suite) { suite, mgmt, workload = s, s.Mgmt, s.Workload })
}

func newProvider(root string) (*local.Provider, error) { return suite.NewProvider(root) }

// fixture is one test's world: see localenv.Fixture.
type fixture struct {
	t         *testing.T
	ns        string
	cluster   string
	provider  *local.Provider
	sandboxes string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	lf := suite.NewFixture(t)
	return &fixture{t: t, ns: lf.NS, cluster: lf.Cluster, provider: lf.Provider, sandboxes: lf.Sandboxes}
}

func ptrTo[T any](v T) *T { return &v }

// startController runs a manager with the machine controller and the
// fixture's provider until the test ends or stop is called.
func (f *fixture) startController(opts Options) (stop func()) {
	f.t.Helper()
	if opts.Providers == nil {
		opts.Providers, _ = provider.NewRegistry(f.provider)
	}
	if opts.MaxConcurrentReconciles == 0 {
		opts.MaxConcurrentReconciles = 4
	}
	return localenv.StartManager(f.t, mgmt.Config, f.ns, func(ctx context.Context, mgr ctrl.Manager) error {
		_, err := SetupWithManager(ctx, mgr, opts)
		return err
	})
}

// machine builds a worker Machine with a LocalMachine blob.
func (f *fixture) machine(name string, blob string) *clusterv1.Machine {
	if blob == "" {
		blob = `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","pods":110}}`
	}
	return &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: f.ns + "-" + name, Namespace: f.ns},
		Spec: clusterv1.MachineSpec{
			ClusterName:  f.cluster,
			Roles:        []clusterv1.MachineRole{clusterv1.WorkerRole},
			Versions:     clusterv1.MachineVersions{Kubelet: "v1.37.2"},
			ProviderSpec: &runtime.RawExtension{Raw: []byte(blob)},
		},
	}
}

func (f *fixture) create(m *clusterv1.Machine) *clusterv1.Machine {
	f.t.Helper()
	if err := mgmt.Client.Create(context.Background(), m); err != nil {
		f.t.Fatalf("creating machine: %v", err)
	}
	return m
}

// eventually polls cond until it reports true (its error only describes
// the state so far), failing the test after timeout; see testenv.Eventually.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	testenv.Eventually(t, timeout, what, func() error {
		ok, err := cond()
		switch {
		case ok:
			return nil
		case err == nil:
			return errors.New("not yet")
		default:
			return err
		}
	})
}

func (f *fixture) get(m *clusterv1.Machine) (*clusterv1.Machine, error) {
	got := &clusterv1.Machine{}
	err := mgmt.Client.Get(context.Background(), client.ObjectKeyFromObject(m), got)
	return got, err
}

// waitPhase waits until the machine reaches phase and returns it.
func (f *fixture) waitPhase(m *clusterv1.Machine, phase clusterv1.MachinePhase, timeout time.Duration) *clusterv1.Machine {
	f.t.Helper()
	var got *clusterv1.Machine
	eventually(f.t, timeout, fmt.Sprintf("machine %s to be %s", m.Name, phase), func() (bool, error) {
		var err error
		got, err = f.get(m)
		if err != nil {
			return false, err
		}
		return got.Status.Phase == phase, fmt.Errorf("phase %q, conditions %v", got.Status.Phase, got.Status.Conditions)
	})
	return got
}

// waitGone waits until the machine object is deleted.
func (f *fixture) waitGone(m *clusterv1.Machine, timeout time.Duration) {
	f.t.Helper()
	eventually(f.t, timeout, "machine "+m.Name+" to be deleted", func() (bool, error) {
		got, err := f.get(m)
		if client.IgnoreNotFound(err) != nil {
			return false, err
		}
		if err == nil {
			return false, fmt.Errorf("still there: phase %s, conditions %v", got.Status.Phase, got.Status.Conditions)
		}
		return true, nil
	})
}

// agents counts running node-agent processes serving the machine's sandbox.
func (f *fixture) agents(uid types.UID) int {
	f.t.Helper()
	want := filepath.Join(f.sandboxes, string(uid))
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	n := 0
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(data), "\x00")
		if len(args) > 1 && args[1] == "node-agent" && strings.Contains(string(data), want) {
			n++
		}
	}
	return n
}

// sandboxCount counts the sandboxes in the fixture's provider root.
func (f *fixture) sandboxCount() int {
	entries, _ := os.ReadDir(f.sandboxes)
	n := 0
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			n++
		}
	}
	return n
}

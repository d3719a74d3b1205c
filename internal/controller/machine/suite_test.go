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

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider"
	"marina.dev/marina/provider/local"
)

var (
	// mgmt is the management plane; workload stands in for a workload
	// cluster's control plane (the cluster issue brings real ones).
	mgmt, workload *testenv.Env
	marinaBin      string
	tmpDir         string
)

func TestMain(m *testing.M) { os.Exit(runSuite(m)) }

func runSuite(m *testing.M) int {
	var err error
	if tmpDir, err = os.MkdirTemp("", "marina-machine-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmpDir)
	if marinaBin, err = testenv.BuildMarina(tmpDir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if mgmt, err = testenv.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer mgmt.Stop()
	if workload, err = testenv.StartWorkload(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer workload.Stop()
	code := m.Run()
	// Agents are detached on purpose (they outlive controller restarts);
	// the suite ends every one it started.
	if err := deleteAllSandboxes(); err != nil {
		fmt.Fprintln(os.Stderr, "cleaning up sandboxes:", err)
		code = 1
	}
	return code
}

func deleteAllSandboxes() error {
	roots, _ := filepath.Glob(filepath.Join(tmpDir, "machines-*"))
	for _, root := range roots {
		p, err := newProvider(root)
		if err != nil {
			return err
		}
		if err := p.DeleteAll(context.Background()); err != nil {
			return err
		}
	}
	return nil
}

func newProvider(root string) (*local.Provider, error) {
	return local.New(local.Options{Root: root, AgentCommand: []string{marinaBin, "node-agent"}})
}

// fixture is one test's world: a namespace with a Cluster whose kubeconfig
// Secret points at the workload API server, and a local provider.
type fixture struct {
	t         *testing.T
	ns        string
	cluster   string
	provider  *local.Provider
	sandboxes string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{t: t, ns: mgmt.Namespace(t), cluster: "c1"}
	f.sandboxes = filepath.Join(tmpDir, "machines-"+f.ns)
	var err error
	if f.provider, err = newProvider(f.sandboxes); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: f.cluster, Namespace: f.ns},
		Spec: clusterv1.ClusterSpec{
			ClusterNetwork: clusterv1.ClusterNetwork{Pods: []clusterv1.CIDR{"10.244.0.0/16"}, Services: []clusterv1.CIDR{"10.96.0.0/12"}},
			ControlPlane: clusterv1.ControlPlaneSpec{
				Version:      "v1.37.2",
				Replicas:     1,
				ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"2Gi"}}`)},
			},
		},
	}
	if err := mgmt.Client.Create(ctx, cluster); err != nil {
		t.Fatalf("creating cluster: %v", err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: remote.KubeconfigSecretName(f.cluster), Namespace: f.ns},
		Data:       map[string][]byte{remote.KubeconfigSecretKey: workload.Kubeconfig},
	}
	if err := mgmt.Client.Create(ctx, secret); err != nil {
		t.Fatalf("creating kubeconfig secret: %v", err)
	}
	return f
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
	mgr, err := ctrl.NewManager(mgmt.Config, ctrl.Options{
		Scheme:  scheme.New(),
		Metrics: metricsserver.Options{BindAddress: "0"},
		// Each test's controller sees its own namespace only: machines other
		// tests left behind belong to other providers' sandboxes and must not
		// queue ahead of this test's.
		Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{f.ns: {}}},
		// Several managers live in one test binary; names must not clash.
		Controller: config.Controller{SkipNameValidation: ptrTo(true)},
	})
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := SetupWithManager(ctx, mgr, opts); err != nil {
		f.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			f.t.Errorf("manager: %v", err)
		}
	}()
	var stopped bool
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	f.t.Cleanup(stop)
	return stop
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

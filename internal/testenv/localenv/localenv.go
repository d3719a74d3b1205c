// Package localenv is the world controller tests run machines in: a
// management plane (envtest's real kube-apiserver with marina's CRDs), a
// second API server standing in for a workload cluster, the marina binary
// for node agents, and per test a namespace holding a Cluster whose
// kubeconfig Secret points at that workload API server, with a local
// provider rooted in its own directory. A package starts one Suite in
// TestMain and shares it between its tests.
package localenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider/local"
)

// LocalMachineBlob is a small local worker's providerSpec.
const LocalMachineBlob = `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","pods":110}}`

// Suite is the shared part: both API servers and the marina binary.
type Suite struct {
	// Mgmt is the management plane; Workload stands in for a workload
	// cluster's control plane.
	Mgmt, Workload *testenv.Env
	// MarinaBin is the marina binary node agents run from.
	MarinaBin string
	// TmpDir holds the binary and every fixture's sandboxes.
	TmpDir string
}

// Start builds marina and starts both API servers. On error, whatever was
// started is stopped again.
func Start(prefix string) (_ *Suite, err error) {
	s := &Suite{}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.Stop())
		}
	}()
	if s.TmpDir, err = os.MkdirTemp("", prefix); err != nil {
		return nil, err
	}
	if s.MarinaBin, err = testenv.BuildMarina(s.TmpDir); err != nil {
		return nil, err
	}
	if s.Mgmt, err = testenv.Start(); err != nil {
		return nil, err
	}
	if s.Workload, err = testenv.StartWorkload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Stop ends every node agent the fixtures' providers started (agents are
// detached on purpose: they outlive controller restarts), stops both API
// servers and removes the directory.
func (s *Suite) Stop() error {
	var errs []error
	if s.TmpDir != "" {
		roots, _ := filepath.Glob(filepath.Join(s.TmpDir, "machines-*"))
		for _, root := range roots {
			p, err := s.NewProvider(root)
			if err == nil {
				err = p.DeleteAll(context.Background())
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("cleaning up sandboxes in %s: %w", root, err))
			}
		}
	}
	for _, e := range []*testenv.Env{s.Workload, s.Mgmt} {
		if e != nil {
			if err := e.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("stopping a test API server: %w", err))
			}
		}
	}
	if s.TmpDir != "" {
		errs = append(errs, os.RemoveAll(s.TmpDir))
	}
	return errors.Join(errs...)
}

// Main is the body of a TestMain: it starts the suite, hands it to ready
// (which stores it where the tests find it), runs the tests, and stops the
// suite whatever happens.
func Main(m *testing.M, prefix string, ready func(*Suite)) {
	suite, err := Start(prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ready(suite)
	code := m.Run()
	if err := suite.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// NewProvider returns a local provider whose sandboxes live under root and
// whose agents and endpoints run the suite's marina binary.
func (s *Suite) NewProvider(root string) (*local.Provider, error) {
	return local.New(local.Options{Root: root, AgentCommand: []string{s.MarinaBin, "node-agent"}, LoadBalancerCommand: []string{s.MarinaBin, "load-balancer"}})
}

// Fixture is one test's world: a namespace with a Cluster whose kubeconfig
// Secret points at the workload API server, and a local provider.
type Fixture struct {
	T         *testing.T
	NS        string
	Cluster   string
	Provider  *local.Provider
	Sandboxes string
}

// NewFixture creates the test's namespace, Cluster "c1" and its kubeconfig
// Secret, and a local provider rooted in the suite's directory.
func (s *Suite) NewFixture(t *testing.T) *Fixture {
	t.Helper()
	f := &Fixture{T: t, NS: s.Mgmt.Namespace(t), Cluster: "c1"}
	f.Sandboxes = filepath.Join(s.TmpDir, "machines-"+f.NS)
	var err error
	if f.Provider, err = s.NewProvider(f.Sandboxes); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: f.Cluster, Namespace: f.NS,
			// The suite's workload API server stands in for the control plane.
			Annotations: map[string]string{clusterv1.ExternalControlPlaneAnnotation: "true"}},
		Spec: clusterv1.ClusterSpec{
			ClusterNetwork: clusterv1.ClusterNetwork{Pods: []clusterv1.CIDR{"10.244.0.0/16"}, Services: []clusterv1.CIDR{"10.96.0.0/12"}},
			ControlPlane: clusterv1.ControlPlaneSpec{
				Version:      "v1.37.2",
				Replicas:     1,
				ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"2Gi"}}`)},
			},
		},
	}
	if err := s.Mgmt.Client.Create(ctx, cluster); err != nil {
		t.Fatalf("creating cluster: %v", err)
	}
	secret := &corev1.Secret{
		// The label marina caches Secrets by, which a user's kubeconfig
		// Secret must carry.
		ObjectMeta: metav1.ObjectMeta{Name: remote.KubeconfigSecretName(f.Cluster), Namespace: f.NS,
			Labels: map[string]string{clusterv1.ClusterNameLabel: f.Cluster}},
		Data: map[string][]byte{remote.KubeconfigSecretKey: s.Workload.Kubeconfig},
	}
	if err := s.Mgmt.Client.Create(ctx, secret); err != nil {
		t.Fatalf("creating kubeconfig secret: %v", err)
	}
	return f
}

// StartManager runs a manager against cfg, caching only namespace ns, with
// the controllers setup registers, until the test ends or stop is called.
func StartManager(t *testing.T, cfg *rest.Config, ns string, setup func(ctx context.Context, mgr ctrl.Manager) error) (stop func()) {
	t.Helper()
	skip := true
	secrets, err := remote.CachedSecrets()
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  scheme.New(),
		Metrics: metricsserver.Options{BindAddress: "0"},
		// Each test's controllers see their own namespace only: objects
		// other tests left behind must not queue ahead of this test's;
		// and, as marina's manager, only the Secrets it labels.
		Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}},
			ByObject: map[client.Object]cache.ByObject{&corev1.Secret{}: {Label: secrets}}},
		// Several managers live in one test binary; names must not clash.
		Controller: config.Controller{SkipNameValidation: &skip},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := setup(ctx, mgr); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
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
	t.Cleanup(stop)
	return stop
}

// WorkerSpec is a local worker of the fixture's cluster.
func (f *Fixture) WorkerSpec() clusterv1.MachineSpec {
	return clusterv1.MachineSpec{
		ClusterName:  f.Cluster,
		Roles:        []clusterv1.MachineRole{clusterv1.WorkerRole},
		Versions:     clusterv1.MachineVersions{Kubelet: "v1.37.2"},
		ProviderSpec: &runtime.RawExtension{Raw: []byte(LocalMachineBlob)},
	}
}

// WorkerSet is a MachineSet of replicas local workers of the fixture's
// cluster, selecting and labelling them with labels.
func (f *Fixture) WorkerSet(name string, replicas int32, labels map[string]string) *clusterv1.MachineSet {
	return &clusterv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.NS},
		Spec: clusterv1.MachineSetSpec{
			ClusterName: f.Cluster,
			Replicas:    &replicas,
			Selector:    metav1.LabelSelector{MatchLabels: labels},
			Template: clusterv1.MachineTemplateSpec{
				ObjectMeta: clusterv1.MachineTemplateMeta{Labels: labels},
				Spec:       f.WorkerSpec(),
			},
		},
	}
}

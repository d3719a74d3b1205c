// Package testenv starts the real kube-apiserver and etcd from bin/ (built by
// make setup) for a package's tests, with marina's CRDs installed. A package
// starts one API server in TestMain and shares it between its tests; each test
// works in its own namespace.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/tools"
)

// Env is a running API server with a client for it.
type Env struct {
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client is a direct (uncached) client with marina's scheme.
	Client client.Client
	// Scheme is the scheme Client uses.
	Scheme *runtime.Scheme
	// RepoRoot is the root of the marina checkout.
	RepoRoot string

	env *envtest.Environment
}

// RepoRoot walks up from the working directory (a package directory under
// go test) to the checkout's root, the directory holding tools/versions.env.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "tools", "versions.env")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the marina checkout (tools/versions.env) above the working directory")
		}
		dir = parent
	}
}

// BinDir is the checkout's bin/ directory, where make setup puts the pinned
// components and make build puts marina.
func BinDir() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "bin"), nil
}

// Start starts etcd and kube-apiserver of the newest pinned release and
// installs the CRDs under config/crd/bases.
func Start() (*Env, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	assets := filepath.Join(root, "bin", "k8s", tools.Pinned().NewestKube())
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			return nil, fmt.Errorf("%s is missing: run `make setup` to build the pinned components: %w", filepath.Join(assets, b), err)
		}
	}
	s := scheme.New()
	e := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                s,
	}
	cfg, err := e.Start()
	if err != nil {
		return nil, fmt.Errorf("starting the test API server from %s: %w", assets, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		_ = e.Stop()
		return nil, fmt.Errorf("building a client for the test API server: %w", err)
	}
	return &Env{Config: cfg, Client: c, Scheme: s, RepoRoot: root, env: e}, nil
}

// Stop stops the API server and etcd and removes their directories.
func (e *Env) Stop() error { return e.env.Stop() }

// Main is the body of a package's TestMain: it starts one Env, stores it in
// *env, runs the tests and stops the Env whatever happens.
func Main(m *testing.M, env **Env) {
	e, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the test API server:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// Namespace creates a namespace unique to the test and deletes it when the
// test ends, so tests sharing one API server do not see each other's objects.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"}}
	if err := e.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating a test namespace: %v", err)
	}
	t.Cleanup(func() { _ = e.Client.Delete(context.Background(), ns) })
	return ns.Name
}

// FreePorts returns a port p on 127.0.0.1 such that p..p+n-1 are all free
// right now (etcd wants its client and peer ports side by side).
func FreePorts(t testing.TB, n int) int {
	t.Helper()
	for attempt := 0; attempt < 100; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("finding a free port: %v", err)
		}
		base := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if base+n > 65535 {
			continue
		}
		ok := true
		for p := base + 1; p < base+n && ok; p++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				ok = false
				continue
			}
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports found on 127.0.0.1", n)
	return 0
}

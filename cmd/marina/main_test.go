package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider/local"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// The management plane of the tests that need one: the real API server,
// calling marina's admission webhook served from the test with the local
// provider (given no bin directory, so any version is one it can run).
// It starts on first use, so that the pure tests run without it.
var (
	planeOnce sync.Once
	planeEnv  *testenv.Env
	planeErr  error
	provRoot  string
)

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if planeEnv != nil {
		if err := planeEnv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the test API server:", err)
		}
	}
	if provRoot != "" {
		os.RemoveAll(provRoot)
	}
	os.Exit(code)
}

func managementPlane(t *testing.T) *testenv.Env {
	t.Helper()
	planeOnce.Do(func() {
		if provRoot, planeErr = os.MkdirTemp("", "marina-cli-test-"); planeErr != nil {
			return
		}
		prov, err := local.New(local.Options{Root: provRoot, AgentCommand: []string{"/bin/false"}})
		if err != nil {
			planeErr = err
			return
		}
		planeEnv, planeErr = testenv.StartWithWebhook(prov)
	})
	if planeErr != nil {
		t.Fatal(planeErr)
	}
	return planeEnv
}

// isolate keeps the test from the machine's kubeconfigs and marina up:
// no $KUBECONFIG, a state directory of its own, and ~/.kube/config a file
// that does not exist. It returns the state directory.
func isolate(t *testing.T) string {
	t.Helper()
	state := t.TempDir()
	t.Setenv("KUBECONFIG", "")
	t.Setenv("MARINA_STATE_DIR", state)
	home := clientcmd.RecommendedHomeFile
	clientcmd.RecommendedHomeFile = filepath.Join(t.TempDir(), ".kube", "config")
	t.Cleanup(func() { clientcmd.RecommendedHomeFile = home })
	return state
}

// marina runs the marina command line in this process.
func marina(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return marinaCtx(ctx, args...)
}

func marinaCtx(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	cmd := newRootCommand()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err = cmd.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// adminKubeconfig is the test API server's kubeconfig, parsed: one
// cluster, one user, one context.
func adminKubeconfig(t *testing.T, env *testenv.Env) (cluster *clientcmdapi.Cluster, user *clientcmdapi.AuthInfo) {
	t.Helper()
	cfg, err := clientcmd.Load(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil {
		t.Fatalf("the test kubeconfig has no current context")
	}
	return cfg.Clusters[ctx.Cluster], cfg.AuthInfos[ctx.AuthInfo]
}

// writeKubeconfig writes cfg to a file in a temporary directory.
func writeKubeconfig(t *testing.T, cfg *clientcmdapi.Config) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden file (run go test -update to write it): %v", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// deadServer is a URL nothing listens on.
const deadServer = "https://127.0.0.1:1"

// envKubeconfig is the test API server's kubeconfig with namespace as its
// context's.
func envKubeconfig(t *testing.T, env *testenv.Env, namespace string) *clientcmdapi.Config {
	t.Helper()
	cluster, user := adminKubeconfig(t, env)
	return &clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"test": cluster},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"admin": user},
		Contexts:       map[string]*clientcmdapi.Context{"test": {Cluster: "test", AuthInfo: "admin", Namespace: namespace}},
		CurrentContext: "test",
	}
}

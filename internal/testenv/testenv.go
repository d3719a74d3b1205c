// Package testenv starts the real kube-apiserver and etcd from bin/ (built by
// make setup) for a package's tests, with marina's CRDs installed. A package
// starts one API server in TestMain and shares it between its tests; each test
// works in its own namespace.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/internal/webhook"
	"marina.dev/marina/provider"
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
	// Kubeconfig reaches the API server as an administrator, as a file's bytes.
	Kubeconfig []byte

	env *envtest.Environment
	// stopWebhook stops the in-process admission webhook, if one runs.
	stopWebhook func()
	// stopControllers stops a workload's kube-controller-manager.
	stopControllers func()
	// ca is a workload's client CA, whose directory holds its key.
	ca *clientCA
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
// installs the CRDs under config/crd/bases: a management plane.
func Start() (*Env, error) { return start(true) }

// StartWorkload starts an API server without marina's CRDs: a stand-in for a
// workload cluster's control plane that someone else runs, with what such
// a cluster has for its nodes (workload.go): bootstrap tokens, the Node
// authorizer and NodeRestriction, and kube-controller-manager approving and
// signing node client certificates.
func StartWorkload() (*Env, error) { return start(false) }

// StartWithWebhook starts a management plane (Start) whose API server calls
// marina's admission webhook (config/webhook), served from this process by
// internal/webhook with the given providers, exactly as `marina up` serves
// it: every write of a marina kind is checked by it.
func StartWithWebhook(providers ...provider.Provider) (*Env, error) {
	e, err := startEnv(true, true)
	if err != nil {
		return nil, err
	}
	if err := e.serveWebhook(providers); err != nil {
		_ = e.Stop()
		return nil, err
	}
	return e, nil
}

// serveWebhook runs the admission webhook where envtest told the API server
// to find it.
func (e *Env) serveWebhook(providers []provider.Provider) error {
	registry, err := provider.NewRegistry(providers...)
	if err != nil {
		return err
	}
	w := &e.env.WebhookInstallOptions
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{
		Scheme:                 e.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer: crwebhook.NewServer(crwebhook.Options{
			Host: w.LocalServingHost, Port: w.LocalServingPort, CertDir: w.LocalServingCertDir,
		}),
	})
	if err != nil {
		return fmt.Errorf("creating the webhook's manager: %w", err)
	}
	if err := webhook.Setup(mgr, webhook.Options{Providers: registry}); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	e.stopWebhook = func() { cancel(); <-done }
	started := mgr.GetWebhookServer().StartedChecker()
	deadline := time.Now().Add(time.Minute)
	for started(nil) != nil {
		if time.Now().After(deadline) {
			e.stopWebhook()
			return errors.New("the admission webhook did not start within a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// StopWebhook stops the in-process admission webhook, as if marina were
// down; the API server keeps calling it.
func (e *Env) StopWebhook() {
	if e.stopWebhook != nil {
		e.stopWebhook()
		e.stopWebhook = nil
	}
}

func start(withCRDs bool) (*Env, error) { return startEnv(withCRDs, false) }

func startEnv(withCRDs, withWebhook bool) (*Env, error) {
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
	// envtest gives each process 20 s to start; with the e2e planes
	// beside it on 2 cores, a kube-apiserver took longer (make test saw
	// "timeout waiting for process kube-apiserver to start" 5 times).
	e := &envtest.Environment{BinaryAssetsDirectory: assets, Scheme: s, ControlPlaneStartTimeout: 2 * time.Minute}
	if withCRDs {
		e.CRDDirectoryPaths = []string{filepath.Join(root, "config", "crd", "bases")}
		e.ErrorIfCRDPathMissing = true
	}
	if withWebhook {
		// envtest rewrites the configuration to reach a local port with a
		// certificate of its own making.
		e.WebhookInstallOptions.Paths = []string{filepath.Join(root, "config", "webhook", "manifests.yaml")}
	}
	var ca *clientCA
	if !withCRDs {
		if ca, err = configureWorkload(e); err != nil {
			return nil, err
		}
	}
	env := &Env{Scheme: s, RepoRoot: root, env: e, ca: ca}
	cfg, err := e.Start()
	if err != nil {
		// Start can fail after the processes run (a CRD the server refuses):
		// stop them, and remove their directories, all the same.
		_ = env.Stop()
		return nil, fmt.Errorf("starting the test API server from %s: %w", assets, err)
	}
	env.Config, env.Kubeconfig = cfg, e.KubeConfig
	if env.Client, err = client.New(cfg, client.Options{Scheme: s}); err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("building a client for the test API server: %w", err)
	}
	if ca != nil {
		if env.stopControllers, err = startCertificateControllers(e.KubeConfig, ca); err != nil {
			_ = env.Stop()
			return nil, err
		}
	}
	return env, nil
}

// Stop stops the webhook (if any), the API server and etcd, and removes
// their directories and the workload's CA. The CA's directory goes even
// when stopping fails: envtest removes it only after the API server has
// stopped cleanly, and a suite on a loaded machine left its key in /tmp.
func (e *Env) Stop() error {
	e.StopWebhook()
	if e.stopControllers != nil {
		e.stopControllers()
	}
	err := e.env.Stop()
	if e.ca != nil {
		err = errors.Join(err, e.ca.Stop())
	}
	return err
}

// Main is the body of a package's TestMain: it starts one Env, stores it in
// *env, runs the tests and stops the Env whatever happens.
func Main(m *testing.M, env **Env) { os.Exit(Run(m, env)) }

// Run is Main that returns the exit code instead of exiting, so that the
// caller can remove what it made for the suite first.
func Run(m *testing.M, env **Env) int { return run(m, env, Start) }

// MainWorkload is Main with StartWorkload: a bare API server without
// marina's CRDs, as marina init meets one.
func MainWorkload(m *testing.M, env **Env) { os.Exit(run(m, env, StartWorkload)) }

// MainWithWebhook is Main with StartWithWebhook.
func MainWithWebhook(m *testing.M, env **Env, providers ...provider.Provider) {
	os.Exit(RunWithWebhook(m, env, providers...))
}

// RunWithWebhook is MainWithWebhook that returns the exit code instead of
// exiting, so that the caller can remove what it made for the suite first.
func RunWithWebhook(m *testing.M, env **Env, providers ...provider.Provider) int {
	return run(m, env, func() (*Env, error) { return StartWithWebhook(providers...) })
}

func run(m *testing.M, env **Env, start func() (*Env, error)) int {
	e, err := start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the test API server:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
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

// Ports FreePorts hands out: below Linux's ephemeral range (32768-60999 by
// default), where the kernel picks the source port of every outgoing
// connection and the ":0" of every listener, so that a client socket of
// another test cannot take a port between FreePorts and the bind.
const (
	firstTestPort = 10000
	lastTestPort  = 32767
)

// handedOut holds, under handedOutMu, the ports FreePorts returned in this
// process: a port is handed out once, so that tests running side by side
// (t.Parallel) never get the same one even before either has bound it.
var (
	handedOutMu sync.Mutex
	handedOut   = map[int]bool{}
)

// FreePorts returns a port p on 127.0.0.1 such that p..p+n-1 are all free
// right now and handed out to no other caller of this process (etcd wants
// its client and peer ports side by side). Another process may still bind
// one first: callers that start servers retry on "address in use".
func FreePorts(t testing.TB, n int) int {
	t.Helper()
	handedOutMu.Lock()
	defer handedOutMu.Unlock()
	for attempt := 0; attempt < 1000; attempt++ {
		base := firstTestPort + rand.IntN(lastTestPort-firstTestPort-n+2)
		if portsFree(base, n) {
			for p := base; p < base+n; p++ {
				handedOut[p] = true
			}
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports found on 127.0.0.1 in %d-%d", n, firstTestPort, lastTestPort)
	return 0
}

// portsFree says whether base..base+n-1 are neither handed out nor bound;
// called under handedOutMu.
func portsFree(base, n int) bool {
	for p := base; p < base+n; p++ {
		if handedOut[p] {
			return false
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}

// BuildMarina builds the marina binary into dir and returns its path, for
// tests that run it as a user would (marina up, marina node-agent).
func BuildMarina(dir string) (string, error) {
	return buildMarina(dir, nil, "go", "build", "-o", filepath.Join(dir, "marina"), "./cmd/marina")
}

// BuildStaticMarina builds marina as make image does: statically linked for
// Linux, stamped with ldflags (version.LDFlags), into dir.
func BuildStaticMarina(dir, ldflags string) (string, error) {
	return buildMarina(dir, []string{"CGO_ENABLED=0", "GOOS=linux"},
		"go", "build", "-trimpath", "-ldflags", "-s -w "+ldflags, "-o", filepath.Join(dir, "marina"), "./cmd/marina")
}

func buildMarina(dir string, env []string, args ...string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	if output, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building marina: %w\n%s", err, output)
	}
	return filepath.Join(dir, "marina"), nil
}

// StartControllerManager runs the pinned kube-controller-manager against the
// API server of env with the given controllers, as on any cluster (for
// example node-lifecycle-controller, so a Node whose kubelet stops
// heartbeating turns NotReady). It is stopped when the test ends.
func StartControllerManager(t testing.TB, env *Env, controllers []string, extraArgs ...string) {
	t.Helper()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.Kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	binDir, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=" + strings.Join(controllers, ","),
		"--leader-elect=false",
		"--secure-port=0",
	}, extraArgs...)
	cmd := exec.Command(filepath.Join(binDir, "kube-controller-manager-"+tools.Pinned().NewestKube()), args...)
	logFile, err := os.Create(filepath.Join(dir, "kube-controller-manager.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting kube-controller-manager: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		logFile.Close()
		if t.Failed() {
			data, _ := os.ReadFile(logFile.Name())
			lines := strings.Split(strings.TrimSpace(string(data)), "\n")
			t.Logf("last lines of kube-controller-manager's log:\n%s", strings.Join(lines[max(0, len(lines)-30):], "\n"))
		}
	})
}

// Eventually polls cond every 100ms until it returns nil, and fails the test
// with cond's last error when timeout passes first: tests wait for a
// condition, never for a fixed time.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			Fatalf(t, "%s: not true after %s: %v", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

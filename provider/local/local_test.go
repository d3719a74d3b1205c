package local

import (
	"context"
	"errors"
	"fmt"
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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/bootstraptoken"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider"
)

// agentCommand and lbCommand run the marina binary that TestMain builds.
var agentCommand, lbCommand []string

func TestMain(m *testing.M) {
	code := func() int {
		tmp, err := os.MkdirTemp("", "marina-local-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(tmp)
		root, err := testenv.RepoRoot()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		bin := filepath.Join(tmp, "marina")
		build := exec.Command("go", "build", "-o", bin, "./cmd/marina")
		build.Dir = root
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building marina for the agent:", err)
			return 1
		}
		agentCommand = []string{bin, "node-agent"}
		lbCommand = []string{bin, "load-balancer"}
		defer stopAPIServer()
		return m.Run()
	}()
	os.Exit(code)
}

// The API server is started by the one test that needs it, not for all.
var (
	apiOnce sync.Once
	apiEnv  *testenv.Env
	apiErr  error
)

func apiServer(t *testing.T) *testenv.Env {
	t.Helper()
	// A stand-in for a cluster someone else runs: agents join it by TLS
	// bootstrap.
	apiOnce.Do(func() { apiEnv, apiErr = testenv.StartWorkload() })
	if apiErr != nil {
		t.Fatal(apiErr)
	}
	return apiEnv
}

func stopAPIServer() {
	if apiEnv != nil {
		_ = apiEnv.Stop()
	}
}

// newProvider returns a provider on a fresh root whose agents are all
// stopped when the test ends, whatever happened.
func newProvider(t *testing.T) *Provider {
	t.Helper()
	return startProvider(t, Options{LoadBalancerCommand: lbCommand, AgentStopTimeout: 5 * time.Second})
}

// newControlPlaneProvider returns a provider that runs the control-plane
// components of binDir, its agents all stopped when the test ends.
func newControlPlaneProvider(t *testing.T, binDir string) *Provider {
	t.Helper()
	return startProvider(t, Options{BinDir: binDir, AgentStopTimeout: 30 * time.Second})
}

// startProvider is a provider of opts on a fresh root, with the test's
// agent command, that deletes every machine it holds when the test ends.
func startProvider(t *testing.T, opts Options) *Provider {
	t.Helper()
	opts.Root, opts.AgentCommand = t.TempDir(), agentCommand
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.DeleteAll(context.Background()); err != nil {
			t.Errorf("cleaning up machines: %v", err)
		}
	})
	return p
}

// request is a worker machine request whose agent talks to an API server
// that does not answer: enough for the sandbox and process tests.
func request(name string) *provider.Request {
	return &provider.Request{
		UID:       uuid.NewUUID(),
		Namespace: "default",
		Name:      name,
		Machine: clusterv1.MachineSpec{
			ClusterName: "minimal",
			Roles:       []clusterv1.MachineRole{clusterv1.WorkerRole},
			Versions:    clusterv1.MachineVersions{Kubelet: "v1.37.2"},
			Labels:      map[string]string{"example.marina.dev/pool": "default"},
			Taints:      []corev1.Taint{{Key: "example.marina.dev/dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}},
		},
		ProviderSpec:    []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","pods":110,"gpus":1}}`),
		Bootstrap:       provider.Bootstrap{Server: "https://127.0.0.1:1", Token: "abcdef.0123456789abcdef"},
		NodeAnnotations: map[string]string{"cluster.marina.dev/machine": name},
	}
}

// agentsOf counts the processes running the agent of sandbox dir.
func agentsOf(dir string) int {
	n := 0
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && runsSandbox(pid, dir) {
			n++
		}
	}
	return n
}

// joinToken starts the package's API server and returns it, a client of
// it, and a bootstrap token with which agents join it.
func joinToken(t *testing.T) (*testenv.Env, kubernetes.Interface, string) {
	t.Helper()
	env := apiServer(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := bootstraptoken.EnsureRBAC(t.Context(), cs); err != nil {
		t.Fatal(err)
	}
	if err := testenv.ApproveBootstrapCertificates(t.Context(), cs); err != nil {
		t.Fatal(err)
	}
	token, err := bootstraptoken.Ensure(t.Context(), cs, uuid.NewUUID(), bootstraptoken.DefaultTTL, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return env, cs, token
}

// eventually waits for cond; see testenv.Eventually.
var eventually = testenv.Eventually

func TestValidate(t *testing.T) {
	p := &Provider{}
	for _, tc := range []struct {
		name, blob string
		field      string // "" when valid
	}{
		{"good", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","pods":110,"gpus":0}}`, ""},
		{"good with defaults and metadata", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","metadata":{},"spec":{"cpu":"500m","memory":"2Gi"}}`, ""},
		{"unknown spec field", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memroy":"4Gi"}}`, "spec.memroy"},
		{"unknown top-level field", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","specc":{},"spec":{"cpu":2,"memory":"4Gi"}}`, "specc"},
		{"bad memory", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gx"}}`, "spec.memory"},
		{"zero memory", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":0}}`, "spec.memory"},
		{"missing memory", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2}}`, "spec.memory"},
		{"negative cpu", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":-1,"memory":"4Gi"}}`, "spec.cpu"},
		{"zero pods", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","pods":0}}`, "spec.pods"},
		{"too many pods", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","pods":1001}}`, "spec.pods"},
		{"negative gpus", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","gpus":-1}}`, "spec.gpus"},
		{"fractional gpus", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","gpus":0.5}}`, "spec.gpus"},
		{"good with a disk", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","diskSize":"40Gi"}}`, ""},
		{"bad disk size", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","diskSize":"40Gx"}}`, "spec.diskSize"},
		{"zero disk size", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","diskSize":0}}`, "spec.diskSize"},
		{"pooled agent", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","agent":"Pooled"}}`, ""},
		{"unknown agent mode", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","agent":"Shared"}}`, "spec.agent"},
		{"wrong kind", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"GCEMachine","spec":{"cpu":2,"memory":"4Gi"}}`, "kind"},
		{"wrong version", `{"apiVersion":"local.marina.dev/v1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi"}}`, "apiVersion"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := p.Validate([]byte(tc.blob))
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v, want nil", err)
				}
				return
			}
			var ise *provider.InvalidSpecError
			if !errors.As(err, &ise) {
				t.Fatalf("Validate: %v, want an *InvalidSpecError", err)
			}
			t.Log(err)
			if ise.Field != tc.field {
				t.Errorf("field = %q, want %q (%v)", ise.Field, tc.field, err)
			}
		})
	}
	m, err := Decode([]byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"2Gi"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.Spec.Pods != DefaultPods || m.Spec.GPUs != 0 || m.Spec.CPU.Value() != 2 {
		t.Errorf("defaults: %+v", m.Spec)
	}
}

func TestPickAddressProbesPastCollisions(t *testing.T) {
	uid := types.UID("8a0c5b1e-0d54-4c87-9d3a-6f0b9c1e2d3f")
	first, err := pickAddress(uid, nil)
	if err != nil {
		t.Fatal(err)
	}
	second, err := pickAddress(uid, map[string]bool{first: true})
	if err != nil {
		t.Fatal(err)
	}
	if first == second {
		t.Fatalf("pickAddress returned the used address %s", first)
	}
	for _, a := range []string{first, second} {
		if !strings.HasPrefix(a, "127.") || strings.HasPrefix(a, "127.0.") {
			t.Errorf("address %s is not in 127.1-254.x.x", a)
		}
	}
}

func TestCreateIsIdempotent(t *testing.T) {
	ctx := t.Context()
	p := newProvider(t)
	req := request("worker-0")

	first, err := p.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := p.AgentPID(req.UID)
	if err != nil {
		t.Fatal(err)
	}
	second, err := p.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	pid2, err := p.AgentPID(req.UID)
	if err != nil {
		t.Fatal(err)
	}
	if pid != pid2 {
		t.Errorf("agent PID changed across Creates: %d then %d", pid, pid2)
	}
	if first.Addresses[0] != second.Addresses[0] || first.ProviderID != second.ProviderID {
		t.Errorf("instances differ: %+v then %+v", first, second)
	}
	if first.ProviderID != "local://"+string(req.UID) || first.State != provider.InstanceRunning {
		t.Errorf("instance = %+v", first)
	}
	if a := first.Addresses; len(a) != 2 || a[0].Type != clusterv1.MachineInternalIP || a[1] != (clusterv1.MachineAddress{Type: clusterv1.MachineHostName, Address: "worker-0"}) {
		t.Errorf("addresses = %+v", a)
	}
	entries, err := os.ReadDir(p.root)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != string(req.UID) {
		t.Errorf("root holds %v, want just the sandbox %s", entries, req.UID)
	}
	dir := p.sandboxDir(req.UID)
	if n := agentsOf(dir); n != 1 {
		t.Errorf("%d agents run for the sandbox, want 1", n)
	}

	// The bootstrap is private and says what the machine is.
	fi, err := os.Stat(filepath.Join(dir, sandbox.BootstrapFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("bootstrap mode %v, want 0600", fi.Mode().Perm())
	}
	b, err := sandbox.ReadBootstrap(dir)
	if err != nil {
		t.Fatal(err)
	}
	gpus := b.Capacity[GPUResource]
	if b.NodeName != "worker-0" || b.ProviderID != first.ProviderID || b.Token != "abcdef.0123456789abcdef" ||
		b.KubeletVersion != "v1.37.2" || b.Labels["example.marina.dev/pool"] != "default" ||
		len(b.Taints) != 1 || gpus.Value() != 1 || b.Address != first.Addresses[0].Address ||
		b.Annotations["cluster.marina.dev/machine"] != "worker-0" {
		t.Errorf("bootstrap = %+v", b)
	}
}

func TestDistinctAddresses(t *testing.T) {
	ctx := t.Context()
	p := newProvider(t)
	seen := map[string]bool{}
	for i := range 3 {
		inst, err := p.Create(ctx, request(fmt.Sprintf("worker-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		a := inst.Addresses[0].Address
		if seen[a] || a == "127.0.0.1" {
			t.Errorf("address %s handed out twice or is 127.0.0.1", a)
		}
		seen[a] = true
	}
}

func TestGetAndDelete(t *testing.T) {
	ctx := t.Context()
	p := newProvider(t)
	req := request("worker-0")
	if _, err := p.Get(ctx, req.UID); !provider.IsNotFound(err) {
		t.Fatalf("Get before Create: %v, want NotFound", err)
	}
	created, err := p.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Get(ctx, req.UID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != provider.InstanceRunning || got.ProviderID != created.ProviderID || got.Addresses[0] != created.Addresses[0] {
		t.Errorf("Get = %+v, want %+v", got, created)
	}
	dir := p.sandboxDir(req.UID)
	if err := p.Delete(ctx, req.UID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox still there after Delete: %v", err)
	}
	if n := agentsOf(dir); n != 0 {
		t.Errorf("%d agents still run after Delete", n)
	}
	if _, err := p.Get(ctx, req.UID); !provider.IsNotFound(err) {
		t.Errorf("Get after Delete: %v, want NotFound", err)
	}
	if err := p.Delete(ctx, req.UID); err != nil {
		t.Errorf("Delete when gone: %v, want nil", err)
	}
}

func TestDeleteFinishesACrashedDelete(t *testing.T) {
	ctx := t.Context()
	p := newProvider(t)
	uid := uuid.NewUUID()
	// What a crash mid-delete and mid-create leave behind.
	for _, name := range []string{tombPrefix + string(uid) + "-1", tmpPrefix + string(uid) + "-x"} {
		if err := os.MkdirAll(filepath.Join(p.root, name, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Delete(ctx, uid); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(p.root)
	if len(entries) != 0 {
		t.Errorf("leftovers not removed: %v", entries)
	}
}

func TestCreateRestartsADeadAgent(t *testing.T) {
	ctx := t.Context()
	p := newProvider(t)
	req := request("worker-0")
	if _, err := p.Create(ctx, req); err != nil {
		t.Fatal(err)
	}
	dir := p.sandboxDir(req.UID)

	t.Log("killed: the machine is Stopped, and Create starts exactly one new agent")
	pid, err := p.AgentPID(req.UID)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "machine stopped", func() error {
		inst, err := p.Get(ctx, req.UID)
		if err != nil {
			return err
		}
		if inst.State != provider.InstanceStopped {
			return fmt.Errorf("state %s", inst.State)
		}
		return nil
	})
	inst, err := p.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if inst.State != provider.InstanceRunning {
		t.Errorf("state after restart = %s", inst.State)
	}
	pid2, err := p.AgentPID(req.UID)
	if err != nil {
		t.Fatal(err)
	}
	if pid2 == pid {
		t.Errorf("agent PID %d unchanged after restart", pid)
	}
	if n := agentsOf(dir); n != 1 {
		t.Errorf("%d agents after restart, want 1", n)
	}

	t.Log("a crash before the PID file was written: Create adopts the running agent")
	if err := os.Remove(filepath.Join(dir, sandbox.PIDFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Create(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := recordedPID(dir); got != pid2 {
		t.Errorf("agent.pid = %d after repair, want %d", got, pid2)
	}
	if n := agentsOf(dir); n != 1 {
		t.Errorf("%d agents, want 1", n)
	}

	t.Log("dead and no PID file: Create restarts it")
	if err := syscall.Kill(pid2, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, sandbox.PIDFile)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "lock released", func() error {
		if held, _ := sandbox.Held(dir); held {
			return errors.New("still held")
		}
		return nil
	})
	if _, err := p.Create(ctx, req); err != nil {
		t.Fatal(err)
	}
	if n := agentsOf(dir); n != 1 {
		t.Errorf("%d agents, want 1", n)
	}
}

func TestSecondAgentForASandboxExits(t *testing.T) {
	ctx := t.Context()
	p := newProvider(t)
	req := request("worker-0")
	if _, err := p.Create(ctx, req); err != nil {
		t.Fatal(err)
	}
	dir := p.sandboxDir(req.UID)
	out, err := exec.CommandContext(ctx, agentCommand[0], append(agentCommand[1:], "--sandbox", dir)...).CombinedOutput()
	if err == nil {
		t.Fatalf("a second agent for a running sandbox ran and exited 0:\n%s", out)
	}
	if !strings.Contains(string(out), "another agent runs this sandbox") {
		t.Errorf("the second agent's error does not say why:\n%s", out)
	}
	if n := agentsOf(dir); n != 1 {
		t.Errorf("%d agents, want 1", n)
	}
}

func TestMachineJoinsItsCluster(t *testing.T) {
	ctx := t.Context()
	env, cs, token := joinToken(t)
	p := newProvider(t)
	req := request("joiner")
	req.Bootstrap = provider.Bootstrap{Server: env.Config.Host, CAData: env.Config.CAData, Token: token}
	inst, err := p.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "node registered by the detached agent", func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, "joiner", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Spec.ProviderID != inst.ProviderID {
			return fmt.Errorf("providerID %q", n.Spec.ProviderID)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				for _, a := range n.Status.Addresses {
					if a.Type == corev1.NodeInternalIP && a.Address == inst.Addresses[0].Address {
						return nil
					}
				}
				return fmt.Errorf("addresses %+v", n.Status.Addresses)
			}
		}
		return fmt.Errorf("not Ready: %+v", n.Status.Conditions)
	})

	t.Log("SIGTERM stops the agent cleanly, and its log never shows the token")
	dir := p.sandboxDir(req.UID)
	pid, err := p.AgentPID(req.UID)
	if err != nil {
		t.Fatal(err)
	}
	if err := signalAgent(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if released, err := waitReleased(ctx, dir, 10*time.Second); err != nil || !released {
		t.Fatalf("lock not released 10s after SIGTERM (err %v)", err)
	}
	log, err := os.ReadFile(filepath.Join(dir, sandbox.LogFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "Node agent stopped") {
		t.Errorf("the agent did not stop cleanly; its log:\n%s", log)
	}
	if strings.Contains(string(log), token) {
		t.Error("the agent's log contains its token")
	}
	if err := p.Delete(ctx, req.UID); err != nil {
		t.Fatal(err)
	}
	if n := agentsOf(dir); n != 0 {
		t.Errorf("%d agents after Delete", n)
	}
}

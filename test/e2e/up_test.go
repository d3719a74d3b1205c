package e2e

import (
	"bytes"
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

	"k8s.io/apimachinery/pkg/util/wait"

	"marina.dev/marina/internal/crds"
	"marina.dev/marina/internal/testenv"
)

// upProcess is a running `marina up`.
type upProcess struct {
	cmd      *exec.Cmd
	out      *syncBuffer
	stateDir string
	done     chan struct{}
	// ports are the plane's on 127.0.0.1: API, etcd client, etcd peer,
	// webhook, registry.
	ports []int
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startUp starts marina up on stateDir and waits until it is up. Ports
// found free can be taken before marina binds them (by an outgoing
// connection's ephemeral port, in another test package running beside
// this one): a start that fails to bind is tried again on other ports.
func startUp(t *testing.T, stateDir string, args ...string) *upProcess {
	t.Helper()
	for attempt := 1; ; attempt++ {
		u, bindErr := tryStartUp(t, stateDir, args...)
		if !bindErr || attempt == 3 {
			if bindErr {
				t.Fatalf("marina up could not bind its ports in 3 tries:\n%s", u.out)
			}
			return u
		}
		t.Logf("marina up found a port taken, trying other ports:\n%s", lastLine(u.out.String()))
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// tryStartUp reports true, with marina up stopped, when it exited because
// a port was taken.
func tryStartUp(t *testing.T, stateDir string, args ...string) (*upProcess, bool) {
	t.Helper()
	binDir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	base := testenv.FreePorts(t, 5) // API, etcd client, etcd peer, webhook, registry
	cmd := exec.Command(marinaBin, "up",
		"--state-dir", stateDir, "--bin-dir", binDir,
		"--api-port", strconv.Itoa(base),
		"--etcd-port", strconv.Itoa(base+1),
		"--webhook-port", strconv.Itoa(base+3),
		"--registry-port", strconv.Itoa(base+4))
	cmd.Args = append(cmd.Args, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting marina up: %v", err)
	}
	u := &upProcess{cmd: cmd, out: out, stateDir: stateDir, done: make(chan struct{}), ports: []int{base, base + 1, base + 2, base + 3, base + 4}}
	go func() { _ = cmd.Wait(); close(u.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-u.done
	})
	// 5 minutes: in make test on 2 cores a restarted marina up's API
	// server took 2m25s to be ready; alone it takes seconds.
	err = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		select {
		case <-u.done:
			return false, errExited
		default:
		}
		return strings.Contains(out.String(), "management plane is up"), nil
	})
	switch {
	case errors.Is(err, errExited) && strings.Contains(out.String(), "address already in use"):
		return u, true
	case errors.Is(err, errExited):
		t.Fatalf("marina up exited early:\n%s", out)
	case err != nil:
		t.Fatalf("marina up did not become ready: %v\n%s", err, out)
	}
	return u, false
}

var errExited = errors.New("marina up exited")

// kubectl runs bin/kubectl with the plane's admin kubeconfig.
func (u *upProcess) kubectl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	binDir, _ := testenv.BinDir()
	cmd := exec.Command(filepath.Join(binDir, "kubectl"), append([]string{"--kubeconfig", filepath.Join(u.stateDir, "admin.kubeconfig")}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// kubectlStdin runs kubectl with stdin against the management plane.
func (u *upProcess) kubectlStdin(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	binDir, _ := testenv.BinDir()
	cmd := exec.Command(filepath.Join(binDir, "kubectl"), append([]string{"--kubeconfig", filepath.Join(u.stateDir, "admin.kubeconfig")}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// children lists the PIDs whose parent is pid.
func children(t *testing.T, pid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command name, which is in parentheses and may hold spaces.
		fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}

func alive(pid int) bool {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// stopAndCheckNoLeftovers signals marina up and waits until it and every
// component it started are gone.
func (u *upProcess) stopAndCheckNoLeftovers(t *testing.T, sig syscall.Signal) {
	t.Helper()
	kids := children(t, u.cmd.Process.Pid)
	if len(kids) < 3 {
		t.Fatalf("marina up has %d child processes, want etcd, kube-apiserver and kube-controller-manager", len(kids))
	}
	if err := u.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-u.done:
	case <-time.After(time.Minute):
		t.Fatalf("marina up did not exit within a minute of %v", sig)
	}
	if sig == syscall.SIGTERM && u.cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("marina up exited with %d after SIGTERM, want 0:\n%s", u.cmd.ProcessState.ExitCode(), u.out)
	}
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		for _, pid := range kids {
			if alive(pid) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		for _, pid := range kids {
			if alive(pid) {
				t.Errorf("component pid %d outlived marina up after %v", pid, sig)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// The README's main job: marina up brings up a management plane a kubectl
// user can work with, keeps its objects across restarts, and leaves nothing
// running when it is stopped, gracefully or not.
func TestUpServesKeepsObjectsAndLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	stateDir := t.TempDir()
	u := startUp(t, stateDir)

	st, err := os.Stat(filepath.Join(stateDir, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("admin.kubeconfig mode %v, want 0600", st.Mode().Perm())
	}
	if out, err := u.kubectl(t, "get", "namespaces", "-o", "name"); err != nil || !strings.Contains(out, "namespace/default") {
		t.Fatalf("kubectl get namespaces: %v\n%s", err, out)
	}
	want, err := crds.Load()
	if err != nil {
		t.Fatal(err)
	}
	out, err := u.kubectl(t, "get", "crds", "-o", "name")
	if err != nil {
		t.Fatalf("kubectl get crds: %v\n%s", err, out)
	}
	for _, crd := range want {
		if !strings.Contains(out, "customresourcedefinition.apiextensions.k8s.io/"+crd.Name) {
			t.Errorf("CRD %s is not installed; installed:\n%s", crd.Name, out)
		}
	}
	// The controllers publish what the local provider can run (marina
	// upgrade plan reads it): the releases of the bin dir.
	testenv.Eventually(t, 30*time.Second, "marina-system/marina-capabilities published", func() error {
		out, err := u.kubectl(t, "-n", "marina-system", "get", "configmap", "marina-capabilities", "-o", "jsonpath={.data.providers}")
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		for _, want := range []string{"name: local", "- v1.36.3", "- v1.37.2"} {
			if !strings.Contains(out, want) {
				return fmt.Errorf("it does not say %q:\n%s", want, out)
			}
		}
		return nil
	})
	if out, err := u.kubectl(t, "create", "namespace", "kept"); err != nil {
		t.Fatalf("kubectl create namespace: %v\n%s", err, out)
	}
	u.stopAndCheckNoLeftovers(t, syscall.SIGTERM)

	u = startUp(t, stateDir)
	if out, err := u.kubectl(t, "get", "namespace", "kept"); err != nil {
		t.Errorf("namespace created before the restart is gone: %v\n%s", err, out)
	}
	// Even a kill -9 of marina must take its components down with it.
	u.stopAndCheckNoLeftovers(t, syscall.SIGKILL)
}

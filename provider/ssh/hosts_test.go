package ssh_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"marina.dev/marina/internal/testenv"
	sshprov "marina.dev/marina/provider/ssh"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	code := testenv.Run(m, &env)
	if marinaDir != "" {
		_ = os.RemoveAll(marinaDir) // the marina binary the tests built
	}
	os.Exit(code)
}

// hostSet is a set of real sshd hosts started by tools/ssh-hosts, in
// network namespaces this test makes (prefix mstest, 10.78.0.0/24).
type hostSet struct {
	dir    string // the tool's state directory: the client key, the hosts' dirs
	secret *corev1.Secret
	hosts  *corev1.ConfigMap
}

// startHosts starts n hosts for the test and stops them at its end.
func startHosts(t *testing.T, n int) *hostSet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("tools/ssh-hosts needs root (network namespaces, sshd)")
	}
	dir := filepath.Join(t.TempDir(), "hosts")
	tool := filepath.Join(env.RepoRoot, "tools", "ssh-hosts")
	toolEnv := append(os.Environ(), "MARINA_SSH_HOSTS_DIR="+dir, "MARINA_SSH_HOSTS_PREFIX=mstest", "MARINA_SSH_HOSTS_NET=10.78.0")
	cmd := exec.Command(tool, "up", fmt.Sprint(n))
	cmd.Env = toolEnv
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	t.Cleanup(func() {
		down := exec.Command(tool, "down")
		down.Env = toolEnv
		if out, err := down.CombinedOutput(); err != nil {
			t.Errorf("tools/ssh-hosts down: %v\n%s", err, out)
		}
	})
	if err != nil {
		t.Fatalf("tools/ssh-hosts up %d: %v\n%s", n, err, stderr.String())
	}
	hs := &hostSet{dir: dir}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		if strings.Contains(doc, "kind: Secret") {
			hs.secret = &corev1.Secret{}
			err = yaml.Unmarshal([]byte(doc), hs.secret)
		} else {
			hs.hosts = &corev1.ConfigMap{}
			err = yaml.Unmarshal([]byte(doc), hs.hosts)
		}
		if err != nil {
			t.Fatalf("decoding the manifests of tools/ssh-hosts: %v\n%s", err, doc)
		}
	}
	if hs.secret == nil || hs.hosts == nil {
		t.Fatalf("tools/ssh-hosts printed no Secret or ConfigMap:\n%s", out)
	}
	return hs
}

// apply creates the hosts' Secret and ConfigMap in ns.
func (hs *hostSet) apply(t *testing.T, ns string) {
	t.Helper()
	for _, o := range []client.Object{hs.secret.DeepCopy(), hs.hosts.DeepCopy()} {
		o.SetNamespace(ns)
		if err := env.Client.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
}

// ssh runs a command on host i (1-based) as root, with the test's key,
// and returns its stdout.
func (hs *hostSet) ssh(t *testing.T, i int, command string) string {
	t.Helper()
	out, err := hs.sshCommand(i, command).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("ssh host %d %q: %v\n%s%s", i, command, err, out, stderr)
	}
	return string(out)
}

// sshCombined is ssh returning stdout and stderr.
func (hs *hostSet) sshCombined(t *testing.T, i int, command string) string {
	t.Helper()
	out, err := hs.sshCommand(i, command).CombinedOutput()
	if err != nil {
		t.Fatalf("ssh host %d %q: %v\n%s", i, command, err, out)
	}
	return string(out)
}

func (hs *hostSet) sshCommand(i int, command string) *exec.Cmd {
	return exec.Command("ssh", "-q", "-o", "BatchMode=yes", "-o", "UserKnownHostsFile="+filepath.Join(hs.dir, "known_hosts"),
		"-i", filepath.Join(hs.dir, "id_ed25519"), fmt.Sprintf("root@10.78.0.%d", 10+i), command)
}

// noisyShell gives host i (1-based) a ~/.bashrc that writes a warning to
// stderr in every session, as bash runs it for commands sent over SSH.
func (hs *hostSet) noisyShell(t *testing.T, i int) {
	t.Helper()
	rc := filepath.Join(hs.dir, fmt.Sprintf("host-%d", i), "home", ".bashrc")
	if err := os.WriteFile(rc, []byte("echo 'warning: a start-up file of this host writes to stderr' >&2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := hs.sshCombined(t, i, "true"); !strings.Contains(out, "warning: a start-up file") {
		t.Fatalf("host %d's shell does not run its ~/.bashrc for SSH commands (got %q): the test would prove nothing", i, out)
	}
}

func hostAddr(i int) string { return fmt.Sprintf("10.78.0.%d:22", 10+i) }

var (
	marinaOnce sync.Once
	marinaDir  string
	marinaPath string
	marinaErr  error
)

// marina builds the marina binary, the agent the provider copies to hosts.
func marina(t *testing.T) string {
	t.Helper()
	marinaOnce.Do(func() {
		marinaDir, marinaErr = os.MkdirTemp("", "ssh-provider-test-")
		if marinaErr != nil {
			return
		}
		marinaPath, marinaErr = testenv.BuildMarina(marinaDir)
	})
	if marinaErr != nil {
		t.Fatal(marinaErr)
	}
	return marinaPath
}

func newProvider(t *testing.T, stateDir string) *sshprov.Provider {
	t.Helper()
	binDir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	p, err := sshprov.New(sshprov.Options{StateDir: stateDir, AgentBinary: marina(t), BinDir: binDir, Client: env.Client, AgentStartTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func uid(s string) types.UID { return types.UID("00000000-0000-0000-0000-" + s) }

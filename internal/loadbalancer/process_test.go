package loadbalancer

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"marina.dev/marina/internal/testenv"
)

// TestMain makes the test binary a balancer process when run as
// "load-balancer --dir DIR", as marina's subcommand of that name is, so
// that the process tests need not build marina.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "load-balancer" {
		os.Exit(runHelper(os.Args[2:]))
	}
	os.Exit(m.Run())
}

func runHelper(args []string) int {
	fs := flag.NewFlagSet("load-balancer", flag.ContinueOnError)
	dir := fs.String("dir", "", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Started detached, it would outlive a test binary that crashed before
	// its cleanup: a lifetime bounds it.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ctx = klog.NewContext(ctx, textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(1))))
	if err := RunDir(ctx, *dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func TestProcess(t *testing.T) {
	p := newTestPKI(t)
	b0, b1 := newBackend(t, p, "b0", true), newBackend(t, p, "b1", true)
	dir := t.TempDir()
	listen := "127.0.0.1:" + strconv.Itoa(testenv.FreePorts(t, 1))
	cfg := FileConfig{
		Listen:        listen,
		Backends:      []string{b0.addr},
		Interval:      metav1.Duration{Duration: 50 * time.Millisecond},
		FailThreshold: 2,
		RiseThreshold: 1,
		Drain:         metav1.Duration{Duration: 100 * time.Millisecond},
	}
	withCert := TLSFiles{CA: p.caPEM, ClientCert: p.clientPEM, ClientKey: p.clientKey}
	if err := WriteDir(dir, cfg, withCert); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{ConfigFile, CAFile, ClientCertFile, ClientKeyFile} {
		if info, err := os.Stat(filepath.Join(dir, name)); err != nil || info.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v; want mode 0600", name, info.Mode(), err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	command := []string{self, "load-balancer"}
	ctx := context.Background()

	pid, err := Start(ctx, dir, command, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Stop(ctx, dir, 5*time.Second); err != nil {
			t.Errorf("stopping the balancer: %v", err)
		}
		if t.Failed() {
			t.Logf("last lines of its log:\n%s", tail(dir))
		}
	})
	if addr, err := Address(dir); err != nil || addr != listen {
		t.Errorf("Address = %q, %v; want %s", addr, err, listen)
	}
	c := client(p)
	waitFor(t, 5*time.Second, "b0 serving through the balancer process", servedBy(c, listen, "b0"))

	t.Log("a second start on the same directory refuses")
	if _, err := Start(ctx, dir, command, 10*time.Second); !IsRunning(err) {
		t.Errorf("second Start: %v, want ErrRunning", err)
	}
	out, err := exec.Command(self, "load-balancer", "--dir", dir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), ErrRunning.Error()) {
		t.Errorf("a second balancer run directly: %v, %s; want it to exit on the lock", err, out)
	}
	waitFor(t, 5*time.Second, "the first one still serving", servedBy(c, listen, "b0"))

	t.Log("it follows a change of backends")
	cfg.Backends = []string{b1.addr}
	if err := WriteDir(dir, cfg, withCert); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "b1 serving", servedBy(c, listen, "b1"))

	t.Log("and of TLS material: without the client certificate the checks fail")
	if err := WriteDir(dir, cfg, TLSFiles{CA: p.caPEM}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "connections refused", refused(p, listen))
	if err := WriteDir(dir, cfg, withCert); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "b1 serving again", servedBy(c, listen, "b1"))

	t.Log("a client key others can read is refused, and the last good config kept")
	if err := os.Chmod(filepath.Join(dir, ClientKeyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the refusal logged", func() error {
		if !strings.Contains(tail(dir), "readable by others") {
			return errors.New("not in the log yet")
		}
		return nil
	})
	waitFor(t, 5*time.Second, "b1 still serving", servedBy(c, listen, "b1"))

	t.Log("Stop ends it and leaves nothing behind")
	if err := Stop(ctx, dir, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	assertGone(t, dir, pid, listen)
	if _, err := os.Stat(filepath.Join(dir, AddressFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left behind: %v", AddressFile, err)
	}
	assertNoKeyInLog(t, dir, p.clientKey)
	// Nothing else written: no copy of the key, no temporary file.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{CAFile, ClientCertFile, ClientKeyFile, ConfigFile, LockFile, LogFile, PIDFile}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("the directory holds %v, want %v", names, want)
	}

	t.Log("killed with SIGKILL by its PID, it leaves nothing either, and starts again")
	if err := os.Chmod(filepath.Join(dir, ClientKeyFile), 0o600); err != nil {
		t.Fatal(err)
	}
	pid, err = Start(ctx, dir, command, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "b1 serving after a restart", servedBy(c, listen, "b1"))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	assertGone(t, dir, pid, listen)
	if _, err = Start(ctx, dir, command, 10*time.Second); err != nil {
		t.Fatalf("starting again after SIGKILL: %v", err)
	}
	waitFor(t, 5*time.Second, "b1 serving after SIGKILL and a start", servedBy(c, listen, "b1"))
	assertNoKeyInLog(t, dir, p.clientKey)
}

func TestStartRefusesABadConfig(t *testing.T) {
	p := newTestPKI(t)
	dir := t.TempDir()
	cfg := FileConfig{Listen: "127.0.0.1:" + strconv.Itoa(testenv.FreePorts(t, 1))}
	if err := WriteDir(dir, cfg, TLSFiles{CA: p.caPEM, ClientCert: p.clientPEM, ClientKey: p.clientKey}); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, ClientKeyFile), 0o640); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	_, err = Start(context.Background(), dir, []string{self, "load-balancer"}, 10*time.Second)
	if err == nil {
		_ = Stop(context.Background(), dir, 5*time.Second)
		t.Fatal("a balancer started with a client key readable by its group")
	}
	if !strings.Contains(err.Error(), "readable by others") {
		t.Errorf("Start: %v; want the reason from its log", err)
	}
	if running, _ := Running(dir); running {
		t.Error("the lock is held after a failed start")
	}
	if err := Stop(context.Background(), dir, time.Second); err != nil {
		t.Errorf("Stop with nothing running: %v", err)
	}

	if err := WriteDir(dir, FileConfig{Listen: "nowhere"}, TLSFiles{CA: p.caPEM}); err == nil {
		t.Error("WriteDir accepted a listen address without a port")
	}
	if err := WriteDir(dir, cfg, TLSFiles{CA: p.caPEM, ClientKey: p.clientKey}); err == nil {
		t.Error("WriteDir accepted a client key without its certificate")
	}
}

// servedBy checks that a new connection to addr reaches the backend name.
func servedBy(c *http.Client, addr, name string) func() error {
	return func() error {
		got, err := whoami(c, addr)
		if err != nil {
			return err
		}
		if got != name {
			return fmt.Errorf("served by %s", got)
		}
		return nil
	}
}

func refused(p *testPKI, addr string) func() error {
	return func() error {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, &tls.Config{RootCAs: p.pool, MinVersion: tls.VersionTLS12})
		if err == nil {
			conn.Close()
			return errors.New("a connection went through")
		}
		return nil
	}
}

// assertGone checks that the balancer process pid ended, let go of its
// lock and of its listening socket.
func assertGone(t *testing.T, dir string, pid int, listen string) {
	t.Helper()
	waitFor(t, 5*time.Second, "the process gone", func() error {
		// Start's goroutine reaps it: no zombie keeps the PID.
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("pid %d: kill 0: %v", pid, err)
		}
		return nil
	})
	if running, err := Running(dir); err != nil || running {
		t.Errorf("Running = %v, %v after the process ended", running, err)
	}
	if c, err := net.DialTimeout("tcp", listen, time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections", listen)
	}
}

// assertNoKeyInLog checks that the log holds no line of the client key.
func assertNoKeyInLog(t *testing.T, dir string, keyPEM []byte) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, LogFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range bytes.Split(keyPEM, []byte("\n")) {
		if len(line) > 16 && !bytes.HasPrefix(line, []byte("-----")) && bytes.Contains(data, line) {
			t.Fatalf("the log holds a line of the client key")
		}
	}
}

func tail(dir string) string {
	data, _ := os.ReadFile(filepath.Join(dir, LogFile))
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}

// Issue 25: a balancer whose directory is removed under it (a state
// directory deleted by hand) exits and frees its address, rather than
// serve for ever with nothing left to stop it.
func TestBalancerExitsWhenItsDirectoryGoes(t *testing.T) {
	p := newTestPKI(t)
	dir := filepath.Join(t.TempDir(), "endpoint")
	listen := "127.0.0.1:" + strconv.Itoa(testenv.FreePorts(t, 1))
	if err := WriteDir(dir, FileConfig{Listen: listen}, TLSFiles{CA: p.caPEM, ClientCert: p.clientPEM, ClientKey: p.clientKey}); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := Start(context.Background(), dir, []string{self, "load-balancer"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the balancer to exit", func() error {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("pid %d still there (%v)", pid, err)
		}
		return nil
	})
	l, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatalf("the balancer's address is still taken: %v", err)
	}
	l.Close()
}

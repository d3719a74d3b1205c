package components

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"marina.dev/marina/internal/manifest"
	"marina.dev/marina/internal/testenv"
)

// superviseEnv makes the test binary a bare Supervisor of the sandbox it
// names, for the test that kills the supervising process.
const superviseEnv = "MARINA_COMPONENTS_TEST_SUPERVISE"

func TestMain(m *testing.M) {
	if dir := os.Getenv(superviseEnv); dir != "" {
		_ = New(dir, Options{}).Run(context.Background())
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// proc is one process, told apart from a later one with the same PID by
// its start time.
type proc struct {
	pid   int
	start uint64 // clock ticks since boot
}

// procStat returns a process's state letter and start time from /proc.
func procStat(pid int) (state byte, start uint64, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces: state is the first, starttime the 20th.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	start, err = strconv.ParseUint(f[19], 10, 64)
	return f[0][0], start, err
}

func procOf(t *testing.T, pid int) proc {
	t.Helper()
	_, start, err := procStat(pid)
	if err != nil {
		t.Fatalf("process %d: %v", pid, err)
	}
	return proc{pid: pid, start: start}
}

// alive reports whether p still runs: a zombie has ended.
func (p proc) alive() bool {
	state, start, err := procStat(p.pid)
	return err == nil && start == p.start && state != 'Z'
}

// startedAt is when p started, in seconds since boot.
func (p proc) startedAt() float64 { return float64(p.start) / 100 } // USER_HZ is 100 on Linux

// uptime is the time since boot, in the clock of startedAt.
func uptime(t *testing.T) float64 {
	data, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	up, err := strconv.ParseFloat(strings.Fields(string(data))[0], 64)
	if err != nil {
		t.Fatal(err)
	}
	return up
}

// killLeftovers makes sure no process a test saw outlives it, whatever the
// test's outcome.
func killLeftovers(t *testing.T, procs *[]proc) {
	t.Cleanup(func() {
		for _, p := range *procs {
			if p.alive() {
				t.Errorf("process %d outlived the test", p.pid)
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
			}
		}
	})
}

// syncBuffer is a log sink the supervisor and the test share.
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

// harness is a Supervisor running on a test's own sandbox.
type harness struct {
	t     *testing.T
	dir   string
	s     *Supervisor
	log   *syncBuffer
	procs []proc // every component process seen
	stop  func() time.Duration
}

// supervise starts a Supervisor on a fresh sandbox; the test's cleanup
// stops it and checks that no component process is left.
func supervise(t *testing.T, opts Options) *harness {
	h := &harness{t: t, dir: t.TempDir(), log: &syncBuffer{}}
	h.s = New(h.dir, opts)
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(h.log), textlogger.Verbosity(4)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	done := make(chan error, 1)
	go func() { done <- h.s.Run(ctx) }()
	var once sync.Once
	var took time.Duration
	h.stop = func() time.Duration {
		once.Do(func() {
			start := time.Now()
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("Run did not return 30s after its context ended")
			}
			took = time.Since(start)
		})
		return took
	}
	killLeftovers(t, &h.procs)
	t.Cleanup(func() { h.stop() })
	return h
}

func (h *harness) write(name string, m *manifest.Manifest) {
	h.t.Helper()
	if err := manifest.Write(h.dir, name, m); err != nil {
		h.t.Fatal(err)
	}
}

// waitFor polls the status file of component name until cond accepts it.
func (h *harness) waitFor(name, what string, cond func(*Status) error) *Status {
	h.t.Helper()
	return waitForStatus(h.t, h.dir, name, what, cond)
}

func waitForStatus(t *testing.T, dir, name, what string, cond func(*Status) error) *Status {
	t.Helper()
	var st *Status
	testenv.Eventually(t, 15*time.Second, name+": "+what, func() error {
		s, err := ReadStatus(dir, name)
		if err != nil {
			return err
		}
		st = s
		return cond(s)
	})
	return st
}

// running accepts a Running status other than the PIDs in not.
func running(not ...int) func(*Status) error {
	return func(s *Status) error {
		if s.State != Running {
			return fmt.Errorf("state %s", s.State)
		}
		for _, pid := range not {
			if s.PID == pid {
				return fmt.Errorf("still PID %d", pid)
			}
		}
		return nil
	}
}

// waitRunning waits for name to run (as another process than those in
// not) and for its shell to have exec'd the program, and records it.
func (h *harness) waitRunning(name string, not ...int) (*Status, proc) {
	h.t.Helper()
	st := h.waitFor(name, "running", running(not...))
	p := procOf(h.t, st.PID)
	h.procs = append(h.procs, p)
	waitExec(h.t, p)
	return st, p
}

// waitExec waits until a sleeper's shell has installed its traps and
// exec'd sleep, so that a signal meets the program, not the shell.
func waitExec(t *testing.T, p proc) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, "process exec'd sleep", func() error {
		comm, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/comm")
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(comm)) != "sleep" {
			return fmt.Errorf("process %d is %q", p.pid, strings.TrimSpace(string(comm)))
		}
		return nil
	})
}

func waitGone(t *testing.T, what string, ps ...proc) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, what, func() error {
		for _, p := range ps {
			if p.alive() {
				return fmt.Errorf("process %d is alive", p.pid)
			}
		}
		return nil
	})
}

// sleeper is a component that runs until it is signalled. tag tells its
// manifests apart (it is the shell's $0) without changing what runs.
func sleeper(version, tag string) *manifest.Manifest {
	return &manifest.Manifest{Version: version, Binary: "/bin/sh", Args: []string{"-c", "exec sleep 300", tag}}
}

// stubborn is a sleeper that ignores SIGTERM.
func stubborn(version string) *manifest.Manifest {
	return &manifest.Manifest{Version: version, Binary: "/bin/sh", Args: []string{"-c", "trap '' TERM; exec sleep 300"}}
}

func notExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

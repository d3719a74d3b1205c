package process

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses, which may hold spaces.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

func waitGone(t *testing.T, pid int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still alive after %s", pid, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestStopEscalatesToSIGKILLAfterGrace(t *testing.T) {
	dir := t.TempDir()
	s := NewSpawner()
	defer s.Close()
	for _, tc := range []struct {
		name   string
		script string
		min    time.Duration // the stop takes at least this long
		max    time.Duration // and at most this long
	}{
		{name: "honours SIGTERM", script: "exec sleep 60", max: 900 * time.Millisecond},
		{name: "ignores SIGTERM", script: "trap '' TERM; exec sleep 60", min: time.Second, max: 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := filepath.Join(dir, tc.name+".log")
			c, err := s.Start(Spec{Name: "sleeper", Version: "v1", Binary: "/bin/sh", Args: []string{"-c", tc.script}, LogPath: log})
			if err != nil {
				t.Fatal(err)
			}
			if c.Exited() || !alive(c.PID()) {
				t.Fatalf("child %d is not running", c.PID())
			}
			// Let the shell install its trap and exec before signalling it.
			time.Sleep(200 * time.Millisecond)
			start := time.Now()
			if err := c.Stop(time.Second); err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			if took < tc.min || took > tc.max {
				t.Errorf("Stop took %s, want between %s and %s", took, tc.min, tc.max)
			}
			waitGone(t, c.PID(), time.Second)
			if c.ProcessState() == nil || c.ExitedAt().IsZero() {
				t.Errorf("no exit state after Stop")
			}
			fi, err := os.Stat(log)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("log mode %v, want 0600", fi.Mode().Perm())
			}
			if err := c.Stop(time.Second); err != nil {
				t.Errorf("stopping again: %v", err)
			}
		})
	}
}

func TestExitErrorHasLogTailButNoArgs(t *testing.T) {
	dir := t.TempDir()
	s := NewSpawner()
	defer s.Close()
	log := filepath.Join(dir, "c.log")
	c, err := s.Start(Spec{
		Name: "failing", Version: "v9", Binary: "/bin/sh",
		Args:    []string{"-c", "echo \"cannot bind $WHERE\" >&2; exit 3", "--token=s3cret"},
		Env:     []string{"WHERE=127.0.0.1:1"},
		LogPath: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	var exit *exec.ExitError
	if err := c.Wait(); !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("exit status %v, want code 3", err)
	}
	msg := c.ExitError().Error()
	for _, want := range []string{"failing", "exit status 3", "cannot bind 127.0.0.1:1"} {
		if !strings.Contains(msg, want) {
			t.Errorf("exit error %q does not contain %q", msg, want)
		}
	}
	data, _ := os.ReadFile(log)
	if !strings.Contains(string(data), "starting failing v9") {
		t.Errorf("log has no start line with name and version:\n%s", data)
	}
	if strings.Contains(msg+string(data), "s3cret") {
		t.Errorf("an argument leaked into the error or the log:\n%s\n%s", msg, data)
	}
}

func TestStartErrorNamesTheBinary(t *testing.T) {
	s := NewSpawner()
	defer s.Close()
	_, err := s.Start(Spec{Name: "ghost", Binary: "/nonexistent/ghost", LogPath: filepath.Join(t.TempDir(), "g.log")})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/ghost") {
		t.Fatalf("error %v does not name the binary", err)
	}
}

// Closing the spawner ends its thread, and the parent-death signal takes
// down a child still running: the same path as the parent process dying.
func TestCloseKillsChildrenThroughParentDeathSignal(t *testing.T) {
	s := NewSpawner()
	c, err := s.Start(Spec{Name: "orphan", Binary: "/bin/sh", Args: []string{"-c", "trap '' TERM; exec sleep 60"}, LogPath: filepath.Join(t.TempDir(), "o.log")})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if !c.Exited() {
			_ = syscall.Kill(c.PID(), syscall.SIGKILL)
		}
	}()
	s.Close()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the child outlived its spawner's thread")
	}
	if ws, ok := c.ProcessState().Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Errorf("child ended with %v, want SIGKILL", c.ProcessState())
	}
	if _, err := s.Start(Spec{Name: "late", Binary: "/bin/true", LogPath: filepath.Join(t.TempDir(), "l.log")}); err == nil {
		t.Error("Start after Close succeeded")
	}
}

// With one P, a new goroutine often runs on the process's main thread,
// which the runtime never ends: a spawner locked there would never let its
// children get the parent-death signal. Each spawner must serve from
// another thread (this failed before it did).
func TestSpawnersNeverServeFromTheMainThread(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for i := range 10 {
		s := NewSpawner()
		c, err := s.Start(Spec{Name: "orphan", Binary: "/bin/sh", Args: []string{"-c", "trap '' TERM; exec sleep 60"}, LogPath: filepath.Join(t.TempDir(), "o.log")})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(c.PID(), syscall.SIGKILL)
			t.Fatalf("spawner %d: the child outlived its spawner's thread", i)
		}
	}
}

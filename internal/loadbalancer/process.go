package loadbalancer

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
	"syscall"
	"time"

	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/flock"
)

// ErrRunning says a balancer already runs in the directory: it holds the
// directory's lock.
var ErrRunning = errors.New("a load balancer already runs in this directory")

// IsRunning reports whether err says a balancer already runs.
func IsRunning(err error) bool { return errors.Is(err, ErrRunning) }

// lockDir takes dir's lock (see package flock): a second balancer for the
// directory gets an error wrapping ErrRunning after wait.
func lockDir(dir string, wait time.Duration) (*os.File, error) {
	f, err := flock.Lock(filepath.Join(dir, LockFile), wait)
	if errors.Is(err, flock.ErrHeld) {
		return nil, fmt.Errorf("%w (%v)", ErrRunning, err)
	}
	return f, err
}

// Running reports whether a balancer runs in dir: whether its lock is held.
func Running(dir string) (bool, error) { return flock.Held(filepath.Join(dir, LockFile)) }

// Address returns the address the balancer of dir listens on, once it
// listens.
func Address(dir string) (string, error) {
	data, err := os.ReadFile(filepath.Join(dir, AddressFile))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}

// Start runs command, with "--dir DIR" appended (for example marina's
// path and "load-balancer"), as the balancer of dir: detached in its own
// session, so that it outlives the caller and no signal to the caller's
// process group reaches it, with an environment of PATH alone, and its
// output appended to LogFile. It records the PID in PIDFile and returns
// it once the balancer listens, or an error with the log's last lines if
// it exits first or timeout passes (then it is killed). Write its
// configuration with WriteDir first. It fails with an error wrapping
// ErrRunning when a balancer already runs in dir.
//
// If ctx ends first Start returns ctx's error and leaves the process be:
// it may still come up, and Running finds it then.
func Start(ctx context.Context, dir string, command []string, timeout time.Duration) (int, error) {
	if len(command) == 0 {
		return 0, errors.New("starting a load balancer: no command")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return 0, err
	}
	if running, err := Running(dir); err != nil {
		return 0, err
	} else if running {
		return 0, fmt.Errorf("starting the load balancer of %s: %w", dir, ErrRunning)
	}
	// The last one's, killed before it could remove it.
	if err := os.Remove(filepath.Join(dir, AddressFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	logPath := filepath.Join(dir, LogFile)
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(logFile, "==== %s: starting the load balancer\n", time.Now().UTC().Format(time.RFC3339))
	args := append(append([]string(nil), command[1:]...), "--dir", dir)
	cmd := exec.Command(command[0], args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Nothing of the caller's environment (a KUBECONFIG, credentials, an
	// HTTPS_PROXY) reaches it: it needs its directory only.
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	logFile.Close()
	if err != nil {
		return 0, fmt.Errorf("starting %s: %w", command[0], err)
	}
	exited := make(chan struct{})
	go func() {
		// Reap it when it ends, so that no zombie keeps its PID.
		_ = cmd.Wait()
		close(exited)
	}()
	pid := cmd.Process.Pid
	if err := files.WriteAtomic(filepath.Join(dir, PIDFile), []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		_ = cmd.Process.Kill()
		return 0, err
	}

	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		// The address is written after the lock is taken; both, in case
		// a stray process wrote the address.
		if _, err := Address(dir); err == nil {
			if running, err := Running(dir); err != nil {
				return 0, err
			} else if running {
				return pid, nil
			}
		}
		select {
		case <-exited:
			return 0, fmt.Errorf("the load balancer of %s exited at start (%v); last lines of %s:\n%s", dir, cmd.ProcessState, logPath, files.Tail(logPath, 10))
		case <-deadline.C:
			_ = signalGroup(pid, syscall.SIGKILL)
			return 0, fmt.Errorf("the load balancer of %s did not listen within %s; last lines of %s:\n%s", dir, timeout, logPath, files.Tail(logPath, 10))
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
}

// Stop stops the balancer of dir, if one runs: SIGTERM to the process that
// holds its lock, found by PIDFile (or, if that is stale, by its command
// line), then SIGKILL after timeout. It returns once the lock is free.
func Stop(ctx context.Context, dir string, timeout time.Duration) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	running, err := Running(dir)
	if err != nil || !running {
		return err
	}
	pid := balancerPID(dir)
	if pid == 0 {
		return fmt.Errorf("a load balancer holds the lock of %s, but no process with --dir %s is visible to stop: "+
			"stop the process holding %s (fuser names it)", dir, dir, filepath.Join(dir, LockFile))
	}
	if err := signalGroup(pid, syscall.SIGTERM); err != nil {
		return err
	}
	if released, err := waitReleased(ctx, dir, timeout); err != nil || released {
		return err
	}
	if err := signalGroup(pid, syscall.SIGKILL); err != nil {
		return err
	}
	if released, err := waitReleased(ctx, dir, 5*time.Second); err != nil || released {
		return err
	}
	return fmt.Errorf("the load balancer of %s (pid %d) still holds its lock after SIGKILL", dir, pid)
}

// signalGroup sends sig to pid, and to its process group when it leads one
// (Start makes it a session leader), so that a wrapper's children go too.
func signalGroup(pid int, sig syscall.Signal) error {
	target := pid
	if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid {
		target = -pid
	}
	if err := syscall.Kill(target, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("sending %s to load balancer %d: %w", sig, pid, err)
	}
	return nil
}

// waitReleased polls until dir's lock is free, for at most timeout.
func waitReleased(ctx context.Context, dir string, timeout time.Duration) (bool, error) {
	deadline := time.Now().Add(timeout)
	for {
		running, err := Running(dir)
		if err != nil {
			return false, err
		}
		if !running {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// balancerPID is the PID of the balancer of dir, or 0: the recorded PID if
// that process's command line names dir (a PID file can outlive its
// process, and PIDs are reused), else the process found in /proc.
func balancerPID(dir string) int {
	if data, err := os.ReadFile(filepath.Join(dir, PIDFile)); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && pid > 0 && runsDir(pid, dir) {
			return pid
		}
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && runsDir(pid, dir) {
			return pid
		}
	}
	return 0
}

// runsDir reports whether process pid was started with --dir dir.
func runsDir(pid int, dir string) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(string(bytes.TrimRight(data, "\x00")), "\x00")
	for i, a := range args {
		if a == "--dir="+dir || (a == "--dir" && i+1 < len(args) && args[i+1] == dir) {
			return true
		}
	}
	return false
}

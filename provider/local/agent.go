package local

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
	"marina.dev/marina/internal/nodeagent/sandbox"
)

// The flags naming what an agent process runs: one sandbox, or a pool.
const (
	sandboxFlag = "--sandbox"
	poolFlag    = "--pool"
)

// startAgent starts the agent of dir (flag: a sandbox or a pool) detached
// (its own session, output to agent.log), records its PID, and waits until
// it holds dir's lock.
func (p *Provider) startAgent(ctx context.Context, dir, flag string) error {
	logPath := filepath.Join(dir, sandbox.LogFile)
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(logFile, "==== %s: starting the node agent\n", time.Now().UTC().Format(time.RFC3339))
	args := append(append([]string(nil), p.opts.AgentCommand[1:]...), flag, dir)
	cmd := exec.Command(p.opts.AgentCommand[0], args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Nothing of the controller's environment (a KUBECONFIG, cloud
	// credentials) reaches the agent: it needs its sandbox only.
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	// Its own session: no signal sent to the controller's process group or
	// terminal reaches it, and it outlives the controller.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	logFile.Close()
	if err != nil {
		return fmt.Errorf("starting %s: %w", p.opts.AgentCommand[0], err)
	}
	exited := make(chan struct{})
	go func() {
		// Reap it when it ends, so that no zombie keeps its PID.
		_ = cmd.Wait()
		close(exited)
	}()
	pid := cmd.Process.Pid
	if err := files.WriteAtomic(filepath.Join(dir, sandbox.PIDFile), []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		_ = cmd.Process.Kill()
		return err
	}

	deadline := time.NewTimer(p.opts.AgentStartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		held, err := sandbox.Held(dir)
		if err != nil {
			return err
		}
		if held {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("the agent exited at start (%v); last lines of %s:\n%s", cmd.ProcessState, logPath, files.Tail(logPath, 10))
		case <-deadline.C:
			_ = cmd.Process.Kill()
			return fmt.Errorf("the agent did not take its lock within %s; last lines of %s:\n%s", p.opts.AgentStartTimeout, logPath, files.Tail(logPath, 10))
		case <-ctx.Done():
			// The agent may still come up: the next Create will find it.
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// stopAgent stops the agent of dir, if one runs: SIGTERM, then SIGKILL
// after AgentStopTimeout. It returns once the lock is free.
func (p *Provider) stopAgent(ctx context.Context, dir string) error {
	held, err := sandbox.Held(dir)
	if err != nil || !held {
		return err
	}
	pid := p.agentPID(dir)
	if pid == 0 {
		return fmt.Errorf("an agent holds the lock of sandbox %s, but no process with --sandbox %s is visible to stop: "+
			"stop the process holding %s/agent.lock (fuser %s/agent.lock names it), and deletion resumes", dir, dir, dir, dir)
	}
	if err := signalAgent(pid, syscall.SIGTERM); err != nil {
		return err
	}
	if released, err := waitReleased(ctx, dir, p.opts.AgentStopTimeout); err != nil || released {
		return err
	}
	if err := signalAgent(pid, syscall.SIGKILL); err != nil {
		return err
	}
	if released, err := waitReleased(ctx, dir, 5*time.Second); err != nil || released {
		return err
	}
	return fmt.Errorf("the agent of sandbox %s (pid %d) still holds its lock after SIGKILL", dir, pid)
}

// signalAgent sends sig to the agent, and to its process group when it leads
// one (it does, being a session leader), so that a wrapper's children go too.
func signalAgent(pid int, sig syscall.Signal) error {
	target := pid
	if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid {
		target = -pid
	}
	if err := syscall.Kill(target, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("sending %s to agent %d: %w", sig, pid, err)
	}
	return nil
}

// waitReleased polls until dir's agent lock is free, for at most timeout.
func waitReleased(ctx context.Context, dir string, timeout time.Duration) (bool, error) {
	deadline := time.Now().Add(timeout)
	for {
		held, err := sandbox.Held(dir)
		if err != nil {
			return false, err
		}
		if !held {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// agentPID is the PID of the process running the agent of dir, or 0: the
// recorded PID if that process's command line names dir (a PID file can
// outlive its process, and PIDs are reused), else the result of a search.
// A pooled machine's is its pool's.
func (p *Provider) agentPID(dir string) int {
	if poolDir, err := poolOf(dir); err == nil && poolDir != "" {
		dir = poolDir
	}
	if pid := recordedPID(dir); pid > 0 && runsSandbox(pid, dir) {
		return pid
	}
	return findAgent(dir)
}

// repairPIDFile records the running agent's PID if agent.pid is missing or
// stale (a crash between the start and the write). Best effort: Delete
// searches for the agent anyway.
func (p *Provider) repairPIDFile(dir string) {
	if pid := recordedPID(dir); pid > 0 && runsSandbox(pid, dir) {
		return
	}
	if pid := findAgent(dir); pid > 0 {
		_ = files.WriteAtomic(filepath.Join(dir, sandbox.PIDFile), []byte(strconv.Itoa(pid)+"\n"), 0o600)
	}
}

func recordedPID(dir string) int {
	data, err := os.ReadFile(filepath.Join(dir, sandbox.PIDFile))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// runsSandbox reports whether process pid was started with --sandbox dir
// or --pool dir.
func runsSandbox(pid int, dir string) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(string(bytes.TrimRight(data, "\x00")), "\x00")
	for i, a := range args {
		for _, flag := range []string{sandboxFlag, poolFlag} {
			if a == flag+"="+dir || (a == flag && i+1 < len(args) && args[i+1] == dir) {
				return true
			}
		}
	}
	return false
}

// findAgent searches /proc for the process started with --sandbox dir.
func findAgent(dir string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if runsSandbox(pid, dir) {
			return pid
		}
	}
	return 0
}

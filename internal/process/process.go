// Package process starts and stops the long-running child processes marina
// supervises (the management plane's components, a control-plane machine's
// components) so that none of them outlives its parent: each child gets the
// parent-death signal, from a thread that lives exactly as long as the
// Spawner, and is stopped with SIGTERM, a grace period, then SIGKILL.
//
// A child is expected to be one process: the parent-death signal reaches the
// child, not processes the child forks itself.
package process

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"marina.dev/marina/internal/files"
)

// Spawner starts processes from a single goroutine locked to its OS thread.
// The parent-death signal (PR_SET_PDEATHSIG) fires when the *thread* that
// forked a child exits, not the process; keeping that thread alive until
// Close makes the signal mean "the parent process is gone" (or "the Spawner
// was closed with children still running").
type Spawner struct {
	reqs chan spawnReq
	quit chan struct{}
}

type spawnReq struct {
	cmd *exec.Cmd
	// netns, when set, is the network namespace file the child starts in.
	netns string
	res   chan error
}

// NewSpawner starts the spawning thread. Close it once every child it
// started has been stopped.
func NewSpawner() *Spawner {
	s := &Spawner{reqs: make(chan spawnReq), quit: make(chan struct{})}
	go func() {
		runtime.LockOSThread()
		if syscall.Gettid() != syscall.Getpid() {
			s.serve()
			return
		}
		// Locked to the process's main thread, which the runtime never
		// ends: its children would never get the signal. Serve from
		// another thread (this goroutine holds the main one until that
		// one is locked), then give the main thread back.
		locked := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			close(locked)
			s.serve()
		}()
		<-locked
		runtime.UnlockOSThread()
	}()
	return s
}

// serve starts the children from the calling goroutine, which must be
// locked to a thread other than the main one, until Close. It never
// unlocks: when it returns, its thread exits with it, and any child still
// alive receives SIGKILL.
func (s *Spawner) serve() {
	for {
		select {
		case r := <-s.reqs:
			r.res <- startIn(r.cmd, r.netns)
		case <-s.quit:
			return
		}
	}
}

// Close ends the spawning thread: a child still running receives SIGKILL.
// Start must not be called after Close.
func (s *Spawner) Close() { close(s.quit) }

// Spec says what to run.
type Spec struct {
	// Name names the child in its log and in errors, e.g. "etcd".
	Name string
	// Version, when set, is written beside Name in the log's start line.
	Version string
	// Binary is the path of the program.
	Binary string
	// Args are its arguments. They are never written to the log or to
	// errors: they may name secrets.
	Args []string
	// Env is added to the minimal environment every child gets (PATH and
	// HOME); a later entry wins.
	Env []string
	// Dir is the working directory; empty means the parent's.
	Dir string
	// LogPath receives the child's standard output and error, appended; it
	// is created with mode 0600.
	LogPath string
	// NetNS, when set, is the network namespace (a file such as
	// /run/netns/<name>) the child starts in: a real kubelet's machine
	// runs its kubelet and container runtime in its own.
	NetNS string
}

// Child is one running (or exited) child process.
type Child struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
	err     error         // the exit status; read only after done is closed
	exitAt  time.Time     // when Wait returned; read only after done is closed
}

// Start starts spec's program as a child in its own process group (so that
// a Ctrl-C in a terminal reaches the parent only, which then stops its
// children in order), with the parent-death signal set to SIGKILL.
func (s *Spawner) Start(spec Spec) (*Child, error) {
	logFile, err := os.OpenFile(spec.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening log for %s: %w", spec.Name, err)
	}
	what := spec.Name
	if spec.Version != "" {
		what += " " + spec.Version
	}
	fmt.Fprintf(logFile, "\n==== %s: starting %s\n", time.Now().Format(time.RFC3339), what)
	cmd := exec.Command(spec.Binary, spec.Args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Dir = spec.Dir
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + os.Getenv("HOME")}, spec.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	res := make(chan error)
	select {
	case s.reqs <- spawnReq{cmd: cmd, netns: spec.NetNS, res: res}:
		err = <-res
	case <-s.quit:
		err = errors.New("the spawner is closed")
	}
	if err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", spec.Name, spec.Binary, err)
	}
	c := &Child{name: spec.Name, cmd: cmd, logPath: spec.LogPath, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		c.exitAt = time.Now()
		logFile.Close()
		close(c.done)
	}()
	return c, nil
}

// Name is the Spec's Name.
func (c *Child) Name() string { return c.name }

// PID is the child's process ID.
func (c *Child) PID() int { return c.cmd.Process.Pid }

// LogPath is where the child's output goes.
func (c *Child) LogPath() string { return c.logPath }

// Done is closed when the process has exited and been reaped.
func (c *Child) Done() <-chan struct{} { return c.done }

// Exited reports whether the process has ended.
func (c *Child) Exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Wait blocks until the process has ended and returns its exit status: nil
// for exit code 0, otherwise an *exec.ExitError.
func (c *Child) Wait() error {
	<-c.done
	return c.err
}

// ExitedAt is when the process was seen to end; zero while it runs.
func (c *Child) ExitedAt() time.Time {
	if !c.Exited() {
		return time.Time{}
	}
	return c.exitAt
}

// ProcessState is the ended process's state (exit code, signal, usage);
// nil while it runs.
func (c *Child) ProcessState() *os.ProcessState {
	if !c.Exited() {
		return nil
	}
	return c.cmd.ProcessState
}

// ExitError describes an exit, with the end of the child's log, which is
// where etcd and kube-apiserver say what went wrong. Call it once Done is
// closed.
func (c *Child) ExitError() error {
	status := "exited"
	if c.Exited() && c.err != nil {
		status = c.err.Error()
	}
	return fmt.Errorf("%s %s; last lines of %s:\n%s", c.name, status, c.logPath, files.Tail(c.logPath, 15))
}

// Stop sends SIGTERM, waits up to grace, then sends SIGKILL, and returns
// once the process has ended. Stopping an exited child does nothing.
func (c *Child) Stop(grace time.Duration) error {
	if c.Exited() {
		return nil
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stopping %s: %w", c.name, err)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.done:
		return nil
	case <-t.C:
	}
	if err := c.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing %s: %w", c.name, err)
	}
	<-c.done
	return nil
}

// startIn starts cmd in network namespace netns (none: the caller's). It
// runs on the Spawner's locked thread, which enters the namespace for the
// fork alone and returns to its own before anything else runs on it: a
// child inherits the namespace of the thread that forked it.
func startIn(cmd *exec.Cmd, netns string) error {
	if netns == "" {
		return cmd.Start()
	}
	own, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return fmt.Errorf("opening this thread's network namespace: %w", err)
	}
	defer own.Close()
	target, err := os.Open(netns)
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", netns, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("entering network namespace %s: %w", netns, err)
	}
	startErr := cmd.Start()
	if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread cannot be trusted with another child: end the
		// process rather than start the next child in the wrong place.
		panic(fmt.Sprintf("returning the spawner thread to its network namespace: %v", err))
	}
	return startErr
}

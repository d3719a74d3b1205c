package plane

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"

	"marina.dev/marina/internal/files"
)

// stopGrace is how long a child gets to exit after SIGTERM before SIGKILL.
const stopGrace = 15 * time.Second

// child is one supervised component process.
type child struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	log     *os.File
	done    chan struct{} // closed when the process has exited
	err     error         // the exit status; read only after done is closed
}

// spawner starts processes from a single goroutine locked to its OS thread.
// The parent-death signal (PR_SET_PDEATHSIG) fires when the *thread* that
// forked a child exits, not the process; keeping that thread alive for the
// plane's lifetime makes the signal mean "marina is gone".
type spawner struct {
	reqs chan spawnReq
	quit chan struct{}
}

type spawnReq struct {
	cmd *exec.Cmd
	res chan error
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan spawnReq), quit: make(chan struct{})}
	go func() {
		// Never unlocked: when this goroutine returns, its thread exits with
		// it, and any child still alive receives SIGKILL.
		runtime.LockOSThread()
		for {
			select {
			case r := <-s.reqs:
				r.res <- r.cmd.Start()
			case <-s.quit:
				return
			}
		}
	}()
	return s
}

func (s *spawner) start(cmd *exec.Cmd) error {
	res := make(chan error)
	s.reqs <- spawnReq{cmd: cmd, res: res}
	return <-res
}

func (s *spawner) close() { close(s.quit) }

// startChild starts binary with args, its output appended to logPath (0600).
func (s *spawner) startChild(name, binary string, args []string, logPath string) (*child, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening log for %s: %w", name, err)
	}
	fmt.Fprintf(logFile, "\n==== %s: starting %s\n", time.Now().Format(time.RFC3339), name)
	cmd := exec.Command(binary, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + os.Getenv("HOME")}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Pdeathsig: syscall.SIGKILL,
		// Its own process group: a Ctrl-C in the terminal reaches marina only,
		// which then stops the children in order.
		Setpgid: true,
	}
	if err := s.start(cmd); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, binary, err)
	}
	c := &child{name: name, cmd: cmd, logPath: logPath, log: logFile, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		logFile.Close()
		close(c.done)
	}()
	return c, nil
}

// exited reports whether the process has ended.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// exitError describes an unexpected exit, with the end of the child's log,
// which is where etcd and kube-apiserver say what went wrong.
func (c *child) exitError() error {
	status := "exited"
	if c.err != nil {
		status = c.err.Error()
	}
	return fmt.Errorf("%s %s; last lines of %s:\n%s", c.name, status, c.logPath, files.Tail(c.logPath, 15))
}

// stop sends SIGTERM, waits up to stopGrace, then SIGKILLs.
func (c *child) stop() error {
	if c.exited() {
		return nil
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stopping %s: %w", c.name, err)
	}
	select {
	case <-c.done:
		return nil
	case <-time.After(stopGrace):
	}
	if err := c.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing %s: %w", c.name, err)
	}
	<-c.done
	return nil
}

// Package nice starts processes at a lower CPU priority. The local
// provider's simulated machines (their agents, control-plane components and
// load balancers) share one host with the management plane; on separate
// hosts they would never take its CPU. Under a fleet of a thousand simulated
// workers on two cores, the management API server's writes took half a
// second each, queued behind the machines' processes, and every machine
// waited on them (docs/architecture.md).
package nice

import (
	"fmt"
	"os/exec"
	"runtime"
	"syscall"
)

// Machines is the nice value of what the local provider runs: weight 110
// against the management plane's 1024 under Linux's scheduler, so it takes
// the CPU the management plane leaves.
const Machines = 10

// Start starts cmd with the nice value n, which its threads and children
// inherit. Linux keeps the value per thread and a child inherits the
// forking thread's: the fork is made from a thread of its own, reniced
// first and never returned to the Go scheduler.
//
// The thread ends right after the fork, so a parent-death signal would
// reach the child at once: a command asking for one is refused.
func Start(cmd *exec.Cmd, n int) error {
	if a := cmd.SysProcAttr; a != nil && a.Pdeathsig != 0 {
		return fmt.Errorf("starting %s at a lower priority: it asks for a parent-death signal, which the forking thread's end would send", cmd.Path)
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine, so no
		// other goroutine ever runs at this priority.
		runtime.LockOSThread()
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), n); err != nil {
			errc <- fmt.Errorf("lowering the priority of %s: %w", cmd.Path, err)
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}

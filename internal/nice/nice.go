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
	"sync"
	"syscall"
)

// Machines is the nice value of what Start starts: weight 110 against the
// management plane's 1024 under Linux's scheduler, so it takes the CPU the
// management plane leaves.
const Machines = 10

type request struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	once     sync.Once
	requests = make(chan request)
)

// Start starts cmd at nice Machines, which its threads and children
// inherit.
//
// Linux keeps nice values per thread, and a child inherits the forking
// thread's, so the forks are made from one thread of their own, reniced
// once. That thread lives as long as the process: a thread that ends sends
// the parent-death signal of every child it forked, and Go may have forked
// other processes from it before (a first version ended its thread after
// each start, and killed a test's kube-controller-manager that way).
func Start(cmd *exec.Cmd) error {
	once.Do(func() { go serve() })
	done := make(chan error, 1)
	requests <- request{cmd, done}
	return <-done
}

// serve runs for the life of the process on its own thread, the only
// goroutine ever to run there.
func serve() {
	runtime.LockOSThread() // never unlocked
	err := syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), Machines)
	for r := range requests {
		if err != nil {
			r.done <- fmt.Errorf("lowering the priority of %s: %w", r.cmd.Path, err)
			continue
		}
		r.done <- r.cmd.Start()
	}
}

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
	"os"
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
// goroutine ever to run there. A process already at nice Machines or more
// is left where it is (lowering a nice value needs privileges); one that
// cannot be reniced starts its children at its own priority, as the
// priority is about sharing the CPU well, not about working at all.
func serve() {
	runtime.LockOSThread() // never unlocked
	tid := syscall.Gettid()
	if raw, err := syscall.Getpriority(syscall.PRIO_PROCESS, tid); err == nil && 20-raw < Machines {
		_ = syscall.Setpriority(syscall.PRIO_PROCESS, tid, Machines)
	}
	for r := range requests {
		err := r.cmd.Start()
		if err == nil && r.cmd.SysProcAttr != nil && r.cmd.SysProcAttr.Setsid {
			setAutogroup(r.cmd.Process.Pid)
		}
		r.done <- err
	}
}

// setAutogroup renices the scheduling group of a new session. Where the
// kernel groups tasks by session (autogroup, in the root CPU cgroup), a
// nice value orders tasks only within their group, and each session
// shares the CPU equally with the others: a hundred sessions of simulated
// machines would take a hundred shares to the management plane's one. A
// kernel without autogroups has no such file; nothing is done.
func setAutogroup(pid int) {
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/autogroup", pid), []byte(fmt.Sprint(Machines)), 0)
}

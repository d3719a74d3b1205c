// Command pause is the first process of a pod sandbox, as Kubernetes'
// build/pause/linux/pause.c is: it holds the pod's namespaces open by
// living, reaps the zombies that are reparented to it as PID 1 (processes
// of the pod that share its PID namespace), and exits 0 on SIGINT or
// SIGTERM. make images packs it as the pause image.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// version is what -v prints, the pause release it does the job of.
const version = "3.10.2"

func main() {
	for _, a := range os.Args[1:] {
		if strings.EqualFold(a, "-v") {
			fmt.Printf("pause (marina) %s\n", version)
			return
		}
	}
	if os.Getpid() != 1 {
		// Not an error: pause is run outside of a sandbox too.
		fmt.Fprintln(os.Stderr, "Warning: pause should be the first process")
	}
	// Buffered: a SIGCHLD that arrives while children are being reaped
	// is kept, and the loop reaps again.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s == syscall.SIGCHLD {
			reap()
			continue
		}
		fmt.Fprintf(os.Stderr, "Shutting down, got signal: %v\n", s)
		os.Exit(0)
	}
}

// reap waits for every child that has exited, without blocking: several
// exits can come with one SIGCHLD.
func reap() {
	for {
		pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}

package cgroups

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// A deleted real machine leaves no cgroup and no process (issue 32): KillAll
// ends a process that forks (a shell starting sleeps) in a group with
// groups below it, as the kubelet makes for pods, and removes every group
// in every hierarchy.
func TestKillAllEndsEveryProcessAndRemovesTheGroups(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	group := fmt.Sprintf("/marina-test-%d", os.Getpid())
	child := group + "/kubepods/pod1"
	hs, err := Hierarchies()
	if err != nil || len(hs) == 0 {
		t.Skipf("no cgroup hierarchy: %v", err)
	}
	cmd := exec.Command("sh", "-c", "while :; do sleep 1 & wait; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Whatever fails below, the shell and its groups go with the test.
	t.Cleanup(func() { _ = KillAll(group, 5*time.Second); _ = cmd.Process.Kill() })
	if err := Join(child, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if pids, err := Processes(group); err != nil || len(pids) == 0 {
		t.Fatalf("Processes(%s) = %v, %v: want the shell", group, pids, err)
	}
	if err := KillAll(group, 10*time.Second); err != nil {
		t.Fatalf("KillAll: %v", err)
	}
	select {
	case err := <-exited:
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Errorf("the shell ended with %v, want SIGKILL", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the shell still runs after KillAll")
	}
	all, err := allHierarchies()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range all {
		if _, err := os.Stat(filepath.Join(h, group)); !os.IsNotExist(err) {
			t.Errorf("%s is still there after KillAll (%v)", filepath.Join(h, group), err)
		}
	}
}

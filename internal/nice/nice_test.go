package nice

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// The process started, and the children it forks, run at the nice value
// given; the caller's threads keep theirs.
func TestStartLowersThePriorityOfTheProcessAndItsChildren(t *testing.T) {
	out := filepath.Join(t.TempDir(), "nice")
	// The shell reports its own nice value and its child's (field 19 of
	// /proc/<pid>/stat).
	cmd := exec.Command("/bin/sh", "-c", `cut -d' ' -f19 /proc/$$/stat > "$1"; sh -c 'cut -d" " -f19 /proc/$$/stat' >> "$1"`, "sh", out)
	if err := Start(cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range strings.Fields(string(data)) {
		if n, _ := strconv.Atoi(f); n != Machines {
			t.Errorf("process %d of the command runs at nice %s, want %d", i, f, Machines)
		}
	}
	if len(strings.Fields(string(data))) != 2 {
		t.Fatalf("reported %q, want two nice values", data)
	}
	self, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	// getpriority returns 20 - nice.
	if 20-self != 0 {
		t.Errorf("the caller's thread runs at nice %d after Start, want 0", 20-self)
	}
}

// A command in a session of its own gets its scheduling group reniced
// too, where the kernel groups tasks by session.
func TestStartRenicesANewSessionsGroup(t *testing.T) {
	if _, err := os.Stat("/proc/self/autogroup"); err != nil {
		t.Skip("no autogroups on this kernel")
	}
	cmd := exec.Command("/bin/sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := Start(cmd); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/autogroup", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(strings.TrimSpace(string(data)), "nice "+strconv.Itoa(Machines)) {
		t.Errorf("the session's group is %q, want nice %d", strings.TrimSpace(string(data)), Machines)
	}
}

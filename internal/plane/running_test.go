package plane

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// Running is true exactly while a marina holds the state directory's lock.
func TestRunningIsTheStateLock(t *testing.T) {
	dir := t.TempDir()
	if running, err := Running(dir); err != nil || running {
		t.Fatalf("Running on a new directory = %v, %v; want false", running, err)
	}
	f, err := stateDir(dir).lock()
	if err != nil {
		t.Fatal(err)
	}
	if running, err := Running(dir); err != nil || !running {
		t.Errorf("Running while the lock is held = %v, %v; want true", running, err)
	}
	f.Close()
	if running, err := Running(dir); err != nil || running {
		t.Errorf("Running after the lock was released = %v, %v; want false", running, err)
	}
}

// A CLI probing whether marina up runs (Running takes the lock shared for
// an instant) never makes a starting marina up fail.
func TestLockWaitsOutAProbe(t *testing.T) {
	dir := t.TempDir()
	probe, err := os.OpenFile(stateDir(dir).path("lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	if err := syscall.Flock(int(probe.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	release := time.AfterFunc(100*time.Millisecond, func() { _ = syscall.Flock(int(probe.Fd()), syscall.LOCK_UN) })
	defer release.Stop()
	f, err := stateDir(dir).lock()
	if err != nil {
		t.Fatalf("taking the lock while a probe held it for 100ms: %v", err)
	}
	f.Close()
}

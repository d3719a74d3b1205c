package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// ErrLocked says another process, the sandbox's running agent, holds the
// agent lock.
var ErrLocked = errors.New("the agent lock is held by another process")

// Lock takes the exclusive agent lock of dir and returns the open lock file:
// the lock lasts until the file is closed or the process ends, however it
// ends, so "the lock is held" means "an agent runs", whatever happened to
// PIDs in between.
//
// Held probes the lock by taking it shared for an instant; Lock therefore
// keeps trying for up to wait before giving up with an error wrapping
// ErrLocked, so that a probe never makes a starting agent exit, while a
// second agent for a running sandbox still does.
func Lock(dir string, wait time.Duration) (*os.File, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the agent lock: %w", err)
	}
	deadline := time.Now().Add(wait)
	for {
		err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w: another agent runs this sandbox", path, ErrLocked)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Held reports whether an agent holds dir's agent lock. A sandbox whose
// lock file does not exist yet has no agent.
func Held(dir string) (bool, error) {
	f, err := os.Open(filepath.Join(dir, LockFile))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("probing the agent lock: %w", err)
	}
	defer f.Close()
	// Shared, so that concurrent probes do not see each other as agents.
	switch err := flock(f, syscall.LOCK_SH|syscall.LOCK_NB); {
	case err == nil:
		return false, nil // closing the file releases it
	case errors.Is(err, syscall.EWOULDBLOCK):
		return true, nil
	default:
		return false, fmt.Errorf("probing the agent lock of %s: %w", dir, err)
	}
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

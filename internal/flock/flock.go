// Package flock is the "one process per directory" lock of marina's detached
// processes (node agents, load balancers): an exclusive flock(2) on a file
// that lasts until the file is closed or the process ends, however it ends.
// "The lock is held" therefore means "the process runs", whatever happened
// to PIDs in between.
package flock

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// ErrHeld says another process holds the lock.
var ErrHeld = errors.New("the lock is held by another process")

// Lock takes the exclusive lock of path (created 0600 if missing) and
// returns the open file that holds it. Held probes the lock by taking it
// shared for an instant, so Lock keeps trying for up to wait before giving
// up with an error wrapping ErrHeld: a probe never makes a starting process
// exit, while a second process for a running one still does.
func Lock(path string, wait time.Duration) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock %s: %w", path, err)
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
			return nil, fmt.Errorf("locking %s: %w", path, ErrHeld)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Held reports whether a process holds the lock of path. A lock file that
// does not exist is not held.
func Held(path string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("probing lock %s: %w", path, err)
	}
	defer f.Close()
	// Shared, so that concurrent probes do not see each other as holders.
	switch err := flock(f, syscall.LOCK_SH|syscall.LOCK_NB); {
	case err == nil:
		return false, nil // closing the file releases it
	case errors.Is(err, syscall.EWOULDBLOCK):
		return true, nil
	default:
		return false, fmt.Errorf("probing lock %s: %w", path, err)
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

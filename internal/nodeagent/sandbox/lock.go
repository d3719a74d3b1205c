package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"marina.dev/marina/internal/flock"
)

// ErrLocked says another process, the sandbox's running agent, holds the
// agent lock.
var ErrLocked = errors.New("the agent lock is held by another process")

// Lock takes the exclusive agent lock of dir and returns the open lock file
// (see package flock); a second agent for a running sandbox gets an error
// wrapping ErrLocked after wait.
func Lock(dir string, wait time.Duration) (*os.File, error) {
	f, err := flock.Lock(filepath.Join(dir, LockFile), wait)
	if errors.Is(err, flock.ErrHeld) {
		return nil, fmt.Errorf("%w: another agent runs this sandbox (%v)", ErrLocked, err)
	}
	return f, err
}

// Held reports whether an agent holds dir's agent lock. A sandbox whose
// lock file does not exist yet has no agent.
func Held(dir string) (bool, error) { return flock.Held(filepath.Join(dir, LockFile)) }

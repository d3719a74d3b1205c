package nodeagent

import (
	"errors"
	"io/fs"
	"os"
	"time"
)

// modWatch tells whether a file or directory may have changed since the
// last look, from its modification time alone: a pool of a hundred members
// looking at their files several times a second reads none while none
// changes. Files here are replaced by rename, which moves the time of the
// file and of its directory.
type modWatch struct {
	path string
	last time.Time
	// missing: the last look found no file, and said so: looking again
	// finds nothing new to read until it exists.
	missing bool
}

// recent is how long after its modification a file still reads as
// changed at every look: two of the slowest watcher's looks (one a second),
// since a second change in the same clock tick would not move the time.
const recent = 2 * time.Second

// changed reports whether path may have changed since the last call that
// returned true. A time within recent counts as changed; so does a path
// that cannot be read, for the caller to find out why, and a path that
// does not exist, once (until it exists again).
func (w *modWatch) changed() bool {
	fi, err := os.Stat(w.path)
	if errors.Is(err, fs.ErrNotExist) {
		if w.missing {
			return false
		}
		w.last, w.missing = time.Time{}, true
		return true
	}
	w.missing = false
	if err != nil {
		w.last = time.Time{}
		return true
	}
	mtime := fi.ModTime()
	if mtime.Equal(w.last) && time.Since(mtime) >= recent {
		return false
	}
	w.last = mtime
	return true
}

// retry makes the next look read the file again: what the caller did with
// it failed.
func (w *modWatch) retry() { w.last, w.missing = time.Time{}, false }

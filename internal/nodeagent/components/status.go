package components

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"marina.dev/marina/internal/manifest"
)

// State is what a component is doing.
type State string

const (
	// Running: the component's process is alive.
	Running State = "Running"
	// Stopping: the process was sent SIGTERM because its manifest changed
	// or was removed; it is SIGKILLed if it outlives the grace period.
	Stopping State = "Stopping"
	// BackOff: the process exited, or could not start, and is started again
	// at NextStart (a kubelet's CrashLoopBackOff).
	BackOff State = "BackOff"
	// Stopped: nothing runs and nothing will start it: its manifest was
	// never valid, or the Supervisor has ended.
	Stopped State = "Stopped"
)

// Status is what runs for one component, as the Supervisor last saw it. A
// status file is current only while the machine's agent runs (holds the
// sandbox's agent lock): an agent killed outright leaves its last one.
type Status struct {
	// Name is the component's name.
	Name string `json:"name"`
	// State is what the component is doing.
	State State `json:"state"`
	// Version is the manifest version of the running process, or of the
	// last one when none runs.
	Version string `json:"version,omitempty"`
	// PID is the running process's ID; zero when none runs.
	PID int `json:"pid,omitempty"`
	// Started is when the running (or last) process was started.
	Started time.Time `json:"started,omitzero"`
	// Restarts counts the processes started from the current manifest after
	// the first: a changed manifest starts again from zero.
	Restarts int `json:"restarts"`
	// NextStart is when a component in BackOff is started again.
	NextStart time.Time `json:"nextStart,omitzero"`
	// LastExit is how the last process ended.
	LastExit *Exit `json:"lastExit,omitempty"`
	// StartError is why the last attempt to start the process failed.
	StartError string `json:"startError,omitempty"`
	// ManifestError is why the manifest on disk cannot be used; the
	// component runs on from the last valid one, if any.
	ManifestError string `json:"manifestError,omitempty"`
}

// Exit is how a process ended.
type Exit struct {
	// Started and At are when the process started and ended.
	Started time.Time `json:"started"`
	At      time.Time `json:"at"`
	// Code is the exit code, -1 when a signal ended the process.
	Code int `json:"code"`
	// Signal is the signal that ended the process, if one did, e.g. "killed".
	Signal string `json:"signal,omitempty"`
	// Expected is true when the Supervisor stopped the process.
	Expected bool `json:"expected,omitempty"`
}

// RanFor is how long the process ran.
func (e *Exit) RanFor() time.Duration { return e.At.Sub(e.Started) }

// ReadStatus reads the status of component name in sandbox dir. Its error
// wraps fs.ErrNotExist when there is none (no manifest, or no Supervisor
// has run yet).
func ReadStatus(dir, name string) (*Status, error) {
	data, err := os.ReadFile(manifest.StatusPath(dir, name))
	if err != nil {
		return nil, fmt.Errorf("reading the status of component %s: %w", name, err)
	}
	var s Status
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", manifest.StatusPath(dir, name), err)
	}
	return &s, nil
}

// ReadStatuses reads every component status in sandbox dir, by name.
func ReadStatuses(dir string) ([]Status, error) {
	entries, err := os.ReadDir(filepath.Join(dir, manifest.StatusDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the component statuses: %w", err)
	}
	var out []Status
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || manifest.ValidName(name) != nil {
			continue
		}
		s, err := ReadStatus(dir, name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

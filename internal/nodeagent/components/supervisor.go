package components

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/manifest"
	"marina.dev/marina/internal/process"
)

// Defaults of Options.
const (
	DefaultPollInterval = time.Second
	// DefaultStopGrace is how long a component gets to exit after SIGTERM:
	// etcd and kube-apiserver shut down in a few seconds.
	DefaultStopGrace = 10 * time.Second
)

// Options tune a Supervisor; zero values take the defaults.
type Options struct {
	// PollInterval is how often the manifests are read.
	PollInterval time.Duration
	// InitialBackoff, MaxBackoff and BackoffReset shape the delay before a
	// component that exited is started again (see DefaultInitialBackoff).
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	BackoffReset   time.Duration
	// StopGrace is how long a component gets between SIGTERM and SIGKILL.
	StopGrace time.Duration
}

func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.PollInterval, DefaultPollInterval)
	def(&o.InitialBackoff, DefaultInitialBackoff)
	def(&o.MaxBackoff, DefaultMaxBackoff)
	def(&o.BackoffReset, DefaultBackoffReset)
	def(&o.StopGrace, DefaultStopGrace)
	return o
}

// Supervisor runs the components whose manifests are in one sandbox. Only
// one Supervisor may run per sandbox: the node agent's lock guarantees it.
type Supervisor struct {
	dir  string
	opts Options

	mu     sync.Mutex
	status map[string]Status // what Status returns

	// restart carries Restart's requests to the Run goroutine.
	restart chan restartRequest

	// Owned by the Run goroutine.
	log      logr.Logger
	spawner  *process.Spawner
	comps    map[string]*component
	exits    chan *process.Child
	quit     chan struct{} // closed when Run returns: exit watchers give up
	written  map[string][]byte
	badNames map[string]bool // invalid manifest file names already logged
}

// component is the Supervisor's record of one component.
type component struct {
	name string
	// applied is the manifest the current (or last) process was started
	// from, appliedKey its canonical form; nil until a valid one is seen.
	applied     *manifest.Manifest
	appliedKey  string
	child       *process.Child
	started     time.Time
	stopping    bool // the child is being stopped on purpose
	starts      int  // processes started from applied
	failures    int  // consecutive unexpected exits and failed starts
	nextStart   time.Time
	lastExit    *Exit
	startErr    string
	manifestErr string
}

// New returns a Supervisor of the components of sandbox dir; Run starts it.
func New(dir string, opts Options) *Supervisor {
	return &Supervisor{dir: dir, opts: opts.withDefaults(), status: map[string]Status{}, restart: make(chan restartRequest, 4)}
}

// Restart stops the named running components (every one when none is
// named), each started again at once from its manifest, as after a change
// of the manifest: for what a component reads only when it starts (its
// certificates, when they are renewed). It does not wait, and drops a
// request when several are already pending.
func (s *Supervisor) Restart(reason string, names ...string) {
	select {
	case s.restart <- restartRequest{reason: reason, names: names}:
	default:
	}
}

type restartRequest struct {
	reason string
	names  []string
}

// Status returns the status of every component, by name: the content of the
// status files.
func (s *Supervisor) Status() []Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Status, 0, len(s.status))
	for _, st := range s.status {
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Run supervises the components until ctx ends, then stops every one of
// them (SIGTERM, the grace period, SIGKILL), marks them Stopped and returns
// nil. It returns an error only when it cannot prepare the sandbox's
// directories. Should the process die instead, the parent-death signal
// takes the components down with it. Run may be called once.
func (s *Supervisor) Run(ctx context.Context) error {
	s.log = klog.FromContext(ctx).WithName("components")
	for _, d := range []string{manifest.Dir, manifest.LogsDir, manifest.StatusDir} {
		if err := os.MkdirAll(filepath.Join(s.dir, d), 0o700); err != nil {
			return fmt.Errorf("preparing the components' directories: %w", err)
		}
	}
	// Statuses left by a previous agent describe processes that are gone.
	stale, _ := filepath.Glob(filepath.Join(s.dir, manifest.StatusDir, "*.json"))
	for _, f := range stale {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing a stale component status: %w", err)
		}
	}

	s.spawner = process.NewSpawner()
	s.comps = map[string]*component{}
	s.exits = make(chan *process.Child)
	s.quit = make(chan struct{})
	s.written = map[string][]byte{}
	s.badNames = map[string]bool{}
	defer close(s.quit)

	timer := time.NewTimer(0)
	defer timer.Stop()
	for ctx.Err() == nil {
		now := time.Now()
		s.sync(now)
		s.publish()
		timer.Reset(s.nextWake(now))
		select {
		case <-ctx.Done():
		case c := <-s.exits:
			s.exited(c)
		case req := <-s.restart:
			for name, c := range s.comps {
				if c.child != nil && (len(req.names) == 0 || slices.Contains(req.names, name)) {
					s.stop(c, req.reason)
				}
			}
		case <-timer.C:
		}
	}
	s.shutdown()
	return nil
}

// nextWake is how long the loop may sleep: until the next poll, or the
// next restart if that comes first.
func (s *Supervisor) nextWake(now time.Time) time.Duration {
	wake := s.opts.PollInterval
	for _, c := range s.comps {
		if c.child == nil && c.applied != nil && !c.nextStart.IsZero() {
			wake = min(wake, max(c.nextStart.Sub(now), 0))
		}
	}
	return wake
}

// sync reads the manifests and brings every component towards its own.
func (s *Supervisor) sync(now time.Time) {
	manifests, badNames, err := manifest.Read(s.dir)
	if err != nil {
		s.log.Error(err, "Reading component manifests failed, leaving the components as they are")
		return
	}
	for _, n := range badNames {
		if !s.badNames[n] {
			s.badNames[n] = true
			s.log.Error(manifest.ValidName(strings.TrimSuffix(n, ".json")), "Ignoring a manifest file whose name is not a component name", "file", n)
		}
	}
	for name := range manifests {
		if s.comps[name] == nil {
			s.comps[name] = &component{name: name}
		}
	}
	for name, c := range s.comps {
		mf, present := manifests[name]
		if !present {
			if s.removed(c) {
				delete(s.comps, name)
			}
			continue
		}
		s.reconcile(c, mf, now)
	}
}

// removed stops a component whose manifest is gone and reports whether it
// is gone too.
func (s *Supervisor) removed(c *component) bool {
	c.manifestErr = ""
	if c.child == nil {
		return true
	}
	s.stop(c, "manifest removed")
	return false
}

// reconcile brings one component towards the manifest on disk: it starts
// the component when nothing runs and its backoff has passed, and stops it
// when the manifest changed (the exit then starts the new one). An invalid
// manifest is reported and otherwise ignored.
func (s *Supervisor) reconcile(c *component, mf manifest.File, now time.Time) {
	desired, key := mf.Manifest, mf.Key
	if mf.Err != nil {
		if msg := mf.Err.Error(); c.manifestErr != msg {
			c.manifestErr = msg
			s.log.Error(mf.Err, "Invalid component manifest, leaving the component as it is", "component", c.name, "manifest", manifest.Path(s.dir, c.name))
		}
		desired, key = c.applied, c.appliedKey
	} else if c.manifestErr != "" {
		c.manifestErr = ""
		s.log.Info("Component manifest is valid again", "component", c.name)
	}
	if desired == nil {
		return
	}
	if c.child != nil {
		if key != c.appliedKey {
			s.stop(c, "manifest changed")
		}
		return
	}
	if key != c.appliedKey {
		// A new desired state starts afresh, as a new static pod does.
		c.applied, c.appliedKey = desired, key
		c.starts, c.failures, c.nextStart, c.startErr = 0, 0, time.Time{}, ""
	}
	if now.Before(c.nextStart) {
		return
	}
	s.start(c, now)
}

func (s *Supervisor) start(c *component, now time.Time) {
	m := c.applied
	child, err := s.spawner.Start(process.Spec{
		Name:    c.name,
		Version: m.Version,
		Binary:  m.Binary,
		Args:    m.Args,
		Env:     m.Environ(),
		// Relative paths in a manifest are relative to the sandbox.
		Dir:     s.dir,
		LogPath: manifest.LogPath(s.dir, c.name),
		NetNS:   m.NetNS,
	})
	if err != nil {
		c.failures++
		delay := backoff(c.failures, s.opts.InitialBackoff, s.opts.MaxBackoff)
		c.nextStart = now.Add(delay)
		c.startErr = err.Error()
		s.log.Error(err, "Starting component failed", "component", c.name, "version", m.Version, "retryIn", delay)
		return
	}
	c.child, c.started, c.startErr, c.nextStart = child, now, "", time.Time{}
	c.starts++
	s.log.Info("Started component", "component", c.name, "version", m.Version, "pid", child.PID(), "restarts", c.starts-1)
	go func() {
		<-child.Done()
		select {
		case s.exits <- child:
		case <-s.quit:
		}
	}()
}

// stop begins stopping a component's process without waiting for it: the
// loop goes on serving the others, and the exit arrives like any other.
func (s *Supervisor) stop(c *component, reason string) {
	if c.stopping {
		return
	}
	c.stopping = true
	child := c.child
	s.log.Info("Stopping component", "component", c.name, "version", c.applied.Version, "pid", child.PID(), "reason", reason)
	go func() {
		if err := child.Stop(s.opts.StopGrace); err != nil {
			s.log.Error(err, "Stopping component failed", "component", c.name, "pid", child.PID())
		}
	}()
}

// exited records the end of a process; an end the Supervisor did not ask
// for schedules the next start after the backoff.
func (s *Supervisor) exited(child *process.Child) {
	var c *component
	for _, cc := range s.comps {
		if cc.child == child {
			c = cc
		}
	}
	if c == nil {
		return
	}
	exit := exitOf(child, c.started)
	exit.Expected = c.stopping
	c.lastExit, c.child, c.stopping = exit, nil, false
	if exit.Expected {
		s.log.Info("Component stopped", "component", c.name, "version", c.applied.Version, "pid", child.PID())
		return
	}
	if exit.RanFor() >= s.opts.BackoffReset {
		c.failures = 0
	}
	c.failures++
	delay := backoff(c.failures, s.opts.InitialBackoff, s.opts.MaxBackoff)
	c.nextStart = exit.At.Add(delay)
	s.log.Info("Component exited, restarting it after a backoff", "component", c.name, "version", c.applied.Version,
		"pid", child.PID(), "code", exit.Code, "signal", exit.Signal, "ranFor", exit.RanFor().Round(time.Millisecond), "restartIn", delay)
}

func exitOf(child *process.Child, started time.Time) *Exit {
	e := &Exit{Started: started, At: child.ExitedAt(), Code: -1}
	if ps := child.ProcessState(); ps != nil {
		e.Code = ps.ExitCode()
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			e.Signal = ws.Signal().String()
		}
	}
	return e
}

// shutdown stops every component at once and waits for all of them.
func (s *Supervisor) shutdown() {
	var wg sync.WaitGroup
	for _, c := range s.comps {
		if c.child == nil {
			continue
		}
		s.stop(c, "supervisor stopping")
		wg.Go(func() {
			_ = c.child.Wait()
			c.lastExit = exitOf(c.child, c.started)
			c.lastExit.Expected = true
		})
	}
	wg.Wait()
	s.spawner.Close()
	for _, c := range s.comps {
		c.child, c.stopping, c.nextStart = nil, false, time.Time{}
	}
	s.publishStopped()
	s.log.Info("Stopped every component")
}

// statusOf is what the status file of c says.
func (s *Supervisor) statusOf(c *component) Status {
	st := Status{
		Name:          c.name,
		State:         Stopped,
		Started:       c.started,
		Restarts:      max(c.starts-1, 0),
		LastExit:      c.lastExit,
		StartError:    c.startErr,
		ManifestError: c.manifestErr,
	}
	if c.applied != nil {
		st.Version = c.applied.Version
	}
	switch {
	case c.child != nil && c.stopping:
		st.State, st.PID = Stopping, c.child.PID()
	case c.child != nil:
		st.State, st.PID = Running, c.child.PID()
	case c.applied != nil && !c.nextStart.IsZero():
		st.State, st.NextStart = BackOff, c.nextStart
	}
	return st
}

// publish writes the status file of every component whose status changed,
// removes those of components that are gone, and updates what Status
// returns.
func (s *Supervisor) publish() {
	statuses := map[string]Status{}
	for name, c := range s.comps {
		statuses[name] = s.statusOf(c)
	}
	s.write(statuses)
	for name := range s.written {
		if _, ok := statuses[name]; ok {
			continue
		}
		if err := os.Remove(manifest.StatusPath(s.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.log.Error(err, "Removing a component status failed", "component", name)
			continue
		}
		delete(s.written, name)
	}
	s.mu.Lock()
	s.status = statuses
	s.mu.Unlock()
}

// publishStopped marks every component Stopped, after shutdown.
func (s *Supervisor) publishStopped() {
	statuses := map[string]Status{}
	for name, c := range s.comps {
		st := s.statusOf(c)
		st.State = Stopped
		statuses[name] = st
	}
	s.write(statuses)
	s.mu.Lock()
	s.status = statuses
	s.mu.Unlock()
}

func (s *Supervisor) write(statuses map[string]Status) {
	for name, st := range statuses {
		data, err := json.MarshalIndent(st, "", "  ")
		if err != nil {
			s.log.Error(err, "Encoding a component status failed", "component", name)
			continue
		}
		if bytes.Equal(data, s.written[name]) {
			continue
		}
		// No secret in a status: 0644, readable by whoever monitors the host.
		if err := files.WriteAtomic(manifest.StatusPath(s.dir, name), append(data, '\n'), 0o644); err != nil {
			s.log.Error(err, "Writing a component status failed", "component", name)
			continue
		}
		s.written[name] = data
	}
}

package components

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/manifest"
	"marina.dev/marina/internal/testenv"
)

func TestBackoffDoublesUpToItsCap(t *testing.T) {
	for _, tc := range []struct {
		failures int
		want     time.Duration
	}{
		{1, time.Second},
		{2, 2 * time.Second},
		{3, 4 * time.Second},
		{5, 16 * time.Second},
		{6, 30 * time.Second},
		{1000, 30 * time.Second},
	} {
		if got := backoff(tc.failures, time.Second, 30*time.Second); got != tc.want {
			t.Errorf("backoff after %d failures = %s, want %s", tc.failures, got, tc.want)
		}
	}
}

func TestKilledComponentIsRestartedAfterABackoff(t *testing.T) {
	t.Parallel()
	h := supervise(t, Options{})
	const secret = "hunter2-not-for-logs"
	m := sleeper("v3.6.16", secret)
	h.write("etcd", m)
	st, p := h.waitRunning("etcd")
	if st.Version != "v3.6.16" || st.Restarts != 0 {
		t.Fatalf("first status %+v, want version v3.6.16 and no restart", st)
	}

	// Each kill -9 is a failure: restarted after 1 s, then after 2 s.
	for i, delay := range []time.Duration{time.Second, 2 * time.Second} {
		killedAt := uptime(t)
		if err := syscall.Kill(p.pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waiting := h.waitFor("etcd", "backing off", func(s *Status) error {
			if s.State != BackOff {
				return fmt.Errorf("state %s", s.State)
			}
			return nil
		})
		if got := waiting.NextStart.Sub(waiting.LastExit.At); got != delay {
			t.Errorf("restart %d scheduled %s after the exit, want %s", i+1, got, delay)
		}
		if waiting.LastExit.Signal != "killed" || waiting.LastExit.Code != -1 || waiting.LastExit.Expected {
			t.Errorf("last exit %+v, want an unexpected SIGKILL", waiting.LastExit)
		}
		st, p = h.waitRunning("etcd", p.pid)
		if st.Restarts != i+1 {
			t.Errorf("restarts = %d, want %d", st.Restarts, i+1)
		}
		// The supervisor's clock and the kernel's agree: no earlier restart.
		if got := st.Started.Sub(st.LastExit.At); got < delay {
			t.Errorf("restart %d came %s after the exit, sooner than the backoff %s", i+1, got, delay)
		}
		if got := p.startedAt() - killedAt; got < delay.Seconds()-0.02 {
			t.Errorf("restart %d: the new process started %.2fs after the kill, sooner than the backoff %s", i+1, got, delay)
		}
		t.Logf("restart %d: %s after the exit (backoff %s)", i+1, st.Started.Sub(st.LastExit.At).Round(time.Millisecond), delay)
	}

	got := h.s.Status()
	if len(got) != 1 || got[0].PID != st.PID || got[0].Restarts != 2 || got[0].State != Running {
		t.Errorf("Status() = %+v, want the status file's %+v", got, st)
	}
	h.stop()
	componentLog, err := os.ReadFile(manifest.LogPath(h.dir, "etcd"))
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(manifest.LogPath(h.dir, "etcd")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("component log mode: %v %v, want 0600", fi.Mode(), err)
	}
	supervisorLog := h.log.String()
	for _, logged := range []string{supervisorLog, string(componentLog)} {
		if strings.Contains(logged, secret) {
			t.Errorf("an argument of the component was logged:\n%s", logged)
		}
	}
	for _, want := range []string{`"Started component"`, `component="etcd" version="v3.6.16" pid=` + fmt.Sprint(st.PID), `restartIn="2s"`} {
		if !strings.Contains(supervisorLog, want) {
			t.Errorf("supervisor log lacks %q:\n%s", want, supervisorLog)
		}
	}
	if n := strings.Count(string(componentLog), "starting etcd v3.6.16"); n != 3 {
		t.Errorf("component log has %d start lines, want 3:\n%s", n, componentLog)
	}
}

func TestCrashingComponentBacksOffExponentially(t *testing.T) {
	t.Parallel()
	h := supervise(t, Options{})
	h.write("kube-scheduler", &manifest.Manifest{Version: "v1.37.2", Binary: "/bin/sh", Args: []string{"-c", "echo no kubeconfig >&2; exit 3"}})
	// Failures 1, 2 and 3: restarted after 1 s and 2 s, then waiting 4 s.
	st := h.waitFor("kube-scheduler", "third failure", func(s *Status) error {
		if s.State != BackOff || s.Restarts < 2 {
			return fmt.Errorf("state %s after %d restarts", s.State, s.Restarts)
		}
		return nil
	})
	if st.LastExit.Code != 3 || st.LastExit.Signal != "" {
		t.Errorf("last exit %+v, want code 3", st.LastExit)
	}
	if got := st.NextStart.Sub(st.LastExit.At); got != 4*time.Second {
		t.Errorf("after the third failure the next start is %s after the exit, want 4s", got)
	}
	if data, _ := os.ReadFile(manifest.LogPath(h.dir, "kube-scheduler")); strings.Count(string(data), "no kubeconfig") != 3 {
		t.Errorf("component log:\n%s", data)
	}
}

func TestChangedManifestRestartsOnlyThatComponent(t *testing.T) {
	t.Parallel()
	h := supervise(t, Options{})
	for _, name := range []string{"etcd", "kube-apiserver", "kube-scheduler"} {
		h.write(name, sleeper("v1.36.3", name))
	}
	etcd, etcdProc := h.waitRunning("etcd")
	api, apiProc := h.waitRunning("kube-apiserver")
	sched, schedProc := h.waitRunning("kube-scheduler")

	h.write("kube-apiserver", sleeper("v1.37.2", "kube-apiserver"))
	api2, _ := h.waitRunning("kube-apiserver", api.PID)
	if api2.Version != "v1.37.2" || api2.Restarts != 0 || api2.LastExit == nil || !api2.LastExit.Expected || api2.LastExit.Signal != "terminated" {
		t.Errorf("kube-apiserver after the upgrade: %+v (last exit %+v), want v1.37.2, no restart counted, the old one terminated", api2, api2.LastExit)
	}
	waitGone(t, "the old kube-apiserver ended", apiProc)

	// The same desired state written differently is no change. Writing
	// etcd's first and then changing the scheduler's makes sure that a poll
	// saw etcd's rewrite before the scheduler restarts.
	raw := `{"binary": "/bin/sh", "version": "v1.36.3", "args": ["-c", "exec sleep 300", "etcd"], "env": {}}`
	if err := files.WriteAtomic(manifest.Path(h.dir, "etcd"), []byte(raw), 0o600); err != nil {
		t.Fatal(err)
	}
	h.write("kube-scheduler", &manifest.Manifest{Version: "v1.36.3", Binary: "/bin/sh", Args: []string{"-c", "exec sleep 300", "kube-scheduler"}, Env: map[string]string{"GOGC": "50"}})
	h.waitRunning("kube-scheduler", sched.PID)
	waitGone(t, "the old kube-scheduler ended", schedProc)

	if st, err := ReadStatus(h.dir, "etcd"); err != nil || st.PID != etcd.PID || st.Restarts != 0 || !etcdProc.alive() {
		t.Errorf("etcd was touched by the other components' changes: %+v %v", st, err)
	}
}

func TestRemovedManifestStopsTheComponentAndANewOneStarts(t *testing.T) {
	t.Parallel()
	h := supervise(t, Options{})
	h.write("etcd", sleeper("v3.6.16", "etcd"))
	etcd, etcdProc := h.waitRunning("etcd")

	h.write("kube-scheduler", sleeper("v1.37.2", "kube-scheduler"))
	h.waitRunning("kube-scheduler")

	if err := manifest.Remove(h.dir, "etcd"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "etcd stopped", etcdProc)
	testenv.Eventually(t, 10*time.Second, "etcd's status removed", func() error {
		if _, err := ReadStatus(h.dir, "etcd"); !notExist(err) {
			return fmt.Errorf("status still there (%v)", err)
		}
		return nil
	})
	statuses, err := ReadStatuses(h.dir)
	if err != nil {
		t.Fatal(err)
	}
	got := h.s.Status()
	if len(statuses) != 1 || len(got) != 1 || statuses[0].Name != "kube-scheduler" || got[0].PID != statuses[0].PID ||
		got[0].State != Running || !got[0].Started.Equal(statuses[0].Started) {
		t.Errorf("statuses on disk %+v and from Status() %+v, want the scheduler's alone", statuses, got)
	}
	if !strings.Contains(h.log.String(), fmt.Sprint("pid=", etcd.PID, " reason=\"manifest removed\"")) {
		t.Errorf("supervisor log does not say why etcd stopped:\n%s", h.log.String())
	}
}

func TestInvalidManifestLeavesTheComponentAsItIs(t *testing.T) {
	t.Parallel()
	h := supervise(t, Options{})
	good := sleeper("v1.37.2", "kube-controller-manager")
	h.write("kube-controller-manager", good)
	st, p := h.waitRunning("kube-controller-manager")

	for _, tc := range []struct{ content, want string }{
		{`{"version": "v1.37.3", "binary": "/bin/sh", "args": [`, "unexpected EOF"},
		{`{"version": "v1.37.3", "binary": "/bin/sh", "flags": ["--v=2"]}`, `unknown field "flags"`},
		{`{"version": "v1.37.3", "binary": "bin/kube-controller-manager"}`, "not an absolute path"},
		{`{"binary": "/bin/sh"}`, "version is empty"},
	} {
		if err := files.WriteAtomic(manifest.Path(h.dir, "kube-controller-manager"), []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		bad := h.waitFor("kube-controller-manager", "manifest error reported", func(s *Status) error {
			if !strings.Contains(s.ManifestError, tc.want) {
				return fmt.Errorf("manifest error %q", s.ManifestError)
			}
			return nil
		})
		if bad.PID != st.PID || bad.State != Running || bad.Version != "v1.37.2" || !p.alive() {
			t.Errorf("an invalid manifest touched the running component: %+v", bad)
		}
	}
	if !strings.Contains(h.log.String(), `"Invalid component manifest, leaving the component as it is"`) {
		t.Errorf("supervisor log does not report the invalid manifest:\n%s", h.log.String())
	}

	// Fixed again, to what runs: the error goes, the process stays.
	h.write("kube-controller-manager", good)
	fixed := h.waitFor("kube-controller-manager", "manifest error cleared", func(s *Status) error {
		if s.ManifestError != "" {
			return fmt.Errorf("manifest error %q", s.ManifestError)
		}
		return nil
	})
	if fixed.PID != st.PID || fixed.Restarts != 0 || !p.alive() {
		t.Errorf("fixing the manifest restarted the component: %+v", fixed)
	}

	// A new component whose first manifest is invalid never starts.
	if err := files.WriteAtomic(manifest.Path(h.dir, "kube-scheduler"), []byte(`not json`), 0o600); err != nil {
		t.Fatal(err)
	}
	never := h.waitFor("kube-scheduler", "manifest error reported", func(s *Status) error {
		if s.ManifestError == "" {
			return fmt.Errorf("no manifest error")
		}
		return nil
	})
	if never.State != Stopped || never.PID != 0 {
		t.Errorf("a component with no valid manifest: %+v, want Stopped", never)
	}
}

func TestComponentThatCannotStartBacksOffUntilItsManifestIsFixed(t *testing.T) {
	t.Parallel()
	h := supervise(t, Options{})
	h.write("kube-apiserver", &manifest.Manifest{Version: "v1.99.0", Binary: "/nonexistent/kube-apiserver-v1.99.0"})
	st := h.waitFor("kube-apiserver", "start failure reported", func(s *Status) error {
		if s.State != BackOff || !strings.Contains(s.StartError, "/nonexistent/kube-apiserver-v1.99.0") {
			return fmt.Errorf("state %s, start error %q", s.State, s.StartError)
		}
		return nil
	})
	if st.PID != 0 || st.Version != "v1.99.0" {
		t.Errorf("status %+v", st)
	}
	h.write("kube-apiserver", sleeper("v1.37.2", "kube-apiserver"))
	st, _ = h.waitRunning("kube-apiserver")
	if st.StartError != "" || st.Restarts != 0 || st.Version != "v1.37.2" {
		t.Errorf("status after the fix %+v", st)
	}
}

func TestEndingTheContextStopsEveryComponent(t *testing.T) {
	t.Parallel()
	h := supervise(t, Options{StopGrace: time.Second})
	h.write("etcd", sleeper("v3.6.16", "etcd"))
	h.write("kube-apiserver", stubborn("v1.37.2"))
	_, etcd := h.waitRunning("etcd")
	_, api := h.waitRunning("kube-apiserver")

	took := h.stop()
	t.Logf("stopping took %s (grace 1s, kube-apiserver ignores SIGTERM)", took.Round(time.Millisecond))
	if took < time.Second || took > 5*time.Second {
		t.Errorf("stopping took %s, want the 1s grace and little more", took)
	}
	// Run has returned: every child is already reaped.
	for _, p := range []proc{etcd, api} {
		if p.alive() {
			t.Errorf("process %d is alive after Run returned", p.pid)
		}
	}
	for name, signal := range map[string]string{"etcd": "terminated", "kube-apiserver": "killed"} {
		st, err := ReadStatus(h.dir, name)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != Stopped || st.PID != 0 || st.LastExit == nil || !st.LastExit.Expected || st.LastExit.Signal != signal {
			t.Errorf("%s after the supervisor stopped: %+v (last exit %+v), want Stopped by %s", name, st, st.LastExit, signal)
		}
		if got := h.s.Status(); len(got) != 2 || got[0].State != Stopped || got[1].State != Stopped {
			t.Errorf("Status() = %+v, want both Stopped", got)
		}
	}
}

// The agent may die without running any code (SIGKILL, OOM killer): its
// components must go with it.
func TestKilledSupervisorTakesItsComponentsDown(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, name := range []string{"etcd", "kube-apiserver"} {
		if err := manifest.Write(dir, name, sleeper("v1.37.2", name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := manifest.Write(dir, "kube-scheduler", stubborn("v1.37.2")); err != nil {
		t.Fatal(err)
	}
	agent := exec.Command(os.Args[0], "-test.run=^$")
	agent.Env = append(os.Environ(), superviseEnv+"="+dir)
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	agentDone := make(chan struct{})
	go func() { _ = agent.Wait(); close(agentDone) }()
	t.Cleanup(func() {
		_ = agent.Process.Kill()
		<-agentDone
	})
	var procs []proc
	killLeftovers(t, &procs)
	for _, name := range []string{"etcd", "kube-apiserver", "kube-scheduler"} {
		st := waitForStatus(t, dir, name, "running", running())
		p := procOf(t, st.PID)
		procs = append(procs, p)
		waitExec(t, p)
	}

	if err := agent.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-agentDone
	start := time.Now()
	waitGone(t, "components ended with their supervisor", procs...)
	t.Logf("components gone %s after the supervisor was reaped", time.Since(start).Round(time.Millisecond))
}

func TestComponentIgnoringSIGTERMIsKilledAfterTheGraceOnAChange(t *testing.T) {
	t.Parallel()
	h := supervise(t, Options{StopGrace: time.Second})
	h.write("etcd", stubborn("v3.6.15"))
	old, oldProc := h.waitRunning("etcd")
	h.write("etcd", sleeper("v3.6.16", "etcd"))
	stopping := h.waitFor("etcd", "stopping", func(s *Status) error {
		if s.State != Stopping {
			return fmt.Errorf("state %s", s.State)
		}
		return nil
	})
	if stopping.PID != old.PID || stopping.Version != "v3.6.15" {
		t.Errorf("while stopping: %+v, want the old process and version", stopping)
	}
	st, _ := h.waitRunning("etcd", old.PID)
	waitGone(t, "the old etcd ended", oldProc)
	if st.Version != "v3.6.16" || st.LastExit.Signal != "killed" || st.LastExit.RanFor() < time.Second {
		t.Errorf("after the change: %+v (last exit %+v), want v3.6.16 after the old one was killed past its grace", st, st.LastExit)
	}
}

// Restart stops the named running components and starts each again at
// once, as expected exits (no backoff), and leaves the others alone: what
// a machine does once its certificates are renewed, for the components
// that read them only at start (etcd reads its own again per connection,
// and restarting every member at once would cost the quorum).
func TestRestartStartsTheNamedComponentsAgainAtOnce(t *testing.T) {
	t.Parallel()
	h := supervise(t, Options{})
	h.write("etcd", sleeper("v3.6.16", ""))
	h.write("kube-apiserver", sleeper("v1.37.2", ""))
	h.write("kube-scheduler", sleeper("v1.37.2", ""))
	_, etcd := h.waitRunning("etcd")
	_, api := h.waitRunning("kube-apiserver")
	_, sched := h.waitRunning("kube-scheduler")

	h.s.Restart("certificates renewed", "kube-apiserver", "kube-scheduler")
	st, _ := h.waitRunning("kube-apiserver", api.pid)
	if st.LastExit == nil || !st.LastExit.Expected {
		t.Errorf("kube-apiserver's last exit %+v, want an expected stop", st.LastExit)
	}
	if got := st.Started.Sub(st.LastExit.At); got >= time.Second {
		t.Errorf("kube-apiserver came back %s after it stopped, want at once", got)
	}
	h.waitRunning("kube-scheduler", sched.pid)
	waitGone(t, "the restarted components' first processes", api, sched)
	if !strings.Contains(h.log.String(), `reason="certificates renewed"`) {
		t.Errorf("the log does not say why the components were stopped:\n%s", h.log)
	}
	if st, err := ReadStatus(h.dir, "etcd"); err != nil || st.PID != etcd.pid || st.Restarts != 0 {
		t.Errorf("etcd, not named, was touched: %+v (%v); want pid %d still running", st, err, etcd.pid)
	}
}

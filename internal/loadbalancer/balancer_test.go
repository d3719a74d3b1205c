package loadbalancer

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestTrafficGoesOnlyToHealthyBackends(t *testing.T) {
	p := newTestPKI(t)
	b0, b1 := newBackend(t, p, "b0", true), newBackend(t, p, "b1", true)
	b2 := newBackend(t, p, "b2", false)
	lb, addr, _ := startBalancer(t, Config{Backends: []string{b0.addr, b1.addr, b2.addr}, HealthCheck: fastCheck(p)})
	waitHealthy(t, lb, true, b0, b1)
	waitFor(t, 5*time.Second, "b2 checked", func() error {
		if b2.checks.Load() < 2 {
			return errors.New("b2 not checked twice yet")
		}
		return nil
	})

	c := client(p)
	for i := range 30 {
		if _, err := whoami(c, addr); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if n := b2.hits.Load(); n != 0 {
		t.Errorf("b2, never ready, served %d requests", n)
	}
	// Sequential connections spread over both healthy backends.
	if b0.hits.Load() < 10 || b1.hits.Load() < 10 {
		t.Errorf("30 requests spread as b0=%d b1=%d, want at least 10 each", b0.hits.Load(), b1.hits.Load())
	}
	if s := lb.Status()[2]; s.Healthy || !strings.Contains(s.LastError, "500") {
		t.Errorf("b2's status = %+v, want unhealthy with its 500 as the reason", s)
	}
}

func TestChecksUseTheClientCertificate(t *testing.T) {
	p := newTestPKI(t)
	b0 := newBackend(t, p, "b0", true)
	anonymous := fastCheck(p)
	anonymous.TLS = &tls.Config{RootCAs: p.pool, MinVersion: tls.VersionTLS12}
	lb, _, _ := startBalancer(t, Config{Backends: []string{b0.addr}, HealthCheck: anonymous})
	waitFor(t, 5*time.Second, "an anonymous check refused", func() error {
		if s := lb.Status()[0]; !strings.Contains(s.LastError, "401") {
			return fmt.Errorf("status %+v", s)
		}
		return nil
	})
	if healthy(lb, b0.addr) {
		t.Fatal("a backend that refuses the checks is healthy")
	}

	t.Log("with the client certificate, the same backend is healthy")
	lb.SetHealthCheck(fastCheck(p))
	waitHealthy(t, lb, true, b0)
}

func TestUnhealthyBackendIsTakenOutAndComesBack(t *testing.T) {
	p := newTestPKI(t)
	b0, b1 := newBackend(t, p, "b0", true), newBackend(t, p, "b1", true)
	hc := fastCheck(p)
	lb, addr, _ := startBalancer(t, Config{Backends: []string{b0.addr, b1.addr}, HealthCheck: hc})
	waitHealthy(t, lb, true, b0, b1)

	b1.ready.Store(false)
	out := timeUntil(t, 5*time.Second, func() bool { return !healthy(lb, b1.addr) })
	t.Logf("b1 taken out %s after its /readyz started failing (FailThreshold*Interval = %s)", out, time.Duration(hc.FailThreshold)*hc.Interval)
	if limit := time.Duration(hc.FailThreshold)*hc.Interval + time.Second; out > limit {
		t.Errorf("b1 taken out after %s, want within %s", out, limit)
	}
	c := client(p)
	before := b1.hits.Load()
	for i := range 20 {
		if name, err := whoami(c, addr); err != nil || name != "b0" {
			t.Fatalf("request %d while b1 is out: %q, %v; want b0", i, name, err)
		}
	}
	if b1.hits.Load() != before {
		t.Errorf("b1 served %d requests while out", b1.hits.Load()-before)
	}

	b1.ready.Store(true)
	back := timeUntil(t, 5*time.Second, func() bool { return healthy(lb, b1.addr) })
	t.Logf("b1 back %s after recovering (RiseThreshold*Interval = %s)", back, time.Duration(hc.RiseThreshold)*hc.Interval)
	if limit := time.Duration(hc.RiseThreshold)*hc.Interval + time.Second; back > limit {
		t.Errorf("b1 back after %s, want within %s", back, limit)
	}
	for i := range 10 {
		if _, err := whoami(c, addr); err != nil {
			t.Fatalf("request %d after b1 is back: %v", i, err)
		}
	}
	if b1.hits.Load() == before {
		t.Error("b1 is back but got none of 10 new connections")
	}
}

func TestAHungCheckCountsAsAFailure(t *testing.T) {
	p := newTestPKI(t)
	b0, b1 := newBackend(t, p, "b0", true), newBackend(t, p, "b1", true)
	hc := fastCheck(p)
	hc.Timeout = 200 * time.Millisecond
	lb, _, _ := startBalancer(t, Config{Backends: []string{b0.addr, b1.addr}, HealthCheck: hc})
	waitHealthy(t, lb, true, b0, b1)

	b1.hung.Store(true)
	out := timeUntil(t, 10*time.Second, func() bool { return !healthy(lb, b1.addr) })
	limit := time.Duration(hc.FailThreshold)*(hc.Interval+hc.Timeout) + time.Second
	t.Logf("b1, hung, taken out after %s (FailThreshold*(Interval+Timeout) = %s)", out, limit-time.Second)
	if out > limit {
		t.Errorf("b1 taken out after %s, want within %s", out, limit)
	}
	if s := lb.Status()[1]; !strings.Contains(s.LastError, "deadline exceeded") {
		t.Errorf("b1's last error = %q, want its timeout", s.LastError)
	}
	if !healthy(lb, b0.addr) {
		t.Error("b0 went out with b1: one hung check held up the other's")
	}
}

// A backend whose checks get no answer is not known to be sick: an API
// server whose checks time out because its host is busy is still
// answering the requests on its connections, and one that closed its
// listener to shut down finishes them. Taking it out must not cut them
// after Drain (two requests in flight failed with "unexpected EOF" in an
// upgrade test with three clusters on two cores); a frozen one's
// connections go after SlowDrain.
func TestAQuietBackendKeepsItsConnectionsForTheSlowDrain(t *testing.T) {
	for _, tc := range []struct {
		name  string
		quiet func(*testBackend)
	}{
		{"its checks time out", func(tb *testBackend) { tb.hung.Store(true) }},
		{"it no longer listens", func(tb *testBackend) { tb.srv.Listener.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPKI(t)
			b0 := newBackend(t, p, "b0", true)
			drain, slowDrain := 200*time.Millisecond, 2*time.Second
			hc := fastCheck(p)
			hc.Timeout = 100 * time.Millisecond
			lb, addr, _ := startBalancer(t, Config{Backends: []string{b0.addr}, HealthCheck: hc, Drain: drain, SlowDrain: slowDrain})
			waitHealthy(t, lb, true, b0)
			kept := dialPersistent(t, p, addr)
			if name, err := kept.whoami(); err != nil || name != "b0" {
				t.Fatalf("first request: %q, %v; want b0", name, err)
			}

			tc.quiet(b0)
			timeUntil(t, 5*time.Second, func() bool { return !healthy(lb, b0.addr) })
			out := time.Now()
			waitFor(t, 5*time.Second, "five drain periods", func() error {
				if _, err := kept.whoami(); err != nil {
					return fmt.Errorf("the quiet backend's connection was cut after %s: %w", time.Since(out), err)
				}
				if since := time.Since(out); since < 5*drain {
					return fmt.Errorf("only %s", since)
				}
				return nil
			})

			waitFor(t, 5*time.Second, "the connection to b0 closed", kept.closed)
			if d := time.Since(out); d < slowDrain {
				t.Errorf("the connection closed %s after b0 went out, before the %s slow drain", d, slowDrain)
			}
		})
	}
}

// When every backend is out only because its checks time out (a busy
// host's API servers, all at once), they are still serving: a new
// connection goes to one of them rather than being refused. In CI all
// three API servers of a cluster went out within 2 s of each other.
func TestWhenEveryBackendIsSlowNewConnectionsStillGoToThem(t *testing.T) {
	p := newTestPKI(t)
	b0, b1 := newBackend(t, p, "b0", true), newBackend(t, p, "b1", true)
	hc := fastCheck(p)
	hc.Timeout = 100 * time.Millisecond
	lb, addr, _ := startBalancer(t, Config{Backends: []string{b0.addr, b1.addr}, HealthCheck: hc, Drain: 100 * time.Millisecond})
	waitHealthy(t, lb, true, b0, b1)

	b0.hung.Store(true)
	b1.hung.Store(true)
	waitHealthy(t, lb, false, b0, b1)
	seen := map[string]bool{}
	for range 4 {
		name, err := dialPersistent(t, p, addr).whoami()
		if err != nil {
			t.Fatalf("a new connection with every backend slow: %v", err)
		}
		seen[name] = true
	}
	if !seen["b0"] || !seen["b1"] {
		t.Errorf("the new connections went to %v, want both slow backends, by their connections", seen)
	}
}

func TestSetBackends(t *testing.T) {
	p := newTestPKI(t)
	b0, b1, b2 := newBackend(t, p, "b0", true), newBackend(t, p, "b1", true), newBackend(t, p, "b2", true)
	drain := 500 * time.Millisecond
	lb, addr, _ := startBalancer(t, Config{Backends: []string{b0.addr}, HealthCheck: fastCheck(p), Drain: drain})
	waitHealthy(t, lb, true, b0)
	kept := dialPersistent(t, p, addr)
	if name, err := kept.whoami(); err != nil || name != "b0" {
		t.Fatalf("first request: %q, %v; want b0", name, err)
	}

	t.Log("adding b1: it gets connections, and the one to b0 stays")
	added := time.Now()
	if err := lb.SetBackends([]string{b0.addr, b1.addr}); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, lb, true, b1)
	c := client(p)
	waitFor(t, 5*time.Second, "b1 serving", func() error {
		if _, err := whoami(c, addr); err != nil {
			return err
		}
		if b1.hits.Load() == 0 {
			return errors.New("b1 served nothing yet")
		}
		return nil
	})
	// A backend that stays is not drained: its connection outlives a
	// drain period (spent sending more requests).
	waitFor(t, 5*time.Second, "two drain periods of traffic", func() error {
		if _, err := whoami(c, addr); err != nil {
			return err
		}
		if since := time.Since(added); since < 2*drain {
			return fmt.Errorf("only %s since b1 was added", since)
		}
		return nil
	})
	if name, err := kept.whoami(); err != nil || name != "b0" {
		t.Fatalf("the connection to b0, which stayed: %q, %v; want b0", name, err)
	}

	t.Log("replacing b0 by b2: new connections avoid b0; its old one lasts the drain period")
	removed := time.Now()
	if err := lb.SetBackends([]string{b1.addr, b2.addr}); err != nil {
		t.Fatal(err)
	}
	if name, err := kept.whoami(); err != nil || name != "b0" {
		t.Fatalf("the connection to removed b0, within its drain period: %q, %v; want b0", name, err)
	}
	hits0 := b0.hits.Load()
	waitHealthy(t, lb, true, b2)
	for i := range 10 {
		if name, err := whoami(c, addr); err != nil || name == "b0" {
			t.Fatalf("request %d after b0's removal: %q, %v", i, name, err)
		}
	}
	if b2.hits.Load() == 0 {
		t.Error("b2, added, got none of 10 new connections")
	}
	if b0.hits.Load() != hits0 {
		t.Error("b0, removed, got a new connection")
	}
	waitFor(t, 5*time.Second, "the connection to b0 closed", kept.closed)
	if d := time.Since(removed); d < drain {
		t.Errorf("the connection to b0 closed %s after its removal, before the %s drain period", d, drain)
	}
	if got := len(lb.Status()); got != 2 {
		t.Errorf("status lists %d backends, want 2", got)
	}
	if err := lb.SetBackends([]string{"no-port"}); err == nil {
		t.Error("SetBackends accepted an address without a port")
	}
}

func TestConnectionsToAnUnhealthyBackendAreDrained(t *testing.T) {
	p := newTestPKI(t)
	b0 := newBackend(t, p, "b0", true)
	drain := 600 * time.Millisecond
	lb, addr, _ := startBalancer(t, Config{Backends: []string{b0.addr}, HealthCheck: fastCheck(p), Drain: drain})
	waitHealthy(t, lb, true, b0)
	kept := dialPersistent(t, p, addr)
	if name, err := kept.whoami(); err != nil || name != "b0" {
		t.Fatalf("first request: %q, %v; want b0", name, err)
	}

	t.Log("b0 fails and recovers within the drain period: its connection stays")
	b0.ready.Store(false)
	timeUntil(t, 5*time.Second, func() bool { return !healthy(lb, b0.addr) })
	out := time.Now()
	b0.ready.Store(true)
	timeUntil(t, 5*time.Second, func() bool { return healthy(lb, b0.addr) })
	if d := time.Since(out); d >= drain {
		t.Fatalf("b0 took %s to come back, longer than the %s drain period: the test proves nothing", d, drain)
	}
	waitFor(t, 5*time.Second, "two drain periods of traffic", func() error {
		if _, err := kept.whoami(); err != nil {
			return fmt.Errorf("the connection to b0, back in time, was closed: %w", err)
		}
		if since := time.Since(out); since < 2*drain {
			return fmt.Errorf("only %s since b0 went out", since)
		}
		return nil
	})

	t.Log("b0 fails for good: its connection lasts the drain period, then is closed")
	b0.ready.Store(false)
	timeUntil(t, 5*time.Second, func() bool { return !healthy(lb, b0.addr) })
	out = time.Now()
	if _, err := kept.whoami(); err != nil {
		t.Fatalf("the connection to b0 closed at once: %v", err)
	}
	waitFor(t, 5*time.Second, "the connection to b0 closed", kept.closed)
	if d := time.Since(out); d < drain {
		t.Errorf("the connection closed %s after b0 went out, before the %s drain period", d, drain)
	}
	if s := lb.Status()[0]; s.Connections != 0 {
		t.Errorf("b0 counts %d connections after its drain", s.Connections)
	}
}

func TestNoHealthyBackendRefusesPromptly(t *testing.T) {
	p := newTestPKI(t)
	b0 := newBackend(t, p, "b0", false)
	for _, tc := range []struct {
		name     string
		backends []string
	}{
		{"every backend failing", []string{b0.addr}},
		{"no backend", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lb, addr, _ := startBalancer(t, Config{Backends: tc.backends, HealthCheck: fastCheck(p)})
			waitFor(t, 5*time.Second, "a failed check", func() error {
				for _, s := range lb.Status() {
					if s.LastError == "" {
						return fmt.Errorf("status %+v", s)
					}
				}
				return nil
			})
			start := time.Now()
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr,
				&tls.Config{RootCAs: p.pool, MinVersion: tls.VersionTLS12})
			took := time.Since(start)
			if err == nil {
				conn.Close()
				t.Fatal("a TLS connection through the balancer succeeded with no healthy backend")
			}
			t.Logf("refused after %s: %v", took, err)
			if took > time.Second {
				t.Errorf("refusing took %s, want well under a second", took)
			}
		})
	}
}

// TestFailover runs a client that sends requests through the balancer, one
// connection each, while one of three backends fails, and bounds the time
// it sees errors.
func TestFailover(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(*testBackend)
		// window bounds the time from the failure to the client's last error.
		window func(HealthCheck) time.Duration
		// maxFailures bounds the client's errors, if not negative.
		maxFailures int
	}{
		{
			// Its connections are cut and new ones refused: connecting to
			// the next backend hides it even before the checks notice.
			// Only the request in flight on the cut connection may fail.
			name:        "killed",
			fail:        func(b *testBackend) { b.ready.Store(false); b.kill() },
			window:      func(HealthCheck) time.Duration { return 250 * time.Millisecond },
			maxFailures: 1,
		},
		{
			// It accepts connections but fails requests, as an API server
			// that lost etcd does: the checks must take it out.
			name: "sick",
			fail: func(b *testBackend) { b.ready.Store(false); b.sick.Store(true) },
			window: func(hc HealthCheck) time.Duration {
				return time.Duration(hc.FailThreshold)*hc.Interval + 750*time.Millisecond
			},
			maxFailures: -1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPKI(t)
			bs := []*testBackend{newBackend(t, p, "b0", true), newBackend(t, p, "b1", true), newBackend(t, p, "b2", true)}
			hc := fastCheck(p)
			lb, addr, _ := startBalancer(t, Config{Backends: []string{bs[0].addr, bs[1].addr, bs[2].addr}, HealthCheck: hc})
			waitHealthy(t, lb, true, bs...)

			var (
				mu       sync.Mutex
				failures []time.Time
				requests int
				lastErr  error
			)
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				c := client(p)
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, err := whoami(c, addr)
					mu.Lock()
					requests++
					if err != nil {
						failures = append(failures, time.Now())
						lastErr = err
					}
					mu.Unlock()
				}
			}()
			waitFor(t, 5*time.Second, "the client running", func() error {
				mu.Lock()
				defer mu.Unlock()
				if requests < 20 {
					return errors.New("fewer than 20 requests yet")
				}
				return nil
			})
			failed := time.Now()
			tc.fail(bs[1])
			timeUntil(t, 5*time.Second, func() bool { return !healthy(lb, bs[1].addr) })
			// Keep the client running a while after: no error may follow.
			after := bs[0].hits.Load() + bs[2].hits.Load()
			waitFor(t, 5*time.Second, "50 more requests served", func() error {
				if bs[0].hits.Load()+bs[2].hits.Load() < after+50 {
					return errors.New("not yet")
				}
				return nil
			})
			close(stop)
			<-done

			mu.Lock()
			defer mu.Unlock()
			window := time.Duration(0)
			if len(failures) > 0 {
				window = failures[len(failures)-1].Sub(failed)
			}
			t.Logf("%d requests, %d failed, the last %s after b1 failed (last error: %v); bound %s",
				requests, len(failures), window, lastErr, tc.window(hc))
			if window > tc.window(hc) {
				t.Errorf("the client saw errors for %s after b1 failed, want at most %s", window, tc.window(hc))
			}
			if tc.maxFailures >= 0 && len(failures) > tc.maxFailures {
				t.Errorf("the client saw %d errors, want at most %d", len(failures), tc.maxFailures)
			}
		})
	}
}

func TestServeEndsEverything(t *testing.T) {
	p := newTestPKI(t)
	b0, b1 := newBackend(t, p, "b0", true), newBackend(t, p, "b1", true)
	before := runtime.NumGoroutine()

	lb, addr, cancel := startBalancer(t, Config{Backends: []string{b0.addr, b1.addr}, HealthCheck: fastCheck(p)})
	waitHealthy(t, lb, true, b0, b1)
	var open []*persistentConn
	for range 4 {
		pc := dialPersistent(t, p, addr)
		if _, err := pc.whoami(); err != nil {
			t.Fatal(err)
		}
		open = append(open, pc)
	}
	if err := lb.SetBackends([]string{b1.addr}); err != nil { // a drain timer pending
		t.Fatal(err)
	}
	if n := runtime.NumGoroutine(); n <= before {
		t.Fatalf("%d goroutines while serving, %d before: the count does not see the balancer", n, before)
	}

	cancel()
	for i, pc := range open {
		waitFor(t, 5*time.Second, fmt.Sprintf("connection %d closed", i), pc.closed)
	}
	waitFor(t, 5*time.Second, "the listener closed", func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return errors.New("still accepting")
		}
		return nil
	})
	// Ours, the proxied connections' and the backends' goroutines for
	// them: all gone.
	waitFor(t, 5*time.Second, "the goroutines gone", func() error {
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<16)
			return fmt.Errorf("%d goroutines, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
		}
		return nil
	})
}

func TestNewRejectsBadAddresses(t *testing.T) {
	if _, err := New(Config{Backends: []string{"127.0.0.1"}}); err == nil {
		t.Error("New accepted a backend without a port")
	}
	b, err := New(Config{Backends: []string{"127.0.0.1:1", "127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(b.Status()); n != 1 {
		t.Errorf("a backend listed twice counts %d times", n)
	}
}

// timeUntil polls cond every few milliseconds, to measure how long it
// takes to hold, failing the test after timeout.
func timeUntil(t testing.TB, timeout time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("not true after %s", timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return time.Since(start)
}

// A draining backend (an API server about to be restarted for an upgrade)
// takes no new connection, but its open ones stay, even when it fails its
// checks, for it to close gracefully: cutting them would fail the requests
// in flight. Back from draining, it takes connections again.
func TestDrainingBackendKeepsItsConnectionsAndTakesNoNewOnes(t *testing.T) {
	p := newTestPKI(t)
	b0 := newBackend(t, p, "b0", true)
	b1 := newBackend(t, p, "b1", true)
	drain := 300 * time.Millisecond
	lb, addr, _ := startBalancer(t, Config{Backends: []string{b0.addr}, HealthCheck: fastCheck(p), Drain: drain})
	waitHealthy(t, lb, true, b0)
	kept := dialPersistent(t, p, addr)
	if name, err := kept.whoami(); err != nil || name != "b0" {
		t.Fatalf("first request: %q, %v; want b0", name, err)
	}
	if err := lb.SetBackends([]string{b0.addr, b1.addr}); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, lb, true, b1)

	lb.SetDraining([]string{b0.addr})
	b0.ready.Store(false) // shutting down: its /readyz fails first
	timeUntil(t, 5*time.Second, func() bool { return !healthy(lb, b0.addr) })
	for range 5 {
		c := dialPersistent(t, p, addr)
		if name, err := c.whoami(); err != nil || name != "b1" {
			t.Fatalf("a new connection while b0 drains went to %q (%v), want b1", name, err)
		}
	}
	out := time.Now()
	waitFor(t, 5*time.Second, "three drain periods", func() error {
		if _, err := kept.whoami(); err != nil {
			return fmt.Errorf("the draining backend's connection was cut: %w", err)
		}
		if since := time.Since(out); since < 3*drain {
			return fmt.Errorf("only %s", since)
		}
		return nil
	})

	b0.ready.Store(true)
	lb.SetDraining(nil)
	timeUntil(t, 5*time.Second, func() bool { return healthy(lb, b0.addr) })
	seen := map[string]bool{}
	for range 6 {
		c := dialPersistent(t, p, addr)
		name, err := c.whoami()
		if err != nil {
			t.Fatal(err)
		}
		seen[name] = true
	}
	if !seen["b0"] {
		t.Errorf("b0, back from draining and healthy, took no new connection: %v", seen)
	}
}

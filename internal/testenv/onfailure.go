package testenv

import (
	"sync"
	"testing"
)

// A failing test's reason must be the last thing it prints: CI reports
// show only the tail of a failed test's output, and diagnostics logged
// by cleanups (a balancer's events, marina up's lines) come after
// t.Fatalf and push the reason out of sight. OnFailure's functions run
// before Eventually's and Fatalf's message instead.

var onFailure = struct {
	sync.Mutex
	fns map[testing.TB][]func()
}{fns: map[testing.TB][]func(){}}

// OnFailure registers fn to log what the test's parts were doing, should
// t fail: it runs before the message of a failing Eventually or Fatalf,
// or at cleanup for a failure reported otherwise. Each fn runs once.
func OnFailure(t testing.TB, fn func()) {
	onFailure.Lock()
	first := len(onFailure.fns[t]) == 0
	onFailure.fns[t] = append(onFailure.fns[t], fn)
	onFailure.Unlock()
	if first {
		t.Cleanup(func() {
			if t.Failed() {
				Explain(t)
			}
			onFailure.Lock()
			delete(onFailure.fns, t)
			onFailure.Unlock()
		})
	}
}

// Fatalf logs what OnFailure registered for t, then fails t with the
// message.
func Fatalf(t testing.TB, format string, args ...any) {
	t.Helper()
	Explain(t)
	t.Fatalf(format, args...)
}

// Explain runs t's registered functions now, the latest first (as
// cleanups run), and forgets them: for a test about to report a failure
// with t.Errorf and go on.
func Explain(t testing.TB) {
	onFailure.Lock()
	fns := onFailure.fns[t]
	onFailure.fns[t] = nil
	onFailure.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

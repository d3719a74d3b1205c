package machineset

import (
	"testing"
	"time"
)

func TestThrottle(t *testing.T) {
	th := NewThrottle(0)
	if th.Interval != time.Second {
		t.Fatalf("default interval %s", th.Interval)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if w := th.Wait("a", t0); w != 0 {
		t.Errorf("first write held back %s", w)
	}
	th.Wrote("a", t0)
	if w := th.Wait("a", t0.Add(300*time.Millisecond)); w != 700*time.Millisecond {
		t.Errorf("second write within the interval: wait %s, want 700ms", w)
	}
	if w := th.Wait("b", t0.Add(300*time.Millisecond)); w != 0 {
		t.Errorf("another object held back %s", w)
	}
	if w := th.Wait("a", t0.Add(time.Second)); w != 0 {
		t.Errorf("after the interval: wait %s", w)
	}
	if w := NewThrottle(-1).Wait("a", t0); w != 0 {
		t.Errorf("a disabled throttle held back %s", w)
	}
}

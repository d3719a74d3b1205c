package machineset

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Throttle spaces out writes about one object. During a rollout every
// machine event moves a set's and a deployment's counts; writing each change
// at once would cost several management API writes per machine, while
// nothing decides on those counts (the deployment counts machines itself),
// so they may lag by the interval. Callers write at once whatever a user
// is waiting for (a new generation). What it remembers is per process: after
// a restart the first write is immediate.
type Throttle struct {
	// Interval is the least time between two throttled writes; 0 never
	// holds a write back.
	Interval time.Duration
	mu       sync.Mutex
	last     map[types.UID]time.Time
}

// NewThrottle returns a throttle with the given interval: 0 means one
// second, a negative one never holds a write back.
func NewThrottle(interval time.Duration) *Throttle {
	switch {
	case interval == 0:
		interval = time.Second
	case interval < 0:
		interval = 0
	}
	return &Throttle{Interval: interval}
}

// Wait returns 0 when a write about uid may happen now, else how long to
// wait before trying again.
func (t *Throttle) Wait(uid types.UID, now time.Time) time.Duration {
	if t.Interval <= 0 {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if last, ok := t.last[uid]; ok {
		if wait := last.Add(t.Interval).Sub(now); wait > 0 {
			return wait
		}
	}
	return 0
}

// Wrote records a write about uid at now.
func (t *Throttle) Wrote(uid types.UID, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last == nil {
		t.last = map[types.UID]time.Time{}
	}
	if len(t.last) > 1024 {
		// Forget objects not written lately, deleted ones among them.
		for k, v := range t.last {
			if now.Sub(v) > t.Interval {
				delete(t.last, k)
			}
		}
	}
	t.last[uid] = now
}

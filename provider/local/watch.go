package local

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"marina.dev/marina/internal/nodeagent/sandbox"
)

// defaultStateScan is how often WatchStates looks at every sandbox's lock
// when Options.StateScan is zero: a killed agent is seen within it. A look
// is one open and one flock per sandbox, a few milliseconds for a fleet of
// a thousand.
const defaultStateScan = 2 * time.Second

// WatchStates implements provider.StateWatcher: every Options.StateScan it
// probes the lock of every sandbox and names those whose agent stopped or
// started since the last look (a killed agent, a killed pool: all its
// members), and those that appeared stopped (one killed within a look of
// its start). The first look only learns: the controller's first pass
// after a start looks at every machine anyway.
func (p *Provider) WatchStates(ctx context.Context, changed func(types.UID)) {
	running := map[types.UID]bool{}
	first := true
	tick := time.NewTicker(p.opts.StateScan)
	defer tick.Stop()
	for {
		if uids, err := p.UIDs(); err == nil {
			seen := make(map[types.UID]bool, len(uids))
			for _, uid := range uids {
				held, err := sandbox.Held(p.sandboxDir(uid))
				if err != nil {
					continue // gone while we looked, or unreadable: next time
				}
				seen[uid] = true
				was, known := running[uid]
				if (known && was != held) || (!known && !held && !first) {
					changed(uid)
				}
				running[uid] = held
			}
			for uid := range running {
				if !seen[uid] {
					delete(running, uid)
				}
			}
			first = false
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

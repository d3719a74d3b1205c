package safety

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestOvershoots(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	grace := 30 * time.Second
	for _, tc := range []struct {
		name                 string
		set                  Set
		seen                 map[types.UID]time.Time
		now                  time.Time
		wantFreeze, wantThaw string
		wantSeen             string
	}{
		{"in bounds: nothing", Set{UID: "s", Machines: 4, Bound: 4}, nil, t0, "[]", "[]", "map[]"},
		{"above, first seen: only noted", Set{UID: "s", Machines: 5, Bound: 4}, nil, t0, "[]", "[]", "map[s:12:00:00]"},
		{"above within grace: kept noted", Set{UID: "s", Machines: 5, Bound: 4}, map[types.UID]time.Time{"s": t0}, t0.Add(grace - time.Second), "[]", "[]", "map[s:12:00:00]"},
		{"above for grace: frozen", Set{UID: "s", Machines: 5, Bound: 4}, map[types.UID]time.Time{"s": t0}, t0.Add(grace), "[s]", "[]", "map[]"},
		{"frozen and still above: left frozen", Set{UID: "s", Machines: 9, Bound: 4, Frozen: true}, nil, t0, "[]", "[]", "map[]"},
		{"frozen, back in bounds: thawed", Set{UID: "s", Machines: 4, Bound: 4, Frozen: true}, nil, t0, "[]", "[s]", "map[]"},
		{"back in bounds before grace: forgotten", Set{UID: "s", Machines: 3, Bound: 4}, map[types.UID]time.Time{"s": t0}, t0.Add(time.Second), "[]", "[]", "map[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			freeze, thaw, next := Overshoots([]Set{tc.set}, tc.seen, tc.now, grace)
			seen := map[types.UID]string{}
			for k, v := range next {
				seen[k] = v.Format("15:04:05")
			}
			if got := fmt.Sprint(freeze); got != tc.wantFreeze {
				t.Errorf("freeze = %s, want %s", got, tc.wantFreeze)
			}
			if got := fmt.Sprint(thaw); got != tc.wantThaw {
				t.Errorf("thaw = %s, want %s", got, tc.wantThaw)
			}
			if got := fmt.Sprint(seen); got != tc.wantSeen {
				t.Errorf("seen = %s, want %s", got, tc.wantSeen)
			}
		})
	}
}

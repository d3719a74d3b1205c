package safety

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestOrphans(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	grace := 2 * time.Minute
	known := map[types.UID]bool{"a": true}
	for _, tc := range []struct {
		name       string
		made       []types.UID
		seen       map[types.UID]time.Time
		now        time.Time
		wantRemove string
		wantSeen   string
	}{
		{"owned machines are never orphans", []types.UID{"a"}, nil, t0, "[]", "map[]"},
		{"a new orphan is only noted", []types.UID{"a", "b"}, nil, t0, "[]", "map[b:12:00:00]"},
		{"within grace it is kept", []types.UID{"b"}, map[types.UID]time.Time{"b": t0}, t0.Add(grace - time.Second), "[]", "map[b:12:00:00]"},
		{"after grace it goes", []types.UID{"b"}, map[types.UID]time.Time{"b": t0}, t0.Add(grace), "[b]", "map[]"},
		{"one that got its Machine back is forgotten", []types.UID{"a"}, map[types.UID]time.Time{"a": t0}, t0.Add(time.Hour), "[]", "map[]"},
		{"one gone from the provider is forgotten", nil, map[types.UID]time.Time{"b": t0}, t0.Add(time.Second), "[]", "map[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			remove, next := Orphans(tc.made, known, tc.seen, tc.now, grace)
			seen := map[types.UID]string{}
			for k, v := range next {
				seen[k] = v.Format("15:04:05")
			}
			if got := fmt.Sprint(remove); got != tc.wantRemove && !(got == "[]" && tc.wantRemove == "[]") {
				t.Errorf("remove = %v, want %s", remove, tc.wantRemove)
			}
			if got := fmt.Sprint(seen); got != tc.wantSeen {
				t.Errorf("seen = %s, want %s", got, tc.wantSeen)
			}
		})
	}
}

package rollout

import (
	"fmt"
	"maps"
	"testing"

	"k8s.io/apimachinery/pkg/util/intstr"
)

func num(n int) intstr.IntOrString    { return intstr.FromInt32(int32(n)) }
func pct(s string) intstr.IntOrString { return intstr.FromString(s) }

func TestBounds(t *testing.T) {
	tests := []struct {
		name                  string
		replicas              int32
		surge, unavailable    intstr.IntOrString
		wantSurge, wantUnavai int32
		wantErr               bool
	}{
		{"numbers", 10, num(2), num(0), 2, 0, false},
		{"surge percent rounds up", 10, pct("25%"), num(0), 3, 0, false},
		{"unavailable percent rounds down", 10, num(0), pct("25%"), 0, 2, false},
		{"10% of 100", 100, pct("10%"), num(0), 10, 0, false},
		{"1% of 1 surges one", 1, pct("1%"), num(0), 1, 0, false},
		{"both round to zero: one unavailable", 5, num(0), pct("10%"), 0, 1, false},
		{"zero replicas", 0, pct("25%"), pct("25%"), 0, 0, false},
		{"unavailable above replicas is all of them", 3, num(0), num(5), 0, 3, false},
		{"malformed percent", 10, pct("ten%"), num(0), 0, 0, true},
		{"negative", 10, num(-1), num(0), 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, u, err := Bounds(tt.replicas, tt.surge, tt.unavailable)
			if (err != nil) != tt.wantErr {
				t.Fatalf("error %v, want error %v", err, tt.wantErr)
			}
			if err == nil && (s != tt.wantSurge || u != tt.wantUnavai) {
				t.Errorf("surge %d unavailable %d, want %d %d", s, u, tt.wantSurge, tt.wantUnavai)
			}
		})
	}
}

// set builds a steady set: replicas machines, all of them available.
func set(name string, rev int64, replicas int32) Set {
	return Set{Name: name, Revision: rev, Replicas: replicas, Actual: replicas, Available: replicas}
}

func TestRollingUpdate(t *testing.T) {
	tests := []struct {
		name string
		in   Input
		want Plan
	}{
		{
			name: "new template, surge 2: create the new set with 2, keep old",
			in:   Input{Replicas: 10, MaxSurge: num(2), MaxUnavailable: num(0), Old: []Set{set("a", 1, 10)}},
			want: Plan{NewReplicas: 2},
		},
		{
			name: "new machines not Ready yet: wait",
			in: Input{Replicas: 10, MaxSurge: num(2), MaxUnavailable: num(0),
				New: &Set{Name: "b", Replicas: 2, Actual: 2}, Old: []Set{set("a", 1, 10)}},
			want: Plan{NewReplicas: 2},
		},
		{
			name: "new machines Ready: old shrinks by what is available above replicas",
			in: Input{Replicas: 10, MaxSurge: num(2), MaxUnavailable: num(0),
				New: &Set{Name: "b", Replicas: 2, Actual: 2, Available: 2}, Old: []Set{set("a", 1, 10)}},
			want: Plan{NewReplicas: 2, Old: map[string]int32{"a": 8}},
		},
		{
			name: "old set has not removed its machines yet: no second cut, no surge",
			in: Input{Replicas: 10, MaxSurge: num(2), MaxUnavailable: num(0),
				New: &Set{Name: "b", Replicas: 2, Actual: 2, Available: 2},
				Old: []Set{{Name: "a", Revision: 1, Replicas: 8, Actual: 10, Available: 10}}},
			want: Plan{NewReplicas: 2},
		},
		{
			name: "old machines gone: the new set grows again",
			in: Input{Replicas: 10, MaxSurge: num(2), MaxUnavailable: num(0),
				New: &Set{Name: "b", Replicas: 2, Actual: 2, Available: 2}, Old: []Set{set("a", 1, 8)}},
			want: Plan{NewReplicas: 4},
		},
		{
			name: "maxSurge 0: old goes first, by maxUnavailable",
			in:   Input{Replicas: 4, MaxSurge: num(0), MaxUnavailable: num(1), Old: []Set{set("a", 1, 4)}},
			want: Plan{NewReplicas: 0, Old: map[string]int32{"a": 3}},
		},
		{
			name: "maxSurge 0: the freed slot goes to the new set",
			in: Input{Replicas: 4, MaxSurge: num(0), MaxUnavailable: num(1),
				New: &Set{Name: "b"}, Old: []Set{set("a", 1, 3)}},
			want: Plan{NewReplicas: 1},
		},
		{
			name: "maxUnavailable 0 and maxSurge 1: one at a time",
			in:   Input{Replicas: 3, MaxSurge: num(1), MaxUnavailable: num(0), Old: []Set{set("a", 1, 3)}},
			want: Plan{NewReplicas: 1},
		},
		{
			name: "percentages, next pass: 2 old machines may be unavailable",
			in: Input{Replicas: 10, MaxSurge: pct("25%"), MaxUnavailable: pct("25%"),
				New: &Set{Name: "b", Replicas: 3, Actual: 3}, Old: []Set{set("a", 1, 10)}},
			want: Plan{NewReplicas: 3, Old: map[string]int32{"a": 8}},
		},
		{
			name: "percentages: 25% of 10 surges 3 and allows 2 unavailable",
			in:   Input{Replicas: 10, MaxSurge: pct("25%"), MaxUnavailable: pct("25%"), Old: []Set{set("a", 1, 10)}},
			// The old set shrinks on the next pass, once the new machines
			// exist and count in the availability sums.
			want: Plan{NewReplicas: 3},
		},
		{
			name: "template changed mid-rollout: both older sets are old, the oldest shrinks first",
			in: Input{Replicas: 10, MaxSurge: num(2), MaxUnavailable: num(0),
				New: nil,
				Old: []Set{set("b", 2, 4), set("a", 1, 6)}},
			want: Plan{NewReplicas: 2},
		},
		{
			name: "template changed mid-rollout: availability freed is taken from the oldest",
			in: Input{Replicas: 10, MaxSurge: num(2), MaxUnavailable: num(0),
				New: &Set{Name: "c", Replicas: 2, Actual: 2, Available: 2},
				Old: []Set{set("b", 2, 4), set("a", 1, 6)}},
			want: Plan{NewReplicas: 2, Old: map[string]int32{"a": 4}},
		},
		{
			name: "template changed mid-rollout: unready machines of the previous new set go first",
			in: Input{Replicas: 10, MaxSurge: num(2), MaxUnavailable: num(0),
				New: &Set{Name: "c", Replicas: 2, Actual: 2, Available: 2},
				Old: []Set{{Name: "b", Revision: 2, Replicas: 2, Actual: 2, Available: 0}, set("a", 1, 10)}},
			want: Plan{NewReplicas: 2, Old: map[string]int32{"b": 0, "a": 8}},
		},
		{
			name: "scaled up during a rollout: the extra machines go to the new set",
			in: Input{Replicas: 14, MaxSurge: num(2), MaxUnavailable: num(0),
				New: &Set{Name: "b", Replicas: 2, Actual: 2, Available: 2}, Old: []Set{set("a", 1, 8)}},
			want: Plan{NewReplicas: 8},
		},
		{
			name: "scaled down during a rollout: old machines go first",
			in: Input{Replicas: 6, MaxSurge: num(2), MaxUnavailable: num(0),
				New: &Set{Name: "b", Replicas: 2, Actual: 2, Available: 2}, Old: []Set{set("a", 1, 8)}},
			want: Plan{NewReplicas: 2, Old: map[string]int32{"a": 4}},
		},
		{
			name: "scaled below the new set: the new set is trimmed",
			in: Input{Replicas: 2, MaxSurge: num(1), MaxUnavailable: num(0),
				New: &Set{Name: "b", Replicas: 4, Actual: 4, Available: 4}, Old: []Set{set("a", 1, 2)}},
			want: Plan{NewReplicas: 2, Old: map[string]int32{"a": 0}},
		},
		{
			name: "new machines never Ready: nothing old goes, nothing more is created",
			in: Input{Replicas: 10, MaxSurge: num(2), MaxUnavailable: num(1),
				New: &Set{Name: "b", Replicas: 3, Actual: 3, Available: 0}, Old: []Set{set("a", 1, 9)}},
			want: Plan{NewReplicas: 3},
		},
		{
			name: "unready old machines are removed first, without losing availability",
			in: Input{Replicas: 10, MaxSurge: num(2), MaxUnavailable: num(0),
				New: &Set{Name: "b", Replicas: 2, Actual: 2, Available: 2},
				Old: []Set{{Name: "a", Revision: 1, Replicas: 10, Actual: 10, Available: 7}}},
			want: Plan{NewReplicas: 2, Old: map[string]int32{"a": 8}},
		},
		{
			name: "draining old machines still count against the surge",
			in: Input{Replicas: 10, MaxSurge: num(2), MaxUnavailable: num(0),
				New: &Set{Name: "b", Replicas: 2, Actual: 2, Available: 2},
				Old: []Set{{Name: "a", Revision: 1, Replicas: 8, Actual: 9, Available: 8}}},
			want: Plan{NewReplicas: 3},
		},
		{
			name: "done: nothing to change",
			in: Input{Replicas: 3, MaxSurge: num(1), MaxUnavailable: num(0),
				New: &Set{Name: "b", Replicas: 3, Actual: 3, Available: 3}, Old: []Set{set("a", 1, 0)}},
			want: Plan{NewReplicas: 3},
		},
		{
			name: "scale to zero mid-rollout",
			in: Input{Replicas: 0, MaxSurge: num(1), MaxUnavailable: num(0),
				New: &Set{Name: "b", Replicas: 1, Actual: 1, Available: 1}, Old: []Set{set("a", 1, 3)}},
			want: Plan{NewReplicas: 0, Old: map[string]int32{"a": 0}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := RollingUpdate(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if tt.want.Old == nil {
				tt.want.Old = map[string]int32{}
			}
			if got.NewReplicas != tt.want.NewReplicas || !maps.Equal(got.Old, tt.want.Old) {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

func TestOnDelete(t *testing.T) {
	tests := []struct {
		name string
		in   Input
		want Plan
	}{
		{"template changed: nothing moves", Input{Replicas: 3, Old: []Set{set("a", 1, 3)}}, Plan{NewReplicas: 0}},
		{"an old machine is being deleted: replaced from the new template",
			Input{Replicas: 3, New: &Set{Name: "b"}, Old: []Set{{Name: "a", Revision: 1, Replicas: 3, Actual: 3, Deleting: 1}}},
			Plan{NewReplicas: 1, Old: map[string]int32{"a": 2}}},
		{"scaled down: old machines go, oldest set first",
			Input{Replicas: 2, New: &Set{Name: "c", Replicas: 1, Actual: 1}, Old: []Set{set("b", 2, 1), set("a", 1, 2)}},
			Plan{NewReplicas: 1, Old: map[string]int32{"a": 0}}},
		{"scaled down with a marked machine of the new template: that one goes",
			Input{Replicas: 3, New: &Set{Name: "b", Replicas: 2, Actual: 2, Marked: 1}, Old: []Set{set("a", 1, 2)}},
			Plan{NewReplicas: 1}},
		{"scaled down with a marked old machine: its set gives it up",
			Input{Replicas: 3, New: &Set{Name: "c", Replicas: 1, Actual: 1}, Old: []Set{{Name: "b", Revision: 2, Replicas: 2, Actual: 2, Marked: 1}, set("a", 1, 1)}},
			Plan{NewReplicas: 1, Old: map[string]int32{"b": 1}}},
		{"a marked machine without a scale-down stays",
			Input{Replicas: 4, New: &Set{Name: "b", Replicas: 2, Actual: 2, Marked: 1}, Old: []Set{set("a", 1, 2)}},
			Plan{NewReplicas: 2}},
		{"scaled up: new machines come from the new template",
			Input{Replicas: 5, New: &Set{Name: "b", Replicas: 1, Actual: 1}, Old: []Set{set("a", 1, 2)}},
			Plan{NewReplicas: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := OnDelete(tt.in)
			if tt.want.Old == nil {
				tt.want.Old = map[string]int32{}
			}
			if got.NewReplicas != tt.want.NewReplicas || !maps.Equal(got.Old, tt.want.Old) {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

// TestRollingUpdateConverges plays whole rollouts: after each plan the
// sets act one step at a time (create, a new machine gets Ready, delete),
// with deletions lagging a step behind, and the invariants users rely on
// are checked at every step.
func TestRollingUpdateConverges(t *testing.T) {
	tests := []struct {
		replicas           int32
		surge, unavailable intstr.IntOrString
	}{
		{10, num(2), num(0)},
		{10, num(0), num(3)},
		{10, pct("25%"), pct("25%")},
		{100, pct("10%"), num(0)},
		{1, num(1), num(0)},
		{5, num(0), pct("10%")},
		{7, num(3), num(2)},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d-%s-%s", tt.replicas, tt.surge.String(), tt.unavailable.String()), func(t *testing.T) {
			surge, unavailable, _ := Bounds(tt.replicas, tt.surge, tt.unavailable)
			old := set("a", 1, tt.replicas)
			var newSet *Set
			for step := 0; step < 1000; step++ {
				in := Input{Replicas: tt.replicas, MaxSurge: tt.surge, MaxUnavailable: tt.unavailable, New: newSet, Old: []Set{old}}
				if Done(in) {
					return
				}
				plan, err := RollingUpdate(in)
				if err != nil {
					t.Fatal(err)
				}
				if newSet == nil {
					newSet = &Set{Name: "b", Revision: 2}
				}
				newSet.Replicas = plan.NewReplicas
				if r, ok := plan.Old["a"]; ok {
					old.Replicas = r
				}
				// The sets act: the old one removes one machine over its
				// replicas (available ones last), the new one creates what it
				// lacks and one of its machines gets Ready.
				if old.Actual > old.Replicas {
					old.Actual--
					old.Available = min(old.Available, old.Actual)
				}
				if newSet.Actual < newSet.Replicas {
					newSet.Actual = newSet.Replicas
				} else if newSet.Available < newSet.Actual {
					newSet.Available++
				}
				if total := old.Actual + newSet.Actual; total > tt.replicas+surge {
					t.Fatalf("step %d: %d machines, more than replicas %d + surge %d", step, total, tt.replicas, surge)
				}
				if avail := old.Available + newSet.Available; avail < tt.replicas-unavailable {
					t.Fatalf("step %d: %d available, fewer than replicas %d - unavailable %d", step, avail, tt.replicas, unavailable)
				}
			}
			t.Fatalf("no convergence: new %+v old %+v", *newSet, old)
		})
	}
}

// sized is a set of a deployment last scaled to scaledFor replicas.
func sized(s Set, scaledFor int32) Set { s.ScaledFor = scaledFor; return s }

func TestScale(t *testing.T) {
	stuck := func(replicas, scaledFor int32) *Set {
		return &Set{Name: "b", Revision: 2, Replicas: replicas, Actual: replicas, ScaledFor: scaledFor}
	}
	tests := []struct {
		name   string
		in     Input
		want   Plan
		wantOK bool
	}{
		{
			name: "scaled up during a stuck rollout: the new capacity is spread, not all on the stuck template",
			in: Input{Replicas: 20, MaxSurge: num(2), MaxUnavailable: num(0),
				New: stuck(2, 10), Old: []Set{sized(set("a", 1, 10), 10)}},
			// 22 machines allowed, 12 held: a 10*22/12 = 18, b 2*22/12 = 4.
			want: Plan{NewReplicas: 4, Old: map[string]int32{"a": 18}}, wantOK: true,
		},
		{
			name: "scaled up while old machines drain: growth stays within the surge",
			in: Input{Replicas: 20, MaxSurge: num(2), MaxUnavailable: num(0),
				New: stuck(2, 10), Old: []Set{sized(Set{Name: "a", Revision: 1, Replicas: 10, Actual: 14, Deleting: 4, Available: 10}, 10)}},
			// 22 allowed, 16 machines: 6 more, a 10*22/12 = 18 -> +6, b none.
			want: Plan{NewReplicas: 2, Old: map[string]int32{"a": 16}}, wantOK: true,
		},
		{
			name: "scaled down during a rollout: proportionally, the largest set absorbs the rounding",
			in: Input{Replicas: 5, MaxSurge: num(1), MaxUnavailable: num(0),
				New: &Set{Name: "b", Revision: 2, Replicas: 3, Actual: 3, Available: 3, ScaledFor: 10}, Old: []Set{sized(set("a", 1, 8), 10)}},
			// 6 allowed, 11 held: a 8*6/11 = 4.36 -> 4, b 3*6/11 = 1.6 -> 2.
			want: Plan{NewReplicas: 2, Old: map[string]int32{"a": 4}}, wantOK: true,
		},
		{
			name: "the autoscaler marked a new machine and lowered replicas: the new set gives it up",
			in: Input{Replicas: 3, MaxSurge: num(1), MaxUnavailable: num(0),
				New: &Set{Name: "b", Revision: 2, Replicas: 2, Actual: 2, Available: 2, Marked: 1, ScaledFor: 4}, Old: []Set{sized(set("a", 1, 2), 4)}},
			want: Plan{NewReplicas: 1}, wantOK: true,
		},
		{
			name: "a marked old machine goes from its old set",
			in: Input{Replicas: 3, MaxSurge: num(1), MaxUnavailable: num(0),
				New: &Set{Name: "b", Revision: 2, Replicas: 2, Actual: 2, Available: 2, ScaledFor: 4}, Old: []Set{{Name: "a", Revision: 1, Replicas: 2, Actual: 2, Available: 2, Marked: 1, ScaledFor: 4}}},
			want: Plan{NewReplicas: 2, Old: map[string]int32{"a": 1}}, wantOK: true,
		},
		{
			name: "marked machines beyond the scale-down are left to the rollout",
			in: Input{Replicas: 3, MaxSurge: num(1), MaxUnavailable: num(0),
				New: &Set{Name: "b", Revision: 2, Replicas: 2, Actual: 2, Available: 2, Marked: 2, ScaledFor: 4}, Old: []Set{sized(set("a", 1, 2), 4)}},
			want: Plan{NewReplicas: 1}, wantOK: true,
		},
		{
			name: "scaled to zero: every set to zero",
			in: Input{Replicas: 0, MaxSurge: num(1), MaxUnavailable: num(0),
				New: stuck(2, 4), Old: []Set{sized(set("a", 1, 3), 4)}},
			want: Plan{NewReplicas: 0, Old: map[string]int32{"a": 0}}, wantOK: true,
		},
		{
			name: "no scaling: the sets were sized for these replicas",
			in: Input{Replicas: 10, MaxSurge: num(2), MaxUnavailable: num(0),
				New: stuck(2, 10), Old: []Set{sized(set("a", 1, 10), 10)}},
		},
		{
			name: "sets of an older marina record nothing: no scaling",
			in: Input{Replicas: 20, MaxSurge: num(2), MaxUnavailable: num(0),
				New: stuck(2, 0), Old: []Set{set("a", 1, 10)}},
		},
		{
			name: "only one set has replicas: the rolling update decides",
			in: Input{Replicas: 20, MaxSurge: num(2), MaxUnavailable: num(0),
				New: stuck(10, 10), Old: []Set{sized(set("a", 1, 0), 10)}},
		},
		{
			name: "the new set has everything already, but holds the marked machine",
			in: Input{Replicas: 3, MaxSurge: num(1), MaxUnavailable: num(0),
				New: &Set{Name: "b", Revision: 2, Replicas: 3, Actual: 3, Available: 3, Marked: 1, ScaledFor: 4}, Old: []Set{sized(set("a", 1, 1), 4)}},
			want: Plan{NewReplicas: 2}, wantOK: true,
		},
		{
			name: "the new set has everything already",
			in: Input{Replicas: 3, MaxSurge: num(1), MaxUnavailable: num(0),
				New: &Set{Name: "b", Revision: 2, Replicas: 3, Actual: 3, Available: 3, ScaledFor: 4}, Old: []Set{sized(set("a", 1, 1), 4)}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok, err := Scale(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if ok != tt.wantOK {
				t.Fatalf("scaling %v, want %v (plan %s)", ok, tt.wantOK, got)
			}
			if !ok {
				return
			}
			if tt.want.Old == nil {
				tt.want.Old = map[string]int32{}
			}
			if got.NewReplicas != tt.want.NewReplicas || !maps.Equal(got.Old, tt.want.Old) {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

package rollout

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/controller/machineset"
)

// fleet is a deployment's machines as the sets would see them: real
// Machine objects, counted by machineset.Count (what the controller feeds
// the planner) and removed in machineset.DeletionOrder (what the sets
// really do), so the planner and the sets are checked together rather
// than the planner against a model of the sets.
type fleet struct {
	rng      *rand.Rand
	now      time.Time
	minReady int32
	policy   clusterv1.MachineDeletePolicy
	replicas map[string]int32 // spec.replicas of each set
	machines []*clusterv1.Machine
	// gone is when each deleting machine finishes draining.
	gone map[string]time.Time
	made int
}

func (f *fleet) add(set string, ready bool, readyFor time.Duration) {
	f.made++
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{
		Name: fmt.Sprintf("%s-%d", set, f.made), UID: types.UID(fmt.Sprintf("uid-%s-%d", set, f.made)),
		Labels:            map[string]string{"set": set},
		CreationTimestamp: metav1.NewTime(f.now.Add(-readyFor)),
	}}
	if ready {
		f.setReady(m, f.now.Add(-readyFor))
	}
	f.machines = append(f.machines, m)
}

func (f *fleet) setReady(m *clusterv1.Machine, since time.Time) {
	m.Status.NodeRef = &clusterv1.NodeReference{Name: m.Name}
	m.Status.Conditions = []metav1.Condition{{Type: clusterv1.ReadyCondition, Status: metav1.ConditionTrue, LastTransitionTime: metav1.NewTime(since)}}
}

func (f *fleet) of(set string) []*clusterv1.Machine {
	var out []*clusterv1.Machine
	for _, m := range f.machines {
		if m.Labels["set"] == set {
			out = append(out, m)
		}
	}
	return out
}

func (f *fleet) count(set string) machineset.Counts {
	return machineset.Count(f.of(set), f.minReady, f.now)
}

func (f *fleet) available() int32 {
	return machineset.Count(f.machines, f.minReady, f.now).Available
}

// act is one pass of each MachineSet controller: create what a set lacks
// (not Ready yet), delete what it has too many of, in its real order.
func (f *fleet) act(set string) {
	want := int(f.replicas[set])
	all := f.of(set)
	var active []*clusterv1.Machine
	for _, m := range all {
		if m.DeletionTimestamp.IsZero() {
			active = append(active, m)
		}
	}
	switch {
	case len(all) < want:
		for range want - len(all) {
			f.add(set, false, 0)
		}
	case len(active) > want:
		for _, m := range machineset.DeletionOrder(active, f.policy, len(active)-want, f.minReady, f.now) {
			now := metav1.NewTime(f.now)
			m.DeletionTimestamp = &now
			f.gone[m.Name] = f.now.Add(time.Duration(f.rng.IntN(3)) * 5 * time.Second)
		}
	}
}

// tick moves the clock: drained machines go, new machines may get Ready,
// and (while flapping) a Ready machine may go NotReady and come back, so
// that Ready-but-not-yet-available machines turn up anywhere.
func (f *fleet) tick(flapping bool) {
	f.now = f.now.Add(5 * time.Second)
	kept := f.machines[:0]
	for _, m := range f.machines {
		if t, ok := f.gone[m.Name]; ok && !f.now.Before(t) {
			continue
		}
		kept = append(kept, m)
	}
	f.machines = kept
	for _, m := range f.machines {
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		switch {
		case m.Status.NodeRef == nil && f.rng.IntN(2) == 0:
			f.setReady(m, f.now)
		case m.Status.NodeRef != nil && flapping && f.rng.IntN(8) == 0:
			f.setReady(m, f.now) // flapped: Ready again, but only just
		}
	}
}

// TestRollingUpdateKeepsAvailabilityWithTheSetsDeletionOrder plays random
// rollouts with minReadySeconds and machines of random availability
// (NotReady, Ready for a short while, available), planning with
// RollingUpdate and carrying each plan out with the MachineSet's own
// counting and deletion order. After every pass of the sets, the
// deployment keeps replicas - maxUnavailable machines available, or, when
// it had fewer already (machines it did not remove went NotReady), the
// sets removed none of the available ones.
func TestRollingUpdateKeepsAvailabilityWithTheSetsDeletionOrder(t *testing.T) {
	policies := []clusterv1.MachineDeletePolicy{clusterv1.RandomDeletePolicy, clusterv1.NewestDeletePolicy, clusterv1.OldestDeletePolicy}
	for seed := range 400 {
		rng := rand.New(rand.NewPCG(uint64(seed), 23))
		replicas := int32(1 + rng.IntN(8))
		surge, unavail := intstr.FromInt32(int32(rng.IntN(3))), intstr.FromInt32(int32(rng.IntN(3)))
		f := &fleet{
			rng: rng, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
			minReady: int32(10 * (1 + rng.IntN(3))), policy: policies[rng.IntN(len(policies))],
			replicas: map[string]int32{"old": replicas}, gone: map[string]time.Time{},
		}
		// The old set: each machine NotReady, Ready within minReadySeconds
		// (recently replaced, or flapped), or available.
		for range replicas {
			switch rng.IntN(3) {
			case 0:
				f.add("old", false, time.Minute)
			case 1:
				f.add("old", true, time.Duration(rng.IntN(int(f.minReady)))*time.Second)
			default:
				f.add("old", true, time.Hour)
			}
		}
		_, maxUnavailable, _ := Bounds(replicas, surge, unavail)
		maxSurge, _, _ := Bounds(replicas, surge, unavail)
		name := fmt.Sprintf("seed %d: replicas %d surge %s unavailable %s minReadySeconds %d %s", seed, replicas, surge.String(), unavail.String(), f.minReady, f.policy)
		var history []string
		converged := false
		for step := 0; step < 400 && !converged; step++ {
			in := Input{Replicas: replicas, MaxSurge: surge, MaxUnavailable: unavail}
			for _, set := range []string{"old", "new"} {
				r, ok := f.replicas[set]
				if !ok {
					continue
				}
				c := f.count(set)
				s := Set{Name: set, Replicas: r, Actual: c.Replicas, Deleting: c.Deleting, Available: c.Available, Revision: 1}
				if set == "new" {
					s.Revision = 2
					in.New = &s
				} else {
					in.Old = append(in.Old, s)
				}
			}
			if Done(in) {
				converged = true
				break
			}
			plan, err := RollingUpdate(in)
			if err != nil {
				t.Fatal(err)
			}
			f.replicas["new"] = plan.NewReplicas
			if r, ok := plan.Old["old"]; ok {
				f.replicas["old"] = r
			}
			before := f.available()
			f.act("old")
			f.act("new")
			after := f.available()
			history = append(history, fmt.Sprintf("t=%s plan %s: available %d -> %d", f.now.Format("15:04:05"), plan, before, after))
			if floor := min(replicas-maxUnavailable, before); after < floor {
				t.Fatalf("%s: step %d: the sets left %d machines available, fewer than %d (replicas %d - maxUnavailable %d, or the %d available before they acted)\n%s",
					name, step, after, floor, replicas, maxUnavailable, before, strings.Join(history, "\n"))
			}
			if total := int32(len(f.machines)); total > replicas+maxSurge {
				t.Fatalf("%s: step %d: %d machines, more than replicas %d + maxSurge %d\n%s", name, step, total, replicas, maxSurge, strings.Join(history, "\n"))
			}
			f.tick(step < 40)
		}
		if !converged {
			t.Fatalf("%s: no convergence\n%s", name, strings.Join(history, "\n"))
		}
	}
}

// TestScaleMidRolloutConverges plays random rollouts during which the
// deployment is scaled once, up or down, the way cluster-autoscaler scales
// down: it first marks the machines to remove (delete-machine), then lowers
// replicas. Each pass plans with Scale, else RollingUpdate, records the
// replicas the sets were sized for (as the controller's desired-replicas
// annotation does), and the sets act with their real deletion order. Every
// rollout converges, never holds more than the larger replicas + maxSurge
// machines, and every marked machine is gone in the end.
func TestScaleMidRolloutConverges(t *testing.T) {
	policies := []clusterv1.MachineDeletePolicy{clusterv1.RandomDeletePolicy, clusterv1.NewestDeletePolicy, clusterv1.OldestDeletePolicy}
	for seed := range 400 {
		rng := rand.New(rand.NewPCG(uint64(seed), 6))
		replicas := int32(1 + rng.IntN(8))
		surge, unavail := intstr.FromInt32(int32(rng.IntN(3))), intstr.FromInt32(int32(rng.IntN(3)))
		f := &fleet{
			rng: rng, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
			minReady: int32(10 * rng.IntN(3)), policy: policies[rng.IntN(len(policies))],
			replicas: map[string]int32{"old": replicas}, gone: map[string]time.Time{},
		}
		for range replicas {
			f.add("old", true, time.Hour)
		}
		scaledFor := map[string]int32{"old": replicas}
		initial := replicas
		scaleAt, scaledTo := rng.IntN(12), int32(rng.IntN(10))
		name := fmt.Sprintf("seed %d: replicas %d then %d at step %d, surge %s unavailable %s minReadySeconds %d %s",
			seed, replicas, scaledTo, scaleAt, surge.String(), unavail.String(), f.minReady, f.policy)
		marked := map[string]bool{}
		var history []string
		converged := false
		for step := 0; step < 400 && !converged; step++ {
			if step == scaleAt {
				// The autoscaler marks what it removes, then scales.
				var live []*clusterv1.Machine
				for _, m := range f.machines {
					if m.DeletionTimestamp.IsZero() {
						live = append(live, m)
					}
				}
				rng.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
				// No more than the live machines beyond the new size: those
				// must go in any case, and the marked ones are to be them.
				for _, m := range live[:max(min(int(replicas-scaledTo), len(live)-int(scaledTo)), 0)] {
					m.Annotations = map[string]string{clusterv1.DeleteMachineAnnotation: "now"}
					marked[m.Name] = true
				}
				replicas = scaledTo
			}
			in := Input{Replicas: replicas, MaxSurge: surge, MaxUnavailable: unavail}
			for _, set := range []string{"old", "new"} {
				r, ok := f.replicas[set]
				if !ok {
					continue
				}
				c := f.count(set)
				s := Set{Name: set, Replicas: r, Actual: c.Replicas, Deleting: c.Deleting, Available: c.Available, Marked: c.Marked, ScaledFor: scaledFor[set], Revision: 1}
				if set == "new" {
					s.Revision = 2
					in.New = &s
				} else {
					in.Old = append(in.Old, s)
				}
			}
			if step > scaleAt && Done(in) {
				converged = true
				break
			}
			plan, scaled, err := Scale(in)
			if err == nil && !scaled {
				plan, err = RollingUpdate(in)
			}
			if err != nil {
				t.Fatal(err)
			}
			f.replicas["new"] = plan.NewReplicas
			if r, ok := plan.Old["old"]; ok {
				f.replicas["old"] = r
			}
			for set := range f.replicas {
				scaledFor[set] = replicas
			}
			f.act("old")
			f.act("new")
			history = append(history, fmt.Sprintf("t=%s scaled %v plan %s: %d machines, %d available", f.now.Format("15:04:05"), scaled, plan, len(f.machines), f.available()))
			maxSurge, _, _ := Bounds(max(initial, scaledTo), surge, unavail)
			if bound := max(initial, scaledTo) + maxSurge; int32(len(f.machines)) > bound {
				t.Fatalf("%s: step %d: %d machines, more than %d\n%s", name, step, len(f.machines), bound, strings.Join(history, "\n"))
			}
			f.tick(false)
		}
		if !converged {
			t.Fatalf("%s: no convergence\n%s", name, strings.Join(history, "\n"))
		}
		for _, m := range f.machines {
			if marked[m.Name] {
				t.Fatalf("%s: machine %s was marked for deletion and is still there\n%s", name, m.Name, strings.Join(history, "\n"))
			}
		}
	}
}

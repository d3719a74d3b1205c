package rollout

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// Set is one MachineSet as the planner sees it.
type Set struct {
	// Name identifies the set in the plan.
	Name string
	// Replicas is the set's spec.replicas.
	Replicas int32
	// Actual is the number of machines the set has, those being deleted
	// included.
	Actual int32
	// Deleting is how many of them are being deleted.
	Deleting int32
	// Available is the number of the set's machines that are available
	// (Ready for minReadySeconds, and not being deleted).
	Available int32
	// Revision orders old sets: lower revisions are scaled down first.
	Revision int64
	// Marked is how many of the set's machines, not being deleted, carry
	// the delete-machine annotation: those a scale-down is to remove.
	Marked int32
	// ScaledFor is the deployment's replicas when the set's replicas were
	// last written (its desired-replicas annotation); 0 when unknown.
	ScaledFor int32
}

// Input is the observed state of a deployment.
type Input struct {
	// Replicas is the deployment's spec.replicas.
	Replicas int32
	// MaxSurge and MaxUnavailable are the deployment's strategy bounds.
	MaxSurge, MaxUnavailable intstr.IntOrString
	// New is the set built from the current template; nil when it does not
	// exist yet (the plan then says how many replicas to create it with).
	New *Set
	// Old are the sets built from earlier templates.
	Old []Set
}

// Plan is what the controller should write next.
type Plan struct {
	// NewReplicas is spec.replicas for the current template's set.
	NewReplicas int32
	// Old maps the name of each old set whose spec.replicas must change to
	// its new value. Sets not named keep their replicas.
	Old map[string]int32
}

// Done reports whether the rollout is finished: the new set has all the
// replicas and is fully available, and no old set has a machine left.
func Done(in Input) bool {
	if in.New == nil || in.New.Replicas != in.Replicas || in.New.Actual != in.Replicas || in.New.Available != in.Replicas {
		return false
	}
	for _, s := range in.Old {
		if s.Replicas != 0 || s.Actual != 0 {
			return false
		}
	}
	return true
}

// String renders a plan for logs and test failures: "new=3 old-a=2".
func (p Plan) String() string {
	parts := []string{"new=" + strconv.Itoa(int(p.NewReplicas))}
	names := make([]string, 0, len(p.Old))
	for n := range p.Old {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s=%d", n, p.Old[n]))
	}
	return strings.Join(parts, " ")
}

// Bounds resolves maxSurge and maxUnavailable against replicas, rounding as
// Deployments do: surge up, unavailable down. When both are zero,
// unavailable is 1. An invalid value (a malformed percentage) is an error.
func Bounds(replicas int32, maxSurge, maxUnavailable intstr.IntOrString) (surge, unavailable int32, err error) {
	s, err := scaled(maxSurge, replicas, true)
	if err != nil {
		return 0, 0, fmt.Errorf("maxSurge: %w", err)
	}
	u, err := scaled(maxUnavailable, replicas, false)
	if err != nil {
		return 0, 0, fmt.Errorf("maxUnavailable: %w", err)
	}
	if s == 0 && u == 0 {
		u = 1
	}
	// More unavailable than replicas means nothing more than all of them.
	return s, min(u, replicas), nil
}

func scaled(v intstr.IntOrString, total int32, roundUp bool) (int32, error) {
	if v.Type == intstr.Int {
		if v.IntVal < 0 {
			return 0, fmt.Errorf("%d is negative", v.IntVal)
		}
		return v.IntVal, nil
	}
	pct, ok := strings.CutSuffix(v.StrVal, "%")
	n, err := strconv.Atoi(pct)
	if !ok || err != nil || n < 0 {
		return 0, fmt.Errorf("%q is neither a number nor a percentage like 25%%", v.StrVal)
	}
	f := float64(n) * float64(total) / 100
	if roundUp {
		return int32(math.Ceil(f)), nil
	}
	return int32(math.Floor(f)), nil
}

// RollingUpdate returns the next replicas of every set for a rolling
// update. Applying the plan, waiting for the sets to act, and calling it
// again converges on Done; a plan equal to the current replicas means the
// rollout waits for machines to become available.
func RollingUpdate(in Input) (Plan, error) {
	surge, unavailable, err := Bounds(in.Replicas, in.MaxSurge, in.MaxUnavailable)
	if err != nil {
		return Plan{}, err
	}
	newSet := Set{}
	if in.New != nil {
		newSet = *in.New
	}
	plan := Plan{NewReplicas: newSet.Replicas, Old: map[string]int32{}}

	// Grow (or trim) the new set within replicas + maxSurge.
	switch {
	case newSet.Replicas > in.Replicas:
		plan.NewReplicas = in.Replicas
	case newSet.Replicas < in.Replicas:
		total := footprint(newSet)
		for _, s := range in.Old {
			total += footprint(s)
		}
		if room := in.Replicas + surge - total; room > 0 {
			plan.NewReplicas = newSet.Replicas + min(room, in.Replicas-newSet.Replicas)
		}
	}

	// Shrink old sets while replicas - maxUnavailable stay available. A set
	// counts only the machines its replicas keep: those beyond it are about
	// to go, so they are neither capacity to keep nor machines to remove again
	// (this keeps the plan right while a set has not yet acted on the last one).
	old := append([]Set(nil), in.Old...)
	sort.SliceStable(old, func(i, j int) bool { return old[i].Revision < old[j].Revision })
	var oldActual, all, available int32
	for _, s := range old {
		oldActual += s.Actual
		all += min(s.Actual, s.Replicas)
		available += kept(s)
	}
	if oldActual == 0 {
		return plan, nil
	}
	all += newSet.Actual
	available += kept(newSet)
	minAvailable := in.Replicas - unavailable
	// Machines the new set asks for but that are not available yet count as
	// unavailable already, so a new set that never gets Ready cannot let old
	// machines go.
	newUnavailable := max(plan.NewReplicas-newSet.Available, 0)
	budget := all - minAvailable - newUnavailable
	if budget <= 0 {
		return plan, nil
	}
	replicas := make([]int32, len(old))
	for i, s := range old {
		replicas[i] = s.Replicas
	}
	// First the old machines that are not available: no capacity is lost.
	for i, s := range old {
		if budget == 0 {
			break
		}
		cut := min(max(min(s.Replicas, s.Actual)-kept(s), 0), budget)
		replicas[i] -= cut
		budget -= cut
	}
	// Then available ones, oldest revision first, keeping minAvailable.
	canLose := available - minAvailable
	for i := range old {
		if canLose <= 0 {
			break
		}
		cut := min(replicas[i], canLose)
		replicas[i] -= cut
		canLose -= cut
	}
	for i, s := range old {
		if replicas[i] != s.Replicas {
			plan.Old[s.Name] = replicas[i]
		}
	}
	return plan, nil
}

// kept is the availability a set keeps: its available machines, but no
// more than its replicas.
func kept(s Set) int32 { return min(s.Available, s.Replicas) }

// footprint is how many machines a set stands for against the surge bound:
// what it is asked to have, or what it still has while machines drain.
func footprint(s Set) int32 { return max(s.Replicas, s.Actual) }

// OnDelete returns the next replicas for the OnDelete strategy: an old
// machine is replaced only after someone deletes it. Each old set keeps
// just the machines it still has (not being deleted), so a deleted machine
// is never re-created from an old template; the new set makes up the
// difference. A lower replicas is taken from machines marked for deletion
// first, then from old sets, oldest first.
func OnDelete(in Input) Plan {
	plan := Plan{Old: map[string]int32{}}
	old := append([]Set(nil), in.Old...)
	sort.SliceStable(old, func(i, j int) bool { return old[i].Revision < old[j].Revision })
	target := make([]int32, len(old))
	var total int32
	for i, s := range old {
		target[i] = max(min(s.Replicas, s.Actual-s.Deleting), 0)
		total += target[i]
	}
	var newReplicas int32
	if in.New != nil {
		newReplicas = in.New.Replicas
	}
	// A scale-down takes the machines marked for deletion first, whichever
	// set holds them (as Scale does for a rolling update).
	if down := total + newReplicas - in.Replicas; down > 0 {
		for i, s := range old {
			cut := min(s.Marked, target[i], down)
			target[i] -= cut
			total -= cut
			down -= cut
		}
		if in.New != nil {
			newReplicas -= min(in.New.Marked, newReplicas, down)
		}
	}
	// Then machines of the current template are the last to go.
	room := max(in.Replicas-newReplicas, 0)
	for i := range old {
		if total <= room {
			break
		}
		cut := min(target[i], total-room)
		target[i] -= cut
		total -= cut
	}
	for i, s := range old {
		if target[i] != s.Replicas {
			plan.Old[s.Name] = target[i]
		}
	}
	plan.NewReplicas = in.Replicas - total
	return plan
}

// Scale spreads a change of the deployment's replicas made in the middle
// of a rolling update over its sets, as a Deployment's proportional
// scaling does, and reports whether there was one to spread. There is when
// a set with replicas was sized for other deployment replicas than
// in.Replicas (ScaledFor), at least two sets have replicas, and either a
// marked machine is to go or the new set is not already complete;
// otherwise ok is false and RollingUpdate decides alone. A scale-up during a stuck rollout so grows the old sets
// too, instead of putting every new machine on a template that does not
// work.
//
// The sets with replicas are scaled by one factor, so that together they
// hold replicas + maxSurge (none when replicas is 0): each gets
// round(size * (replicas + maxSurge) / total) replicas, and what rounding
// leaves over goes to the largest set (among equals, the newest when
// growing and the oldest when shrinking). A scale-down first takes machines
// marked for deletion, from whichever set holds them, up to the number of
// replicas the deployment lost: that is how cluster-autoscaler removes the
// node it chose (it marks the machine, then lowers replicas), and a marked
// machine of the new set is removed rather than an old one. A scale-down
// never grows a set, nor a scale-up shrink one; a scale-up grows the sets
// by no more than machines being deleted leave room for under
// replicas + maxSurge.
func Scale(in Input) (plan Plan, ok bool, err error) {
	surge, _, err := Bounds(in.Replicas, in.MaxSurge, in.MaxUnavailable)
	if err != nil {
		return Plan{}, false, err
	}
	if in.New == nil {
		return Plan{}, false, nil
	}
	type sized struct {
		Set
		size int32
	}
	var sets []*sized
	var scaledFor int32
	changed := false
	for _, s := range append([]Set{*in.New}, in.Old...) {
		if s.Replicas <= 0 {
			continue
		}
		sets = append(sets, &sized{Set: s, size: s.Replicas})
		if s.ScaledFor != 0 && s.ScaledFor != in.Replicas {
			changed = true
			scaledFor = max(scaledFor, s.ScaledFor)
		}
	}
	if !changed || len(sets) < 2 {
		return Plan{}, false, nil
	}
	// Marked machines first, newest set first (the new set's are the ones
	// old-first shrinking would never reach).
	sort.SliceStable(sets, func(i, j int) bool { return sets[i].Revision > sets[j].Revision })
	down := max(scaledFor-in.Replicas, 0)
	for _, s := range sets {
		cut := min(s.Marked, s.size, down)
		s.size -= cut
		down -= cut
	}
	if down == max(scaledFor-in.Replicas, 0) && in.New.Replicas == in.Replicas && in.New.Available >= in.Replicas {
		// Nothing marked to take, and the new set has everything: the
		// rolling update only has old machines to remove.
		return Plan{}, false, nil
	}
	var total int32
	for _, s := range sets {
		total += s.size
	}
	allowed := int32(0)
	if in.Replicas > 0 {
		allowed = in.Replicas + surge
	}
	add := allowed - total
	switch {
	case in.Replicas < scaledFor:
		add = min(add, 0)
	case in.Replicas > scaledFor:
		// Machines still draining hold their capacity against the surge
		// bound, as in RollingUpdate: growth waits for them, and what is
		// given up here the rollout adds later.
		footprints := footprint(*in.New)
		for _, s := range in.Old {
			footprints += footprint(s)
		}
		add = max(min(add, allowed-footprints), 0)
	}
	if add != 0 && total > 0 {
		sort.SliceStable(sets, func(i, j int) bool {
			if sets[i].size != sets[j].size {
				return sets[i].size > sets[j].size
			}
			if add > 0 {
				return sets[i].Revision > sets[j].Revision
			}
			return sets[i].Revision < sets[j].Revision
		})
		var added int32
		target := make([]int32, len(sets))
		for i, s := range sets {
			share := int32(math.Round(float64(s.size)*float64(allowed)/float64(total))) - s.size
			if add > 0 {
				share = min(share, add-added)
			} else {
				share = max(share, add-added)
			}
			target[i] = s.size + share
			added += share
		}
		target[0] = max(target[0]+add-added, 0)
		for i, s := range sets {
			s.size = target[i]
		}
	}
	plan = Plan{NewReplicas: in.New.Replicas, Old: map[string]int32{}}
	for _, s := range sets {
		switch {
		case s.Name == in.New.Name:
			plan.NewReplicas = s.size
		case s.size != s.Replicas:
			plan.Old[s.Name] = s.size
		}
	}
	return plan, true, nil
}

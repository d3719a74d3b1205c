package health

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// A storm that builds slowly: a partition takes the Nodes of 6 of 10
// workers Ready=Unknown one every 6 seconds. The check runs every second
// on the real clock logic (no pause); a remediated machine, its Node not
// Ready, skips the drain and is gone 2 seconds later; its set's
// replacement registers a Ready Node 5 seconds after that. With
// maxUnhealthy 40% (4 of 10), at most 4 machines may be remediated: the
// rest of the storm must be held back, whatever the pace.
func TestStormThatBuildsSlowly(t *testing.T) {
	forty := intstr.FromString("40%")
	s := Spec{
		Conditions: []Condition{
			{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Timeout: 10 * time.Second},
			{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Timeout: 10 * time.Second},
		},
		NodeStartupTimeout: 10 * time.Minute,
		MaxUnhealthy:       &forty,
	}
	type sim struct {
		m        Machine
		goneAt   time.Time // when a deleting machine is gone
		readyAt  time.Time // when a replacement's Node registers
		replaced bool
	}
	start := t0.Add(time.Hour)
	var fleet []*sim
	for i := range 10 {
		fleet = append(fleet, &sim{m: worker(fmt.Sprintf("m%d", i))})
	}
	remediated := map[string]time.Time{}
	var records []Remediation
	var last Plan
	for step := 0; step <= 180; step++ {
		now := start.Add(time.Duration(step) * time.Second)
		// The partition: one more original Node every 6 s, 6 in all.
		if step%6 == 0 && step/6 < 6 {
			fleet[step/6].m.Node = node(corev1.ConditionUnknown, now)
		}
		// Deletions complete, replacements are created and register.
		var next []*sim
		for _, x := range fleet {
			switch {
			case x.m.Deleting && !now.Before(x.goneAt):
				r := &sim{m: Machine{Name: x.m.Name + "-r", OwnedBySet: true, Started: now}, readyAt: now.Add(5 * time.Second), replaced: true}
				next = append(next, r)
				continue
			case x.replaced && x.m.Node == nil && !now.Before(x.readyAt):
				x.m.HadNode, x.m.Node = true, node(corev1.ConditionTrue, now)
			}
			next = append(next, x)
		}
		fleet = next
		machines := make([]Machine, len(fleet))
		for i, x := range fleet {
			machines[i] = x.m
		}
		s.Remediations = records // as the controller reads status.recentRemediations
		plan, err := Decide(s, machines, now)
		if err != nil {
			t.Fatal(err)
		}
		records, last = Record(plan, now), plan
		for i, v := range plan.Machines {
			if v.Action == Remediate {
				remediated[v.Name] = now
				fleet[i].m.Deleting, fleet[i].goneAt = true, now.Add(2*time.Second)
			}
		}
	}
	t.Logf("remediated: %v", remediated)
	if len(remediated) > 4 {
		t.Errorf("%d machines remediated during a storm of 6 of 10 with maxUnhealthy 40%% (4): %v", len(remediated), remediated)
	}
	// The rest wait, and the plan says why: what counts is over the limit.
	if last.Allowed || last.Counted() <= last.MaxUnhealthy || last.Unhealthy() != 6-len(remediated) {
		t.Errorf("after the storm: allowed %v, %d unhealthy, %d counted, limit %d; want remediation stopped with the %d dead machines left",
			last.Allowed, last.Unhealthy(), last.Counted(), last.MaxUnhealthy, 6-len(remediated))
	}
}

package machinehealthcheck

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/internal/testenv/localenv"
	"marina.dev/marina/provider"
)

// A worker whose agent is killed is found unhealthy once its Node has been
// Ready=Unknown for the timeout, marked and deleted, and its set replaces
// it: back to 3 Ready workers. A machine no set owns, dead at the same
// time, is only marked. The health check controller is killed right after
// its first deletion and started again: the set makes exactly one
// replacement, and no other machine is deleted.
func TestDeadWorkerIsReplacedAndLoneMachineOnlyMarked(t *testing.T) {
	startNodeLifecycle(t)
	f := suite.NewFixture(t)
	startMachines(f)
	set := f.WorkerSet("pool", 3, map[string]string{"pool": "workers", "set": "pool"})
	create(t, set)
	solo := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: "solo", Namespace: f.NS, Labels: map[string]string{"pool": "workers"}},
		Spec:       f.WorkerSpec(),
	}
	create(t, solo)
	mhc := newCheck(f, nil)
	create(t, mhc)

	var crashed atomic.Bool
	crashedNow := make(chan struct{})
	var once sync.Once
	stopFirst := startChecks(f, Options{crashAt: func(step string) bool {
		if crashed.Load() {
			return true // a dead process does nothing more
		}
		if step == "after-delete" {
			crashed.Store(true)
			once.Do(func() { close(crashedNow) })
			return true
		}
		return false
	}})

	before := waitReady(t, f.NS, 4, time.Minute)
	testenv.Eventually(t, 20*time.Second, "the check to count 4 healthy machines", func() error {
		st := getCheck(t, mhc).Status
		if st.ExpectedMachines != 4 || st.CurrentHealthy != 4 {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	var victim clusterv1.Machine
	for name, m := range before {
		if name != solo.Name {
			victim = m
			break
		}
	}
	soloNow := before[solo.Name]
	killAgent(t, f, &victim)
	killAgent(t, f, &soloNow)

	select {
	case <-crashedNow:
	case <-time.After(time.Minute):
		t.Fatal("no machine was remediated within a minute of its agent dying")
	}
	stopFirst()
	// Recorded before the deletion, the remediation survives the crash: it
	// counts toward maxUnhealthy once the machine is gone.
	if recs := getCheck(t, mhc).Status.RecentRemediations; len(recs) != 1 || recs[0].Machine != victim.Name {
		t.Errorf("status.recentRemediations %+v after the crash, want the one of %s", recs, victim.Name)
	}
	startChecks(f, Options{})

	testenv.Eventually(t, time.Minute, "the set to be back to 3 Ready workers without the dead one", func() error {
		var readyWorkers, all int
		for _, m := range machinesIn(t, f.NS) {
			if m.Name == solo.Name {
				continue
			}
			all++
			if m.Name == victim.Name {
				return fmt.Errorf("%s still exists (deleting: %v)", m.Name, !m.DeletionTimestamp.IsZero())
			}
			if ready(&m) {
				readyWorkers++
			}
		}
		if all != 3 || readyWorkers != 3 {
			return fmt.Errorf("%d set machines, %d Ready", all, readyWorkers)
		}
		return nil
	})
	// Exactly one replacement: the two healthy workers are the same ones.
	var kept, fresh int
	for _, m := range machinesIn(t, f.NS) {
		if m.Name == solo.Name {
			continue
		}
		if _, ok := before[m.Name]; ok {
			kept++
		} else {
			fresh++
		}
	}
	if kept != 2 || fresh != 1 {
		t.Errorf("%d original workers kept and %d new ones; want 2 and 1", kept, fresh)
	}
	// The Remediated event is not asserted: events are sent in the
	// background, and the killed controller may not have sent it.

	// The lone machine is marked, with the reason, and left in place.
	testenv.Eventually(t, 30*time.Second, "the lone machine to be marked unhealthy", func() error {
		m, err := getMachine(solo.Name, f.NS)
		if err != nil {
			return err
		}
		c := condition(m.Status.Conditions, clusterv1.MachineHealthCheckSucceededCondition)
		reason := m.Annotations[clusterv1.RemediationReasonAnnotation]
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != clusterv1.MachineUnhealthyNodeConditionReason ||
			!strings.Contains(reason, "no MachineSet owns the machine") {
			return fmt.Errorf("condition %+v, annotation %q", c, reason)
		}
		if !m.DeletionTimestamp.IsZero() {
			t.Fatalf("the lone machine %s is being deleted: it must only be marked", m.Name)
		}
		return nil
	})
	testenv.Eventually(t, 20*time.Second, "the check's counts", func() error {
		st := getCheck(t, mhc).Status
		c := condition(st.Conditions, clusterv1.RemediationAllowedCondition)
		if st.ExpectedMachines != 4 || st.CurrentHealthy != 3 || c == nil || c.Status != metav1.ConditionTrue || st.ObservedGeneration != getCheck(t, mhc).Generation {
			return fmt.Errorf("status %+v", st)
		}
		// The lone machine and the remediated one, gone, count.
		if !strings.Contains(c.Message, "1 of 4 machines are unhealthy, plus 1 remediated in the last 10m0s") {
			return fmt.Errorf("condition message %q does not count the remediation", c.Message)
		}
		return nil
	})
}

// A storm: 3 of 5 workers die at once with maxUnhealthy 40% (2 of 5):
// nothing is remediated, RemediationAllowed is False with the counts, and
// an event says so. Healed, all 5 are healthy and none was deleted.
func TestStormShortCircuits(t *testing.T) {
	startNodeLifecycle(t)
	f := suite.NewFixture(t)
	startMachines(f)
	create(t, f.WorkerSet("pool", 5, map[string]string{"pool": "workers"}))
	forty := intstr.FromString("40%")
	mhc := newCheck(f, &forty)
	// Paused while the storm builds: the Nodes turn Unknown up to a Lease
	// period (10s) apart, and a check running meanwhile would rightly
	// remediate the first one alone, as within its limit.
	mhc.Annotations = map[string]string{clusterv1.PausedAnnotation: ""}
	create(t, mhc)
	startChecks(f, Options{})

	machines := waitReady(t, f.NS, 5, time.Minute)
	testenv.Eventually(t, 20*time.Second, "the paused check to say so", func() error {
		c := condition(getCheck(t, mhc).Status.Conditions, clusterv1.RemediationAllowedCondition)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != clusterv1.PausedReason {
			return fmt.Errorf("condition %+v", c)
		}
		// What marina move waits for.
		if p := condition(getCheck(t, mhc).Status.Conditions, clusterv1.PausedCondition); p == nil || p.Status != metav1.ConditionTrue {
			return fmt.Errorf("Paused condition %+v", p)
		}
		return nil
	})
	var dead []clusterv1.Machine
	for _, m := range machines {
		if len(dead) < 3 {
			dead = append(dead, m)
			killAgent(t, f, &m)
		}
	}
	testenv.Eventually(t, time.Minute, "the 3 Nodes to be Ready=Unknown for longer than the timeout", func() error {
		for i := range dead {
			since := nodeUnknownSince(t, &dead[i])
			if since.IsZero() || time.Since(since) < 6*time.Second {
				return fmt.Errorf("node of %s Unknown since %v", dead[i].Name, since)
			}
		}
		return nil
	})
	setPaused(t, mhc, false)

	testenv.Eventually(t, 30*time.Second, "remediation to stop with the counts", func() error {
		st := getCheck(t, mhc).Status
		c := condition(st.Conditions, clusterv1.RemediationAllowedCondition)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != clusterv1.TooManyUnhealthyReason || !strings.Contains(c.Message, "3 of 5") {
			return fmt.Errorf("condition %+v", c)
		}
		if st.ExpectedMachines != 5 || st.CurrentHealthy != 2 || st.RemediationsAllowed != 0 {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	// The pass that wrote the condition had already decided to delete
	// nothing; every later pass sees the same 3 dead Nodes.
	for _, m := range machinesIn(t, f.NS) {
		if !m.DeletionTimestamp.IsZero() {
			t.Errorf("machine %s is being deleted during a storm", m.Name)
		}
		if _, ok := m.Annotations[clusterv1.RemediationReasonAnnotation]; ok {
			t.Errorf("machine %s is annotated for remediation during a storm", m.Name)
		}
	}
	if n := len(machinesIn(t, f.NS)); n != 5 {
		t.Errorf("%d machines, want the same 5", n)
	}
	testenv.Eventually(t, 10*time.Second, "an event for the storm", func() error {
		return hasEvent(t, f.NS, clusterv1.TooManyUnhealthyReason, "3 of 5")
	})
	testenv.Eventually(t, 10*time.Second, "the dead machines to be marked, saying why they stay", func() error {
		for i := range dead {
			m, err := getMachine(dead[i].Name, f.NS)
			if err != nil {
				return err
			}
			c := condition(m.Status.Conditions, clusterv1.MachineHealthCheckSucceededCondition)
			if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "remediation stopped") {
				return fmt.Errorf("%s: %+v", m.Name, c)
			}
		}
		return nil
	})

	// Heal them: the provider starts their agents again, as it would a
	// machine that rebooted. Everything is healthy, and nothing was deleted.
	// The check is paused meanwhile: the Nodes turn Ready one by one, and
	// once only 2 are left unhealthy, within the limit, the check would
	// rightly remediate them.
	setPaused(t, mhc, true)
	for i := range dead {
		m := &dead[i]
		_, err := f.Provider.Create(context.Background(), &provider.Request{
			UID: m.UID, Namespace: m.Namespace, Name: m.Name, Machine: m.Spec, ProviderSpec: []byte(localenv.LocalMachineBlob),
		})
		if err != nil {
			t.Fatalf("restarting the agent of %s: %v", m.Name, err)
		}
	}
	testenv.Eventually(t, 45*time.Second, "the healed Nodes to be Ready", func() error {
		for i := range dead {
			if n := nodeReady(t, &dead[i]); n != corev1.ConditionTrue {
				return fmt.Errorf("node of %s is Ready=%s", dead[i].Name, n)
			}
		}
		return nil
	})
	setPaused(t, mhc, false)
	testenv.Eventually(t, 30*time.Second, "the healed machines to be healthy again", func() error {
		st := getCheck(t, mhc).Status
		c := condition(st.Conditions, clusterv1.RemediationAllowedCondition)
		if st.CurrentHealthy != 5 || c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	after := machinesIn(t, f.NS)
	for _, m := range after {
		if _, ok := machines[m.Name]; !ok || !m.DeletionTimestamp.IsZero() {
			t.Errorf("machine %s is new or being deleted after the storm healed", m.Name)
		}
	}
	if len(after) != 5 {
		t.Errorf("%d machines after the storm healed, want the same 5", len(after))
	}
}

func setPaused(t *testing.T, mhc *clusterv1.MachineHealthCheck, paused bool) {
	t.Helper()
	patched := getCheck(t, mhc)
	orig := patched.DeepCopy()
	if paused {
		if patched.Annotations == nil {
			patched.Annotations = map[string]string{}
		}
		patched.Annotations[clusterv1.PausedAnnotation] = ""
	} else {
		delete(patched.Annotations, clusterv1.PausedAnnotation)
	}
	if err := mgmt.Client.Patch(context.Background(), patched, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
	// A pass that started before the pause may still be running; wait for
	// the condition, which a pass writes last.
	testenv.Eventually(t, 10*time.Second, "the check to see the pause change", func() error {
		c := condition(getCheck(t, mhc).Status.Conditions, clusterv1.RemediationAllowedCondition)
		if c == nil || (c.Reason == clusterv1.PausedReason) != paused {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
}

// A storm that builds slowly, with nothing paused: 3 of 5 workers' agents
// are killed 15 s apart, so that each Node turns Unknown, outlasts the 5 s
// timeout and is remediated (gone in seconds, its Node not Ready) before
// the next. Counting only what is unhealthy at the moment, the check would
// remediate all 3; with maxUnhealthy 40% (2 of 5) at most 2 may go, and the
// third waits, its condition and the check's saying why.
func TestStormThatBuildsSlowlyIsHeldBack(t *testing.T) {
	startNodeLifecycle(t)
	f := suite.NewFixture(t)
	startMachines(f)
	create(t, f.WorkerSet("pool", 5, map[string]string{"pool": "workers"}))
	forty := intstr.FromString("40%")
	mhc := newCheck(f, &forty)
	create(t, mhc)
	startChecks(f, Options{})

	machines := waitReady(t, f.NS, 5, time.Minute)
	testenv.Eventually(t, 20*time.Second, "the check to count 5 healthy machines", func() error {
		if st := getCheck(t, mhc).Status; st.CurrentHealthy != 5 {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	var dead []clusterv1.Machine
	for _, m := range machines {
		dead = append(dead, m)
		if len(dead) == 3 {
			break
		}
	}
	// remediated counts the original machines deleted so far; it must
	// never pass the limit.
	remediated := func() []string {
		var out []string
		for name := range machines {
			m, err := getMachine(name, f.NS)
			if err != nil || !m.DeletionTimestamp.IsZero() {
				out = append(out, name)
			}
		}
		return out
	}
	for i := range dead {
		if i > 0 {
			deadline := time.Now().Add(15 * time.Second)
			for time.Now().Before(deadline) {
				if r := remediated(); len(r) > 2 {
					t.Fatalf("%d machines remediated while the storm builds: %v", len(r), r)
				}
				time.Sleep(500 * time.Millisecond)
			}
		}
		killAgent(t, f, &dead[i])
	}

	// Every dead Node goes Unknown within the grace period (18 s) and
	// outlasts the timeout (5 s): by then the check has decided about all.
	deadline := time.Now().Add(40 * time.Second)
	for time.Now().Before(deadline) {
		if r := remediated(); len(r) > 2 {
			t.Fatalf("%d machines remediated by a storm of 3 of 5 under maxUnhealthy 40%% (2): %v", len(r), r)
		}
		time.Sleep(500 * time.Millisecond)
	}
	testenv.Eventually(t, 20*time.Second, "the check to hold back the rest of the storm, saying why", func() error {
		c := condition(getCheck(t, mhc).Status.Conditions, clusterv1.RemediationAllowedCondition)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != clusterv1.TooManyUnhealthyReason || !strings.Contains(c.Message, "3 count") && !strings.Contains(c.Message, "3 of 5") {
			return fmt.Errorf("condition %+v", c)
		}
		t.Logf("%s", c.Message)
		return nil
	})
	gone := map[string]bool{}
	for _, name := range remediated() {
		gone[name] = true
	}
	for i := range dead {
		if gone[dead[i].Name] {
			continue
		}
		m, err := getMachine(dead[i].Name, f.NS)
		if err != nil {
			t.Fatal(err)
		}
		c := condition(m.Status.Conditions, clusterv1.MachineHealthCheckSucceededCondition)
		if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "remediation stopped") {
			t.Errorf("dead machine %s waits without saying why: %+v", m.Name, c)
		}
	}
	if len(gone) == 0 && !t.Failed() {
		t.Log("the 3 Nodes turned Unknown together: the storm was held back whole")
	}
}

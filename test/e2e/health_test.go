package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
)

// Issue: health and safety. examples/health: ten workers under a health
// check with maxUnhealthy 40%.
//   - A storm: 6 of the 10 workers' agents are frozen (SIGSTOP, as a
//     network partition would look). Their Nodes go Unknown; the check
//     says it holds back, with the counts, and deletes nothing. Let go on,
//     all ten are healthy again and every one is the same machine.
//   - One worker's agent killed (SIGKILL), the machine annotated as
//     stopped on purpose (or marina would start it again): the check
//     marks it, its MachineSet replaces it, and the cluster is back to ten
//     Ready workers.
func TestUpRemediatesADeadWorkerButNotAStorm(t *testing.T) {
	t.Parallel()
	u, root, c := startUpWithClient(t)
	ctx := context.Background()
	key := types.NamespacedName{Namespace: "default", Name: "health"}
	applied := time.Now()
	u.applyExample(t, "health")
	testenv.Eventually(t, 5*time.Minute, "11 machines Running and the check seeing 10 healthy", func() error {
		if err := machinesRunning(ctx, c, 11); err != nil {
			return err
		}
		return checkCounts(ctx, c, 10, 10)
	})
	t.Logf("examples/health: 11 machines Running, 10 workers healthy %.1fs after kubectl apply", time.Since(applied).Seconds())
	workers := workerMachines(t, ctx, c)

	// Frozen agents must be let go on even if the test fails, or their
	// cleanup (SIGTERM) would wait forever.
	var frozen []int
	t.Cleanup(func() {
		for _, pid := range frozen {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	})

	t.Run("a storm of 6 of 10 unhealthy workers is not remediated", func(t *testing.T) {
		start := time.Now()
		for _, m := range workers[:6] {
			for _, pid := range processesUnder(filepath.Join(root, string(m.UID))) {
				if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
					t.Fatalf("stopping %d of %s: %v", pid, m.Name, err)
				}
				frozen = append(frozen, pid)
			}
		}
		testenv.Eventually(t, 2*time.Minute, "the check to hold back with 6 unhealthy", func() error {
			mhc := healthCheck(ctx, c)
			if mhc == nil {
				return fmt.Errorf("no health check")
			}
			cond := meta.FindStatusCondition(mhc.Status.Conditions, clusterv1.RemediationAllowedCondition)
			if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != clusterv1.TooManyUnhealthyReason {
				return fmt.Errorf("RemediationAllowed %+v; healthy %d", cond, mhc.Status.CurrentHealthy)
			}
			if mhc.Status.CurrentHealthy != 4 || mhc.Status.RemediationsAllowed != 0 {
				return fmt.Errorf("status %+v", mhc.Status)
			}
			t.Logf("%.1fs after the storm began: %s: %s", time.Since(start).Seconds(), cond.Reason, cond.Message)
			return nil
		})
		// The six are past the checks' timeout already, so a check that
		// remediated would do it on its next pass: nothing is deleted
		// while the storm lasts.
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if err := sameWorkers(ctx, c, workers); err != nil {
				t.Fatalf("during the storm: %v", err)
			}
			time.Sleep(time.Second)
		}

		// The storm subsides: two workers come back first. Remediation may
		// resume (4 unhealthy is within 40%), but the four still on their
		// way back are not taken for dead: their conditions must hold the
		// 10 s timeout past the resumption.
		resume := func(ms []clusterv1.Machine) {
			for _, m := range ms {
				for _, pid := range processesUnder(filepath.Join(root, string(m.UID))) {
					if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
						t.Errorf("continuing %d: %v", pid, err)
					}
				}
			}
		}
		resume(workers[:2])
		testenv.Eventually(t, time.Minute, "remediation allowed again with 8 healthy", func() error {
			mhc := healthCheck(ctx, c)
			if mhc == nil {
				return fmt.Errorf("no health check")
			}
			if !meta.IsStatusConditionTrue(mhc.Status.Conditions, clusterv1.RemediationAllowedCondition) || mhc.Status.CurrentHealthy != 6 {
				return fmt.Errorf("healthy %d, conditions %+v", mhc.Status.CurrentHealthy, mhc.Status.Conditions)
			}
			return nil
		})
		deadline = time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if err := sameWorkers(ctx, c, workers); err != nil {
				t.Fatalf("as the storm subsides: %v", err)
			}
			time.Sleep(500 * time.Millisecond)
		}
		resume(workers[2:6])
		frozen = nil
		healed := time.Now()
		testenv.Eventually(t, 2*time.Minute, "all 10 healthy again", func() error { return checkCounts(ctx, c, 10, 10) })
		t.Logf("healed %.1fs after the agents went on", time.Since(healed).Seconds())
		if err := sameWorkers(ctx, c, workers); err != nil {
			t.Errorf("after the storm: %v", err)
		}
	})

	t.Run("a dead worker is replaced by its set", func(t *testing.T) {
		victim := workers[9]
		// A machine that is merely killed is started again by the machine
		// controller (issue 25); one an operator stopped on purpose is
		// left dead, for the check to find.
		if out, err := u.kubectl(t, "annotate", "machine", victim.Name, clusterv1.StoppedOnPurposeAnnotation+"=true"); err != nil {
			t.Fatalf("kubectl annotate: %v\n%s", err, out)
		}
		dir := filepath.Join(root, string(victim.UID))
		data, err := os.ReadFile(filepath.Join(dir, "agent.pid"))
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
		killed := time.Now()
		t.Logf("killing the agent of %s (pid %d)", victim.Name, pid)
		for _, p := range processesUnder(dir) {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		testenv.Eventually(t, 3*time.Minute, "the dead worker replaced and 10 healthy", func() error {
			var m clusterv1.Machine
			err := c.Get(ctx, client.ObjectKeyFromObject(&victim), &m)
			if err == nil && m.UID == victim.UID {
				return fmt.Errorf("%s still there (phase %s)", victim.Name, m.Status.Phase)
			}
			if err := machinesRunning(ctx, c, 11); err != nil {
				return err
			}
			return checkCounts(ctx, c, 10, 10)
		})
		t.Logf("replaced %.1fs after the kill", time.Since(killed).Seconds())
		// The check, not anything else, deleted it, and said so.
		var events eventsv1.EventList
		if err := c.List(ctx, &events, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		remediated := 0
		for _, e := range events.Items {
			if e.Reason == "Remediated" && e.Regarding.Name == "health-workers" {
				remediated++
				t.Logf("event: %s", e.Note)
				if !strings.Contains(e.Note, victim.Name) {
					t.Errorf("a remediation of another machine: %s", e.Note)
				}
			}
		}
		if remediated != 1 {
			t.Errorf("%d Remediated events on the health check, want 1", remediated)
		}
		if err := sameWorkers(ctx, c, workers[:9]); err != nil {
			t.Errorf("besides the dead one: %v", err)
		}
		cs := workloadClient(t, ctx, c, key)
		testenv.Eventually(t, time.Minute, "10 Ready worker Nodes", func() error {
			nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			ready := 0
			for i := range nodes.Items {
				if _, cp := nodes.Items[i].Labels["node-role.kubernetes.io/control-plane"]; !cp && nodeReady(&nodes.Items[i]) {
					ready++
				}
			}
			if ready != 10 {
				return fmt.Errorf("%d Ready worker Nodes of %d", ready, len(nodes.Items))
			}
			return nil
		})
	})

	// Issue 23: a storm that builds slowly, nothing paused. One worker's
	// agent is killed every 6 s until 6 are dead; each Node goes Unknown
	// and outlasts the 10 s timeout a few seconds after the one before. The
	// check counts conditions that have begun and recent remediations, so
	// at most maxUnhealthy (40%, 4 machines) are deleted (fewer, as the
	// worker remediated above still counts), and the condition says why
	// the rest wait. Their agents restarted, all 10 are healthy, and the
	// machines deleted are exactly those the events say were remediated.
	earlierFailed := t.Failed()
	t.Run("a storm that builds slowly deletes at most maxUnhealthy", func(t *testing.T) {
		if earlierFailed {
			t.Skip("the fleet is not known to be healthy")
		}
		all := workerMachines(t, ctx, c)
		victims := all[:6]
		deleted := func() []string {
			var out []string
			for i := range all {
				var m clusterv1.Machine
				err := c.Get(ctx, client.ObjectKeyFromObject(&all[i]), &m)
				if err != nil || m.UID != all[i].UID || !m.DeletionTimestamp.IsZero() {
					out = append(out, all[i].Name)
				}
			}
			return out
		}
		watch := func(d time.Duration) {
			deadline := time.Now().Add(d)
			for time.Now().Before(deadline) {
				if gone := deleted(); len(gone) > 4 {
					t.Fatalf("%d machines deleted by a storm of 6 of 10 under maxUnhealthy 40%%: %v", len(gone), gone)
				}
				time.Sleep(500 * time.Millisecond)
			}
		}
		start := time.Now()
		for i, m := range victims {
			if i > 0 {
				watch(6 * time.Second)
			}
			// Stopped on purpose, or marina would start it again at once:
			// the storm is an outage that lasts.
			if out, err := u.kubectl(t, "annotate", "machine", m.Name, clusterv1.StoppedOnPurposeAnnotation+"=true"); err != nil {
				t.Fatalf("annotating %s stopped-on-purpose: %v\n%s", m.Name, err, out)
			}
			t.Logf("%.0fs: killing the agent of %s", time.Since(start).Seconds(), m.Name)
			for _, pid := range processesUnder(filepath.Join(root, string(m.UID))) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		// The last Node goes Unknown within the 20 s grace and outlasts the
		// 10 s timeout: by then the check has decided about every one.
		watch(45 * time.Second)
		gone := deleted()
		for _, name := range gone {
			if !slices.ContainsFunc(victims, func(m clusterv1.Machine) bool { return m.Name == name }) {
				t.Errorf("healthy machine %s was deleted", name)
			}
		}
		mhc := healthCheck(ctx, c)
		cond := meta.FindStatusCondition(mhc.Status.Conditions, clusterv1.RemediationAllowedCondition)
		if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != clusterv1.TooManyUnhealthyReason {
			t.Fatalf("after the storm, %d deleted (%v), RemediationAllowed %+v", len(gone), gone, cond)
		}
		t.Logf("%d deleted (%v); the check: %s", len(gone), gone, cond.Message)
		if n := len(mhc.Status.RecentRemediations); n > 4 {
			t.Errorf("%d remediations recorded within nodeStartupTimeout: %+v", n, mhc.Status.RecentRemediations)
		}

		// The rest come back: the outage ends, and marina starts the
		// stopped machines again (issue 25).
		for _, m := range victims {
			if slices.Contains(gone, m.Name) {
				continue
			}
			if out, err := u.kubectl(t, "annotate", "machine", m.Name, clusterv1.StoppedOnPurposeAnnotation+"-"); err != nil {
				t.Fatalf("ending the outage of %s: %v\n%s", m.Name, err, out)
			}
		}
		testenv.Eventually(t, 3*time.Minute, "all 10 healthy again", func() error {
			if err := machinesRunning(ctx, c, 11); err != nil {
				return err
			}
			return checkCounts(ctx, c, 10, 10)
		})
		var kept []clusterv1.Machine
		for _, m := range all {
			if !slices.Contains(gone, m.Name) {
				kept = append(kept, m)
			}
		}
		if err := sameWorkers(ctx, c, kept); err != nil {
			t.Errorf("after the storm: %v", err)
		}
		// Deleted are exactly those remediated, by the events.
		var events eventsv1.EventList
		if err := c.List(ctx, &events, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		remediated := map[string]bool{}
		for _, e := range events.Items {
			if e.Reason != "Remediated" || e.Regarding.Name != "health-workers" {
				continue
			}
			for _, m := range all {
				if strings.Contains(e.Note, "machine "+m.Name+" ") {
					remediated[m.Name] = true
				}
			}
		}
		if len(remediated) != len(gone) {
			t.Errorf("machines deleted %v, remediated by the events %v", gone, remediated)
		}
		for _, name := range gone {
			if !remediated[name] {
				t.Errorf("machine %s was deleted without a Remediated event", name)
			}
		}
	})

	if out, err := u.kubectl(t, "delete", "cluster", "health", "--wait=true", "--timeout=3m"); err != nil {
		t.Fatalf("kubectl delete cluster: %v\n%s", err, out)
	}
	testenv.Eventually(t, time.Minute, "nothing left", func() error {
		if left := leftovers(t, root); len(left) > 0 {
			return fmt.Errorf("left on disk: %v", left)
		}
		return nil
	})
}

func healthCheck(ctx context.Context, c client.Client) *clusterv1.MachineHealthCheck {
	mhc := &clusterv1.MachineHealthCheck{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "health-workers"}, mhc); err != nil {
		return nil
	}
	return mhc
}

// checkCounts: the health check sees expected machines, healthy of them.
func checkCounts(ctx context.Context, c client.Client, expected, healthy int32) error {
	mhc := healthCheck(ctx, c)
	if mhc == nil {
		return fmt.Errorf("no health check")
	}
	if mhc.Status.ExpectedMachines != expected || mhc.Status.CurrentHealthy != healthy {
		return fmt.Errorf("health check: %d expected, %d healthy", mhc.Status.ExpectedMachines, mhc.Status.CurrentHealthy)
	}
	return nil
}

// workerMachines lists the cluster's workers, by name.
func workerMachines(t *testing.T, ctx context.Context, c client.Client) []clusterv1.Machine {
	t.Helper()
	var list clusterv1.MachineList
	if err := c.List(ctx, &list, client.InNamespace("default"), client.MatchingLabels{"example.marina.dev/pool": "health-workers"}); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 10 {
		t.Fatalf("%d workers, want 10", len(list.Items))
	}
	return list.Items
}

// sameWorkers: each of want still exists, with its UID, not being deleted.
func sameWorkers(ctx context.Context, c client.Client, want []clusterv1.Machine) error {
	for i := range want {
		var m clusterv1.Machine
		if err := c.Get(ctx, client.ObjectKeyFromObject(&want[i]), &m); err != nil {
			return fmt.Errorf("%s: %w", want[i].Name, err)
		}
		if m.UID != want[i].UID || !m.DeletionTimestamp.IsZero() {
			return fmt.Errorf("%s was deleted", want[i].Name)
		}
	}
	return nil
}

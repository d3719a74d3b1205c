package machine

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/nodeagent"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/internal/pki"
)

// Issue 25: a machine whose agent was killed (a reboot of one machine, an
// OOM kill), and which no health check watches, is started again by the
// machine controller, not replaced: the same Machine, the same providerID
// and sandbox, its Node Ready again, within 30 s of the kill. On the way
// its InstanceRunning condition says Stopped, and an event says so.
func TestKilledAgentIsStartedAgain(t *testing.T) {
	f := newFixture(t)
	f.startController(Options{})
	m := f.create(f.machine("restarted", ""))
	got := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
	if c := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineInstanceRunningCondition); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("a running machine's InstanceRunning condition is %v, want True", c)
	}
	pid, err := f.provider.AgentPID(got.UID)
	if err != nil {
		t.Fatal(err)
	}
	stopped := watchForReason(t, m, clusterv1.MachineInstanceRunningCondition, clusterv1.MachineStoppedReason)

	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	eventually(t, 30*time.Second, "the machine started again, the same one", func() (bool, error) {
		cur, err := f.get(m)
		if err != nil {
			return false, err
		}
		if cur.UID != got.UID || cur.Status.ProviderID != got.Status.ProviderID {
			return false, fmt.Errorf("machine %s (providerID %s) replaced by %s (%s)", got.UID, got.Status.ProviderID, cur.UID, cur.Status.ProviderID)
		}
		now, _ := f.provider.AgentPID(got.UID)
		if now == 0 || now == pid {
			return false, fmt.Errorf("agent pid %d (killed: %d)", now, pid)
		}
		c := meta.FindStatusCondition(cur.Status.Conditions, clusterv1.MachineInstanceRunningCondition)
		return c != nil && c.Status == metav1.ConditionTrue, fmt.Errorf("InstanceRunning %v", c)
	})
	t.Logf("started again %.1fs after the kill", time.Since(killed).Seconds())
	if !stopped() {
		t.Error("the machine's InstanceRunning condition never said Stopped")
	}
	if n := f.agents(got.UID); n != 1 {
		t.Errorf("%d agents run the machine's sandbox, want 1", n)
	}
	if n := f.sandboxCount(); n != 1 {
		t.Errorf("%d sandboxes, want the one machine's", n)
	}
	eventually(t, 30*time.Second, "the Node Ready, the same Node", func() (bool, error) {
		n, err := f.node(got.Status.NodeRef.Name)
		if err != nil {
			return false, err
		}
		if string(n.UID) != got.Status.NodeRef.UID {
			return false, fmt.Errorf("node %s has UID %s, was %s", n.Name, n.UID, got.Status.NodeRef.UID)
		}
		c := nodeCondition(n, corev1.NodeReady)
		return c != nil && c.Status == corev1.ConditionTrue, fmt.Errorf("Ready %v", c)
	})
	eventually(t, 10*time.Second, "a Stopped and a Started event on the machine", func() (bool, error) {
		var events eventsv1.EventList
		if err := mgmt.Client.List(context.Background(), &events, client.InNamespace(f.ns)); err != nil {
			return false, err
		}
		seen := map[string]bool{}
		for _, e := range events.Items {
			if e.Regarding.UID == got.UID {
				seen[e.Reason] = true
			}
		}
		return seen[clusterv1.MachineStoppedReason] && seen[clusterv1.MachineStartedReason], fmt.Errorf("events %v", seen)
	})
}

// An operator who powers a machine off on purpose says so with the
// annotation: the machine is reported Stopped and left stopped.
func TestMachineStoppedOnPurposeStaysStopped(t *testing.T) {
	f := newFixture(t)
	f.startController(Options{})
	m := f.machine("off", "")
	m.Annotations = map[string]string{clusterv1.StoppedOnPurposeAnnotation: "true"}
	m = f.create(m)
	got := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
	pid, err := f.provider.AgentPID(got.UID)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the machine reported Stopped, and not Ready", func() (bool, error) {
		cur, err := f.get(m)
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(cur.Status.Conditions, clusterv1.MachineInstanceRunningCondition)
		ready := meta.FindStatusCondition(cur.Status.Conditions, clusterv1.ReadyCondition)
		return c != nil && c.Reason == clusterv1.MachineStoppedReason && ready != nil && ready.Status == metav1.ConditionFalse &&
			ready.Reason == clusterv1.MachineStoppedReason, fmt.Errorf("InstanceRunning %v, Ready %v", c, ready)
	})
	// Several of the provider's looks (2 s apart) later, still stopped.
	time.Sleep(5 * time.Second)
	if n := f.agents(got.UID); n != 0 {
		t.Fatalf("%d agents run a machine stopped on purpose, want 0", n)
	}

	t.Log("the annotation removed: the machine is started")
	cur, err := f.get(m)
	if err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	delete(cur.Annotations, clusterv1.StoppedOnPurposeAnnotation)
	if err := mgmt.Client.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the machine running again", func() (bool, error) {
		cur, err := f.get(m)
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(cur.Status.Conditions, clusterv1.MachineInstanceRunningCondition)
		return c != nil && c.Status == metav1.ConditionTrue && f.agents(got.UID) == 1, fmt.Errorf("InstanceRunning %v, %d agents", c, f.agents(got.UID))
	})
}

// watchForReason watches machine m until the test ends and reports
// whether condition t ever had reason: a state that lasts a moment, which
// polling could miss.
func watchForReason(t *testing.T, m *clusterv1.Machine, condType, reason string) (seen func() bool) {
	t.Helper()
	wc, err := client.NewWithWatch(mgmt.Config, client.Options{Scheme: mgmt.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &clusterv1.MachineList{}, client.InNamespace(m.Namespace),
		client.MatchingFields{"metadata.name": m.Name})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var mu sync.Mutex
	found := false
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range w.ResultChan() {
			if e.Type != watch.Added && e.Type != watch.Modified {
				continue
			}
			cur, ok := e.Object.(*clusterv1.Machine)
			if !ok {
				continue
			}
			if c := meta.FindStatusCondition(cur.Status.Conditions, condType); c != nil && c.Reason == reason {
				mu.Lock()
				found = true
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); cancel(); <-done })
	return func() bool {
		mu.Lock()
		defer mu.Unlock()
		return found
	}
}

// Issue 25: a worker stopped past the life of its credential is not
// started with it (its agent could never join): the provider says so, and
// the controller hands it a fresh one. Here the worker's node certificate
// is replaced, while it is stopped on purpose, by one that expired: the
// worker gets a new bootstrap token and asks for a new certificate.
func TestStoppedWorkerWithAnExpiredCredentialGetsAFreshOne(t *testing.T) {
	f := newFixture(t)
	f.startController(Options{})
	m := f.machine("expired", "")
	m.Annotations = map[string]string{clusterv1.StoppedOnPurposeAnnotation: "true"}
	m = f.create(m)
	got := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
	pid, err := f.provider.AgentPID(got.UID)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the machine reported Stopped", func() (bool, error) {
		cur, err := f.get(m)
		if err != nil {
			return false, err
		}
		return conditionReason(cur, clusterv1.MachineInstanceRunningCondition) == clusterv1.MachineStoppedReason, nil
	})
	dir := filepath.Join(f.sandboxes, string(got.UID))
	ca, err := pki.NewCA("expired")
	if err != nil {
		t.Fatal(err)
	}
	old, err := ca.IssueFor(pki.CertSpec{CommonName: "system:node:" + got.Status.NodeRef.Name, Usage: pki.ClientAuth}, time.Now().Add(-48*time.Hour), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Write(dir, "node"); err != nil {
		t.Fatal(err)
	}

	cur, err := f.get(m)
	if err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	delete(cur.Annotations, clusterv1.StoppedOnPurposeAnnotation)
	if err := mgmt.Client.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	eventually(t, 30*time.Second, "the machine running again with a fresh credential, its Lease renewed", func() (bool, error) {
		cur, err := f.get(m)
		if err != nil {
			return false, err
		}
		if !meta.IsStatusConditionTrue(cur.Status.Conditions, clusterv1.MachineInstanceRunningCondition) {
			return false, fmt.Errorf("InstanceRunning %v", meta.FindStatusCondition(cur.Status.Conditions, clusterv1.MachineInstanceRunningCondition))
		}
		b, err := sandbox.ReadBootstrap(dir)
		if err != nil {
			return false, err
		}
		if err := nodeagent.CheckCredential(dir, b, time.Now()); err != nil {
			return false, fmt.Errorf("the sandbox holds no fresh credential: %w", err)
		}
		lease := &coordinationv1.Lease{}
		if err := workload.Client.Get(context.Background(), client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: got.Status.NodeRef.Name}, lease); err != nil {
			return false, err
		}
		renewed := lease.Spec.RenewTime != nil && lease.Spec.RenewTime.After(released)
		return renewed && f.agents(got.UID) == 1, fmt.Errorf("Lease renewed at %v, %d agents", lease.Spec.RenewTime, f.agents(got.UID))
	})
}

package machine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider"
	"marina.dev/marina/provider/local"
)

// runningPodOn puts a pod on the machine's Node and waits until its agent
// runs it.
func (f *fixture) runningPodOn(node, name string, labels map[string]string, gracePeriod int64) {
	f.t.Helper()
	ctx := context.Background()
	if err := workload.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		f.t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: &gracePeriod,
			Containers:                    []corev1.Container{{Name: "c", Image: "example.invalid/app:1"}},
		},
	}
	if err := workload.Client.Create(ctx, pod); err != nil {
		f.t.Fatal(err)
	}
	eventually(f.t, time.Minute, "pod "+name+" running", func() (bool, error) {
		err := workload.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod)
		return err == nil && pod.Status.Phase == corev1.PodRunning, err
	})
}

// machineEvent waits for an event of the machine with the reason whose
// note contains part.
func (f *fixture) machineEvent(uid types.UID, reason, part string, timeout time.Duration) {
	f.t.Helper()
	eventually(f.t, timeout, reason+" event mentioning "+part, func() (bool, error) {
		list := &eventsv1.EventList{}
		if err := mgmt.Client.List(context.Background(), list, client.InNamespace(f.ns)); err != nil {
			return false, err
		}
		var seen []string
		for _, e := range list.Items {
			if e.Regarding.UID == uid {
				if e.Reason == reason && strings.Contains(e.Note, part) {
					return true, nil
				}
				seen = append(seen, e.Reason+": "+e.Note)
			}
		}
		return false, fmt.Errorf("events of the machine: %q", seen)
	})
}

// A pod under two PodDisruptionBudgets cannot be evicted: the eviction API
// answers 500 on every pass. spec.nodeDrainTimeout still ends the drain,
// and the machine goes, with a warning event that names the failure.
func TestDrainTimeoutEndsADrainWhoseEvictionFailsEveryPass(t *testing.T) {
	f := newFixture(t)
	f.startController(Options{})
	ctx := context.Background()
	m := f.machine("twopdb", "")
	m.Spec.NodeDrainTimeout = &metav1.Duration{Duration: 5 * time.Second}
	f.create(m)
	got := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
	labels := map[string]string{"app": "twopdb"}
	f.runningPodOn(got.Status.NodeRef.Name, "twopdb", labels, 1)
	for _, name := range []string{"one", "two"} {
		pdb := &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns},
			Spec:       policyv1.PodDisruptionBudgetSpec{MaxUnavailable: ptrTo(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels}},
		}
		if err := workload.Client.Create(ctx, pdb); err != nil {
			t.Fatal(err)
		}
	}

	if err := mgmt.Client.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	f.waitGone(m, 45*time.Second)
	f.machineEvent(got.UID, clusterv1.MachineDrainTimeoutReason, "more than one PodDisruptionBudget", 30*time.Second)
}

// A pod evicted from a Node that is not Ready stays Terminating: no kubelet
// confirms it gone. Past the grace the drain leaves it behind, and the
// machine goes without any nodeDrainTimeout.
func TestDrainLeavesPodsOnANodeNotReadyBehind(t *testing.T) {
	f := newFixture(t)
	f.startController(Options{UnreachablePodGrace: 2 * time.Second})
	ctx := context.Background()
	m := f.create(f.machine("unreachable", ""))
	got := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
	nodeName := got.Status.NodeRef.Name
	f.runningPodOn(nodeName, "stuck", nil, 1)

	// The kubelet dies, and the Node turns Unknown as the node lifecycle
	// controller would have it.
	pid, err := f.provider.AgentPID(got.UID)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the Node marked Ready=Unknown", func() (bool, error) {
		n, err := f.node(nodeName)
		if err != nil {
			return false, err
		}
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == corev1.NodeReady {
				n.Status.Conditions[i].Status = corev1.ConditionUnknown
				n.Status.Conditions[i].LastTransitionTime = metav1.Now()
			}
		}
		return workload.Client.Status().Update(ctx, n) == nil, nil
	})

	if err := mgmt.Client.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	f.waitGone(m, 45*time.Second)
	pod := &corev1.Pod{}
	if err := workload.Client.Get(ctx, types.NamespacedName{Namespace: f.ns, Name: "stuck"}, pod); err == nil && pod.DeletionTimestamp == nil {
		t.Errorf("the pod on the machine's Node was never evicted")
	}
}

// pointKubeconfigAt rewrites the cluster's kubeconfig Secret to reach the
// workload cluster's API server at hostPort.
func (f *fixture) pointKubeconfigAt(hostPort string) {
	f.t.Helper()
	cfg, err := clientcmd.Load(workload.Kubeconfig)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + hostPort
	}
	kubeconfig, err := clientcmd.Write(*cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx := context.Background()
	secret := &corev1.Secret{}
	key := types.NamespacedName{Namespace: f.ns, Name: remote.KubeconfigSecretName(f.cluster)}
	if err := mgmt.Client.Get(ctx, key, secret); err != nil {
		f.t.Fatal(err)
	}
	secret.Data[remote.KubeconfigSecretKey] = kubeconfig
	if err := mgmt.Client.Update(ctx, secret); err != nil {
		f.t.Fatal(err)
	}
}

// unreachable points the cluster's kubeconfig Secret at a loopback port
// nothing listens on, as when the workload cluster's control plane is down,
// and restores it (and removes the Node left behind) when the test ends.
func (f *fixture) unreachable(node string) {
	f.t.Helper()
	f.pointKubeconfigAt("127.0.0.1:" + strconv.Itoa(testenv.FreePorts(f.t, 1)))
	f.t.Cleanup(func() {
		_ = workload.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	})
}

// The workload cluster's API server is down when a machine is deleted: it
// waits for the cluster, saying until when, and once spec.nodeDeletionTimeout
// has passed the real machine is deleted anyway, with a condition and a
// warning event saying the Node could not be removed.
func TestNodeDeletionTimeoutDeletesAMachineWhoseClusterIsUnreachable(t *testing.T) {
	f := newFixture(t)
	f.startController(Options{})
	ctx := context.Background()
	m := f.machine("cut-off", "")
	m.Spec.NodeDeletionTimeout = &metav1.Duration{Duration: 20 * time.Second}
	// A pre-terminate hook holds the machine after the decision, so that
	// its conditions can be read before it goes.
	hook := clusterv1.PreTerminateHookPrefix + "test"
	m.Annotations = map[string]string{hook: ""}
	f.create(m)
	got := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
	f.unreachable(got.Status.NodeRef.Name)
	if err := mgmt.Client.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}

	eventually(t, 20*time.Second, "the machine to wait for its cluster, saying until when", func() (bool, error) {
		got, err := f.get(m)
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineNodeReadyCondition)
		return c != nil && c.Reason == clusterv1.MachineClusterUnreachableReason && strings.Contains(c.Message, "spec.nodeDeletionTimeout 20s after the deletion"), fmt.Errorf("conditions %v", got.Status.Conditions)
	})
	eventually(t, 45*time.Second, "the machine to go on without its Node", func() (bool, error) {
		got, err := f.get(m)
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineDrainedCondition)
		hookWait := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineNodeReadyCondition)
		return c != nil && c.Reason == clusterv1.MachineNodeNotDeletedReason && strings.Contains(c.Message, "spec.nodeDeletionTimeout (20s) has passed") &&
			hookWait != nil && hookWait.Reason == clusterv1.MachineWaitingForHookReason, fmt.Errorf("conditions %v", got.Status.Conditions)
	})
	f.machineEvent(got.UID, clusterv1.MachineNodeNotDeletedReason, "could not be removed", 30*time.Second)

	live := mustGet(t, f, m)
	delete(live.Annotations, hook)
	if err := mgmt.Client.Update(ctx, live); err != nil {
		t.Fatal(err)
	}
	f.waitGone(m, 45*time.Second)
	if n := f.agents(got.UID); n != 0 {
		t.Errorf("%d agents still run for the deleted machine", n)
	}
}

// With the exclude-node-draining annotation, a machine whose workload
// cluster does not answer goes without waiting for it.
func TestExcludeNodeDrainingDeletesAMachineWhoseClusterIsUnreachable(t *testing.T) {
	f := newFixture(t)
	f.startController(Options{})
	m := f.machine("skip", "")
	m.Annotations = map[string]string{clusterv1.ExcludeNodeDrainingAnnotation: "node is gone"}
	f.create(m)
	got := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
	f.unreachable(got.Status.NodeRef.Name)
	if err := mgmt.Client.Delete(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	f.waitGone(m, 45*time.Second)
	f.machineEvent(got.UID, clusterv1.MachineNodeNotDeletedReason, clusterv1.ExcludeNodeDrainingAnnotation, 30*time.Second)
	if n := f.agents(got.UID); n != 0 {
		t.Errorf("%d agents still run for the deleted machine", n)
	}
}

// When a deletion stops waiting for an unreachable workload cluster.
func TestWithoutCluster(t *testing.T) {
	deleted := metav1.NewTime(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	tests := []struct {
		name        string
		annotations map[string]string
		timeout     *metav1.Duration
		after       time.Duration
		want        string // a part of the reason; "" to wait
	}{
		{name: "no timeout: wait for good", after: time.Hour},
		{name: "within the timeout: wait", timeout: &metav1.Duration{Duration: 30 * time.Second}, after: 29 * time.Second},
		{name: "timeout passed: go", timeout: &metav1.Duration{Duration: 30 * time.Second}, after: 30 * time.Second, want: "spec.nodeDeletionTimeout (30s) has passed"},
		{name: "timeout 0s: wait", timeout: &metav1.Duration{}, after: time.Hour},
		{name: "exclude-node-draining: go at once", annotations: map[string]string{clusterv1.ExcludeNodeDrainingAnnotation: ""}, want: "exclude-node-draining"},
	}
	for _, tc := range tests {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Annotations: tc.annotations, DeletionTimestamp: &deleted}}
		m.Spec.NodeDeletionTimeout = tc.timeout
		got := withoutCluster(m, deleted.Add(tc.after))
		if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// unreachableHost is the fixture's provider with a Delete that fails as
// the SSH provider's does when the machine's host is gone for good.
type unreachableHost struct{ *local.Provider }

func (unreachableHost) Delete(context.Context, types.UID) error {
	return errors.New("host 10.78.0.99:22: dial tcp 10.78.0.99:22: connect: no route to host")
}

// Issue 36, finding 3: a provider that cannot reach the machine (its host
// gone for good) does not hold the Machine, and its namespace, for good:
// the machine says why while the controller retries, and once
// spec.nodeDeletionTimeout has passed it goes, with a warning event
// naming the host left behind.
func TestAMachineWhoseProviderCannotDeleteItGoesAfterTheTimeout(t *testing.T) {
	f := newFixture(t)
	registry, err := provider.NewRegistry(unreachableHost{f.provider})
	if err != nil {
		t.Fatal(err)
	}
	f.startController(Options{Providers: registry})
	ctx := context.Background()
	m := f.machine("host-gone", "")
	m.Spec.NodeDeletionTimeout = &metav1.Duration{Duration: 10 * time.Second}
	f.create(m)
	got := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
	t.Cleanup(func() { _ = f.provider.Delete(context.Background(), got.UID) }) // what the test's provider left behind
	if err := mgmt.Client.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the machine to say its provider cannot delete it, and until when it waits", func() (bool, error) {
		got, err := f.get(m)
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineInstanceRunningCondition)
		return c != nil && c.Reason == clusterv1.MachineDeletionFailedReason && strings.Contains(c.Message, "no route to host") &&
			strings.Contains(c.Message, "spec.nodeDeletionTimeout after the deletion"), fmt.Errorf("conditions %v", got.Status.Conditions)
	})
	f.waitGone(m, 45*time.Second)
	f.machineEvent(got.UID, clusterv1.MachineLeftBehindReason, "host 10.78.0.99:22", 30*time.Second)
}

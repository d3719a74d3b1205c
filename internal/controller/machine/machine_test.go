package machine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider"
)

const (
	provisionTimeout = time.Minute
	deleteTimeout    = time.Minute
)

func (f *fixture) node(name string) (*corev1.Node, error) {
	n := &corev1.Node{}
	return n, workload.Client.Get(context.Background(), types.NamespacedName{Name: name}, n)
}

// The seed's core (M1-M3): a Machine becomes a real machine whose Node joins
// with the machine's labels and taints; deleting it drains the Node through
// the eviction API (a PodDisruptionBudget holds the drain until the timeout),
// stops the agent, removes the sandbox and the Node, then the finalizer.
func TestMachineRunsJoinsAndDrainsOnDelete(t *testing.T) {
	testenv.StartControllerManager(t, workload, []string{"disruption-controller"})
	f := newFixture(t)
	f.startController(Options{})
	ctx := context.Background()

	m := f.machine("w0", "")
	m.Spec.Labels = map[string]string{"pool": "blue"}
	m.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "batch", Effect: corev1.TaintEffectNoSchedule}}
	m.Spec.NodeDrainTimeout = &metav1.Duration{Duration: 5 * time.Second}
	f.create(m)

	got := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
	if got.Status.NodeRef == nil || got.Status.ProviderID != "local://"+string(got.UID) {
		t.Fatalf("running machine: nodeRef %v, providerID %q", got.Status.NodeRef, got.Status.ProviderID)
	}
	if len(got.Status.Addresses) == 0 {
		t.Error("running machine has no addresses")
	}
	eventually(t, provisionTimeout, "machine Ready with its observed kubelet version", func() (bool, error) {
		got, err := f.get(m)
		return err == nil && meta.IsStatusConditionTrue(got.Status.Conditions, clusterv1.ReadyCondition) &&
			got.Status.Versions.Kubelet == "v1.37.2", err
	})
	node, err := f.node(got.Status.NodeRef.Name)
	if err != nil {
		t.Fatal(err)
	}
	if node.Spec.ProviderID != got.Status.ProviderID {
		t.Errorf("node providerID %q, machine %q", node.Spec.ProviderID, got.Status.ProviderID)
	}
	if node.Labels["pool"] != "blue" {
		t.Errorf("node labels %v lack pool=blue", node.Labels)
	}
	if !hasTaint(node, "dedicated", "batch", corev1.TaintEffectNoSchedule) {
		t.Errorf("node taints %v lack dedicated=batch:NoSchedule", node.Spec.Taints)
	}
	// cluster-autoscaler maps Nodes to Machines by these (docs/autoscaling.md).
	for k, v := range map[string]string{
		clusterv1.NodeMachineAnnotation:          m.Name,
		clusterv1.NodeClusterNameAnnotation:      f.cluster,
		clusterv1.NodeClusterNamespaceAnnotation: f.ns,
	} {
		if node.Annotations[k] != v {
			t.Errorf("node annotation %s = %q, want %q", k, node.Annotations[k], v)
		}
	}

	// Two pods on the node; a PodDisruptionBudget protects one of them.
	podNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.ns}}
	if err := workload.Client.Create(ctx, podNS); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, name := range []string{"protected", "free"} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns, Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{
				NodeName:    node.Name,
				Tolerations: []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}},
				Containers:  []corev1.Container{{Name: "c", Image: "example.invalid/app:1"}},
			},
		}
		if err := workload.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "protected", Namespace: f.ns},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptrTo(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "protected"}},
		},
	}
	if err := workload.Client.Create(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "pods running on the node", func() (bool, error) {
		for _, name := range []string{"protected", "free"} {
			pod := &corev1.Pod{}
			if err := workload.Client.Get(ctx, types.NamespacedName{Namespace: f.ns, Name: name}, pod); err != nil {
				return false, err
			}
			if pod.Status.Phase != corev1.PodRunning {
				return false, nil
			}
		}
		return true, nil
	})

	pid, err := f.provider.AgentPID(got.UID)
	if err != nil {
		t.Fatal(err)
	}
	if err := mgmt.Client.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	eventually(t, deleteTimeout, "the drain to be blocked by the PodDisruptionBudget", func() (bool, error) {
		got, err := f.get(m)
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineDrainedCondition)
		return c != nil && c.Reason == clusterv1.MachineDrainBlockedReason && strings.Contains(c.Message, f.ns+"/protected"), nil
	})
	n, err := f.node(node.Name)
	if err != nil || !n.Spec.Unschedulable {
		t.Errorf("node not cordoned while draining (err %v)", err)
	}
	eventually(t, deleteTimeout, "the unprotected pod to be evicted", func() (bool, error) {
		err := workload.Client.Get(ctx, types.NamespacedName{Namespace: f.ns, Name: "free"}, &corev1.Pod{})
		return apierrors.IsNotFound(err), nil
	})
	f.waitGone(m, deleteTimeout)
	eventually(t, 30*time.Second, "Draining and MachineDeleted events for the operator", func() (bool, error) {
		list := &eventsv1.EventList{}
		if err := mgmt.Client.List(ctx, list, client.InNamespace(f.ns)); err != nil {
			return false, err
		}
		seen := map[string]bool{}
		for _, e := range list.Items {
			if e.Regarding.UID == got.UID {
				seen[e.Reason] = true
			}
		}
		return seen[clusterv1.MachineDrainingReason] && seen["MachineDeleted"], fmt.Errorf("events seen: %v", seen)
	})

	if _, err := f.node(node.Name); !apierrors.IsNotFound(err) {
		t.Errorf("node %s still exists after the machine is gone (err %v)", node.Name, err)
	}
	if _, err := os.Stat(filepath.Join(f.sandboxes, string(got.UID))); !os.IsNotExist(err) {
		t.Errorf("sandbox still exists after the machine is gone (err %v)", err)
	}
	if err := syscall.Kill(pid, 0); err == nil && f.agents(got.UID) > 0 {
		t.Errorf("agent pid %d still runs after the machine is gone", pid)
	}
}

func hasTaint(n *corev1.Node, key, value string, effect corev1.TaintEffect) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key && t.Value == value && t.Effect == effect {
			return true
		}
	}
	return false
}

// Crash safety: the controller is killed at each step of provisioning and
// deletion and a fresh one takes over. Never two agents for one machine,
// never a leaked sandbox, and the machine converges.
func TestControllerKilledAtEachStepConverges(t *testing.T) {
	f := newFixture(t)
	for _, step := range []string{"after-metadata", "after-create"} {
		t.Run("provisioning/"+step, func(t *testing.T) {
			f.t = t
			crashed := make(chan struct{})
			stop := f.startController(Options{crashAt: crashOnce(step, crashed)})
			m := f.create(f.machine("crash-"+step, ""))
			<-crashed
			stop()

			f.startController(Options{})
			got := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
			if n := f.agents(got.UID); n != 1 {
				t.Errorf("%d agents run for the machine, want exactly 1", n)
			}
			if _, err := f.provider.Get(context.Background(), got.UID); err != nil {
				t.Errorf("provider lost the machine: %v", err)
			}
		})
	}
	if got, want := f.sandboxCount(), 2; got != want {
		t.Errorf("%d sandboxes for %d machines", got, want)
	}
	for _, step := range []string{"after-drain", "after-provider-delete", "after-node-delete"} {
		t.Run("deletion/"+step, func(t *testing.T) {
			f.t = t
			stop := f.startController(Options{})
			m := f.create(f.machine("del-"+step, ""))
			got := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
			stop()

			crashed := make(chan struct{})
			stop = f.startController(Options{crashAt: crashOnce(step, crashed)})
			if err := mgmt.Client.Delete(context.Background(), got); err != nil {
				t.Fatal(err)
			}
			<-crashed
			stop()

			f.startController(Options{})
			f.waitGone(m, deleteTimeout)
			if n := f.agents(got.UID); n != 0 {
				t.Errorf("%d agents still run for the deleted machine", n)
			}
			if _, err := f.provider.Get(context.Background(), got.UID); !provider.IsNotFound(err) {
				t.Errorf("sandbox leaked after deletion: %v", err)
			}
			if _, err := f.node(got.Status.NodeRef.Name); !apierrors.IsNotFound(err) {
				t.Errorf("node leaked after deletion: %v", err)
			}
		})
	}
}

// A machine deleted after the provider made it, before its status said so
// (killed after Create), gets the provider's answer recorded, addresses
// included, while a pre-terminate hook holds it: the control plane finds
// a control-plane machine's etcd member by it, and waits for it before it
// lets the machine go (issue 22, finding 1). Before, only the providerID
// was recorded on the way.
func TestMachineDeletedBeforeItsStatusLandedRecordsTheProvidersAnswer(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	crashed := make(chan struct{})
	stop := f.startController(Options{crashAt: crashOnce("after-create", crashed)})
	m := f.machine("hooked", "")
	m.Annotations = map[string]string{clusterv1.PreTerminateHookPrefix + "test": ""}
	m = f.create(m)
	<-crashed
	stop()
	if err := mgmt.Client.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}

	f.startController(Options{})
	eventually(t, provisionTimeout, "the provider's answer recorded on the machine being deleted", func() (bool, error) {
		got, err := f.get(m)
		if err != nil {
			return false, err
		}
		return got.Status.ProviderID != "" && len(got.Status.Addresses) > 0, nil
	})
	got, err := f.get(m)
	if err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(got.DeepCopy())
	delete(got.Annotations, clusterv1.PreTerminateHookPrefix+"test")
	if err := mgmt.Client.Patch(ctx, got, patch); err != nil {
		t.Fatal(err)
	}
	f.waitGone(m, deleteTimeout)
	if _, err := f.provider.Get(ctx, got.UID); !provider.IsNotFound(err) {
		t.Errorf("sandbox leaked after deletion: %v", err)
	}
}

// crashOnce returns a crash hook that fires the first time step is reached.
func crashOnce(step string, crashed chan struct{}) func(string) bool {
	fired := false
	return func(s string) bool {
		if s != step || fired {
			return false
		}
		fired = true
		close(crashed)
		return true
	}
}

// A machine whose real machine vanished is reported, never re-created.
func TestVanishedMachineIsReportedNotRecreated(t *testing.T) {
	f := newFixture(t)
	f.startController(Options{})
	m := f.create(f.machine("vanish", ""))
	got := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)

	if err := f.provider.Delete(context.Background(), got.UID); err != nil {
		t.Fatal(err)
	}
	// Nudge the controller, as its periodic look or the Node going NotReady would.
	touch(t, got)
	failed := f.waitPhase(m, clusterv1.MachinePhaseFailed, provisionTimeout)
	if failed.Status.FailureReason != clusterv1.MachineVanishedReason || !strings.Contains(failed.Status.FailureMessage, "no longer exists") {
		t.Errorf("failure %q: %q", failed.Status.FailureReason, failed.Status.FailureMessage)
	}
	touch(t, failed)
	eventually(t, 10*time.Second, "the touched machine to be reconciled again", func() (bool, error) {
		got, err := f.get(m)
		return err == nil && got.Annotations["test/touched"] != "" && got.Status.ObservedGeneration == got.Generation, err
	})
	if _, err := f.provider.Get(context.Background(), got.UID); !provider.IsNotFound(err) {
		t.Errorf("the vanished machine was re-created: %v", err)
	}
}

func touch(t *testing.T, m *clusterv1.Machine) {
	t.Helper()
	patch := []byte(`{"metadata":{"annotations":{"test/touched":"` + time.Now().Format(time.RFC3339Nano) + `"}}}`)
	if err := mgmt.Client.Patch(context.Background(), m.DeepCopy(), client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
}

// With its finalizer and owner reference stripped, a running machine gets
// them back, and nothing is replaced: same sandbox, same agent, same Node.
func TestStrippedMetadataIsRestoredWithoutReplacing(t *testing.T) {
	f := newFixture(t)
	f.startController(Options{})
	m := f.create(f.machine("strip", ""))
	got := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
	eventually(t, 10*time.Second, "owner reference to the Cluster", func() (bool, error) {
		got, err := f.get(m)
		return err == nil && len(got.OwnerReferences) == 1, err
	})
	pid, _ := f.provider.AgentPID(got.UID)
	node, err := f.node(got.Status.NodeRef.Name)
	if err != nil {
		t.Fatal(err)
	}

	patch := []byte(`{"metadata":{"finalizers":null,"ownerReferences":null}}`)
	if err := mgmt.Client.Patch(context.Background(), got, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "finalizer and owner reference restored", func() (bool, error) {
		got, err := f.get(m)
		if err != nil {
			return false, err
		}
		return len(got.Finalizers) == 1 && len(got.OwnerReferences) == 1 && got.OwnerReferences[0].Kind == "Cluster", nil
	})
	after, _ := f.get(m)
	if after.Status.ProviderID != got.Status.ProviderID {
		t.Errorf("providerID changed %q -> %q", got.Status.ProviderID, after.Status.ProviderID)
	}
	if pid2, _ := f.provider.AgentPID(got.UID); pid2 != pid {
		t.Errorf("agent replaced: pid %d -> %d", pid, pid2)
	}
	node2, err := f.node(node.Name)
	if err != nil || node2.UID != node.UID {
		t.Errorf("node replaced (err %v)", err)
	}
	if f.sandboxCount() != 1 {
		t.Errorf("%d sandboxes, want 1", f.sandboxCount())
	}
}

// A machine an older marina made carries the finalizer's legacy name: the
// controller replaces it, and a machine deleted while it still carries it
// is taken apart all the same (nothing made is left behind).
func TestLegacyFinalizerIsReplacedAndHonoured(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	m := f.machine("legacy", "")
	m.Finalizers = []string{clusterv1.LegacyMachineFinalizer}
	f.create(m)
	stop := f.startController(Options{})
	f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
	eventually(t, 10*time.Second, "the finalizer renamed", func() (bool, error) {
		got, err := f.get(m)
		return err == nil && slices.Equal(got.Finalizers, []string{clusterv1.MachineFinalizer}), err
	})
	stop()

	// As an older marina left it, then deleted with no controller running.
	got := mustGet(t, f, m)
	patch := client.MergeFrom(got.DeepCopy())
	got.Finalizers = []string{clusterv1.LegacyMachineFinalizer}
	if err := mgmt.Client.Patch(ctx, got, patch); err != nil {
		t.Fatal(err)
	}
	if err := mgmt.Client.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	f.startController(Options{})
	f.waitGone(m, 60*time.Second)
	if n := f.sandboxCount(); n != 0 {
		t.Errorf("%d sandboxes left after the machine went, want 0", n)
	}
}

// A killed agent stops heartbeating: the real node lifecycle controller
// marks the Node's Ready condition Unknown, and the Machine shows it. (The
// machine is one an operator stopped on purpose: any other is started
// again at once, TestKilledAgentIsStartedAgain.)
func TestKilledAgentTurnsNodeAndMachineUnknown(t *testing.T) {
	testenv.StartControllerManager(t, workload, []string{"node-lifecycle-controller"},
		"--node-monitor-grace-period=8s", "--node-monitor-period=1s")
	f := newFixture(t)
	f.startController(Options{})
	m := f.machine("killed", "")
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
	eventually(t, time.Minute, "the Node's Ready condition to turn Unknown", func() (bool, error) {
		n, err := f.node(got.Status.NodeRef.Name)
		if err != nil {
			return false, err
		}
		c := nodeCondition(n, corev1.NodeReady)
		return c != nil && c.Status == corev1.ConditionUnknown, nil
	})
	eventually(t, 30*time.Second, "the Machine's NodeReady condition to turn Unknown", func() (bool, error) {
		got, err := f.get(m)
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineNodeReadyCondition)
		ready := meta.FindStatusCondition(got.Status.Conditions, clusterv1.ReadyCondition)
		return c != nil && c.Status == metav1.ConditionUnknown && ready != nil && ready.Status != metav1.ConditionTrue, nil
	})
}

// Bad input: an invalid blob fails with the field named; an unknown kind is
// reported as having no provider. Neither is retried in a hot loop.
func TestInvalidBlobAndUnknownKindAreReported(t *testing.T) {
	f := newFixture(t)
	f.startController(Options{ReportUnowned: true})

	bad := f.create(f.machine("bad", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memroy":"4Gi"}}`))
	failed := f.waitPhase(bad, clusterv1.MachinePhaseFailed, provisionTimeout)
	if failed.Status.FailureReason != clusterv1.MachineInvalidProviderSpecReason || !strings.Contains(failed.Status.FailureMessage, "memroy") {
		t.Errorf("failure %q: %q; want InvalidProviderSpec naming spec.memroy", failed.Status.FailureReason, failed.Status.FailureMessage)
	}

	unknown := f.create(f.machine("unknown", `{"apiVersion":"gpu.example.com/v1","kind":"GPUMachine","spec":{}}`))
	eventually(t, 30*time.Second, "the no-provider condition", func() (bool, error) {
		got, err := f.get(unknown)
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineProvisionedCondition)
		return c != nil && c.Reason == clusterv1.MachineProviderNotFoundReason && strings.Contains(c.Message, "GPUMachine"), nil
	})
	// A hot loop shows as reconciles and status writes that go on without
	// any change to the machines. Asserting an absence needs a window.
	before := reconcileCount(t)
	rvFailed, rvUnknown := mustGet(t, f, failed).ResourceVersion, mustGet(t, f, unknown).ResourceVersion
	time.Sleep(3 * time.Second)
	if n := reconcileCount(t) - before; n > 2 {
		t.Errorf("%v reconciles in 3s with nothing changing: a hot loop", n)
	}
	if mustGet(t, f, failed).ResourceVersion != rvFailed || mustGet(t, f, unknown).ResourceVersion != rvUnknown {
		t.Error("a settled machine's object keeps being rewritten")
	}
	for _, m := range []*clusterv1.Machine{failed, unknown} {
		if f.agents(m.UID) != 0 {
			t.Errorf("an agent runs for machine %s, which must not be provisioned", m.Name)
		}
	}
	if f.sandboxCount() != 0 {
		t.Errorf("%d sandboxes for machines that must not be provisioned", f.sandboxCount())
	}
}

func mustGet(t *testing.T, f *fixture, m *clusterv1.Machine) *clusterv1.Machine {
	t.Helper()
	got, err := f.get(m)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// Two providers side by side (M2): each acts only on its own kind, and the
// reporting controller leaves kinds owned elsewhere alone.
func TestTwoProvidersEachActOnlyOnTheirKind(t *testing.T) {
	f := newFixture(t)
	other, err := newProvider(filepath.Join(suite.TmpDir, "machines-other-"+f.ns))
	if err != nil {
		t.Fatal(err)
	}
	otherKind := schema.GroupVersionKind{Group: "other.marina.dev", Version: "v1alpha1", Kind: "OtherMachine"}
	regA, _ := provider.NewRegistry(f.provider)
	regB, _ := provider.NewRegistry(renamedKind{other, otherKind})
	f.startController(Options{Providers: regA, ReportUnowned: true, ExternalKinds: []schema.GroupVersionKind{otherKind}})
	f.startController(Options{Providers: regB})

	a := f.create(f.machine("kind-a", ""))
	b := f.create(f.machine("kind-b", `{"apiVersion":"other.marina.dev/v1alpha1","kind":"OtherMachine","spec":{"cpu":1,"memory":"1Gi"}}`))
	gotA := f.waitPhase(a, clusterv1.MachinePhaseRunning, provisionTimeout)
	gotB := f.waitPhase(b, clusterv1.MachinePhaseRunning, provisionTimeout)

	if _, err := f.provider.Get(context.Background(), gotA.UID); err != nil {
		t.Errorf("machine A is not at provider A: %v", err)
	}
	if _, err := other.Get(context.Background(), gotA.UID); !provider.IsNotFound(err) {
		t.Errorf("provider B made machine A: %v", err)
	}
	if _, err := other.Get(context.Background(), gotB.UID); err != nil {
		t.Errorf("machine B is not at provider B: %v", err)
	}
	if _, err := f.provider.Get(context.Background(), gotB.UID); !provider.IsNotFound(err) {
		t.Errorf("provider A made machine B: %v", err)
	}
	if c := meta.FindStatusCondition(gotB.Status.Conditions, clusterv1.MachineProvisionedCondition); c == nil || c.Reason == clusterv1.MachineProviderNotFoundReason {
		t.Errorf("machine B was reported unowned: %v", c)
	}
	for _, m := range []*clusterv1.Machine{gotA, gotB} {
		if err := mgmt.Client.Delete(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	f.waitGone(a, deleteTimeout)
	f.waitGone(b, deleteTimeout)
}

// renamedKind is a second provider for the side-by-side test: the local
// provider under another kind, as a GPU or bare-metal provider would be.
type renamedKind struct {
	provider.Provider
	kind schema.GroupVersionKind
}

func (r renamedKind) Name() string                     { return "other" }
func (r renamedKind) Kinds() []schema.GroupVersionKind { return []schema.GroupVersionKind{r.kind} }
func (r renamedKind) Validate(raw []byte) error        { return r.Provider.Validate(asLocal(raw)) }
func (r renamedKind) Create(ctx context.Context, req *provider.Request) (*provider.Instance, error) {
	req.ProviderSpec = asLocal(req.ProviderSpec)
	return r.Provider.Create(ctx, req)
}

func asLocal(raw []byte) []byte {
	s := strings.Replace(string(raw), `"apiVersion":"other.marina.dev/v1alpha1"`, `"apiVersion":"local.marina.dev/v1alpha1"`, 1)
	return []byte(strings.Replace(s, `"kind":"OtherMachine"`, `"kind":"LocalMachine"`, 1))
}

// reconcileCount is the machine controller's reconcile total across results,
// from controller-runtime's own metrics.
func reconcileCount(t *testing.T) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, fam := range families {
		if fam.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == "machine" {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

// An administrator narrowing a class must not break the machines already
// running from it: they keep running and say their configuration no longer
// resolves, while a new machine with the same override is refused.
func TestNarrowedClassKeepsRunningMachines(t *testing.T) {
	f := newFixture(t)
	f.startController(Options{})
	ctx := context.Background()
	mc := &clusterv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Name: f.ns + "-disk"},
		Spec: clusterv1.MachineClassSpec{
			ProviderSpec:     runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","diskSize":"10Gi"}}`)},
			AllowedOverrides: []string{"spec.diskSize"},
		},
	}
	if err := mgmt.Client.Create(ctx, mc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgmt.Client.Delete(context.Background(), mc) })
	override := `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"diskSize":"20Gi"}}`
	newMachine := func(name string) *clusterv1.Machine {
		m := f.machine(name, override)
		m.Spec.ClassRef = &clusterv1.MachineClassReference{Name: mc.Name}
		return f.create(m)
	}
	running := f.waitPhase(newMachine("before"), clusterv1.MachinePhaseRunning, provisionTimeout)

	mc.Spec.AllowedOverrides = []string{"spec.memory"}
	if err := mgmt.Client.Update(ctx, mc); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the running machine to report its configuration no longer resolves", func() (bool, error) {
		got, err := f.get(running)
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineProviderSpecResolvedCondition)
		return c != nil && c.Reason == clusterv1.MachineOverrideNotAllowedReason, fmt.Errorf("conditions %v", got.Status.Conditions)
	})
	got := mustGet(t, f, running)
	if got.Status.Phase != clusterv1.MachinePhaseRunning || got.Status.FailureReason != "" {
		t.Errorf("running machine became %s (%s: %s) when its class narrowed", got.Status.Phase, got.Status.FailureReason, got.Status.FailureMessage)
	}
	failed := f.waitPhase(newMachine("after"), clusterv1.MachinePhaseFailed, provisionTimeout)
	if !strings.Contains(failed.Status.FailureMessage, "spec.diskSize") {
		t.Errorf("new machine's failure %q does not name spec.diskSize", failed.Status.FailureMessage)
	}
}

// A machine deleted before it was ever made goes at once, even while its
// cluster has no kubeconfig yet: no Node can exist to drain.
func TestMachineNeverMadeGoesAtOnce(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: remote.KubeconfigSecretName(f.cluster), Namespace: f.ns}}
	if err := mgmt.Client.Delete(ctx, secret); err != nil {
		t.Fatal(err)
	}
	f.startController(Options{})
	m := f.create(f.machine("never-made", ""))
	eventually(t, 30*time.Second, "the machine to wait for its control plane", func() (bool, error) {
		got, err := f.get(m)
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineProvisionedCondition)
		return c != nil && c.Reason == clusterv1.MachineWaitingForControlPlaneReason, nil
	})
	if err := mgmt.Client.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	f.waitGone(m, 30*time.Second)
}

// A running machine deleted after its cluster's kubeconfig is gone waits
// to drain its Node, and goes as soon as its Cluster goes (as when a
// namespace is deleted): with the cluster gone there is no Node to drain.
func TestMachineWaitingForItsClusterGoesWithTheCluster(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.startController(Options{})
	m := f.create(f.machine("waiting", ""))
	f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: remote.KubeconfigSecretName(f.cluster), Namespace: f.ns}}
	if err := mgmt.Client.Delete(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if err := mgmt.Client.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the deleting machine to wait for the kubeconfig", func() (bool, error) {
		got, err := f.get(m)
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineNodeReadyCondition)
		return c != nil && c.Reason == clusterv1.MachineWaitingForControlPlaneReason, nil
	})
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: f.cluster, Namespace: f.ns}}
	if err := mgmt.Client.Delete(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	f.waitGone(m, 30*time.Second)
	if n := f.sandboxCount(); n != 0 {
		t.Errorf("%d sandboxes left after the machine went", n)
	}
}

// A control-plane machine the control plane refuses for good (not one of
// its own) says so, and does not claim it is retrying; a passing failure
// says it retries.
func TestARefusedControlPlaneBootstrapSaysSo(t *testing.T) {
	f := newFixture(t)
	f.startController(Options{ControlPlaneBootstrap: func(_ context.Context, m *clusterv1.Machine) ([]byte, error) {
		if strings.HasSuffix(m.Name, "refused") {
			return nil, reconcile.TerminalError(fmt.Errorf("machine %s is not a member of the control plane", m.Name))
		}
		return nil, errors.New("the cluster has no control-plane endpoint yet")
	}})
	for _, tc := range []struct{ name, reason, say, never string }{
		{"refused", clusterv1.MachineBootstrapRefusedReason, "refuses this machine", "retrying"},
		{"waiting", clusterv1.MachineWaitingForControlPlaneReason, "(retrying)", "refuses"},
	} {
		m := f.machine(tc.name, "")
		m.Spec.Roles = []clusterv1.MachineRole{clusterv1.ControlPlaneRole}
		m.Spec.Versions.ControlPlane = "v1.37.2"
		f.create(m)
		eventually(t, 30*time.Second, tc.name+": Provisioned says "+tc.reason, func() (bool, error) {
			got, err := f.get(m)
			if err != nil {
				return false, err
			}
			c := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineProvisionedCondition)
			if c == nil || c.Reason != tc.reason {
				return false, fmt.Errorf("condition %+v", c)
			}
			if !strings.Contains(c.Message, tc.say) || strings.Contains(c.Message, tc.never) {
				t.Fatalf("%s: message %q, want %q and no %q", tc.name, c.Message, tc.say, tc.never)
			}
			return true, nil
		})
	}
}

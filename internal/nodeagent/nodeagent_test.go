package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"marina.dev/marina/internal/bootstraptoken"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/internal/testenv"
)

var env *testenv.Env

// The agents join a stand-in for a cluster someone else runs, by TLS
// bootstrap, under the Node authorizer and NodeRestriction.
func TestMain(m *testing.M) { testenv.MainWorkload(m, &env) }

// fast is the agent's timing shortened for tests.
var fast = timing{
	leaseRenew:    200 * time.Millisecond,
	leaseDuration: 40,
	statusUpdate:  time.Second,
	statusReport:  2 * time.Second,
	lockWait:      200 * time.Millisecond,
	retryMax:      time.Second,
	logCheck:      time.Second,
	logMax:        10 << 20,
}

func adminClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// eventually waits for cond; see testenv.Eventually.
var eventually = testenv.Eventually

// bootstrapDir writes a sandbox for a node agent of env's API server that
// authenticates with token.
func bootstrapDir(t *testing.T, node, token string) (string, *sandbox.Bootstrap) {
	t.Helper()
	dir := t.TempDir()
	b := &sandbox.Bootstrap{
		Server:     env.Config.Host,
		CAPEM:      string(env.Config.CAData),
		Token:      token,
		NodeName:   node,
		ProviderID: "local://" + node,
		Address:    "127.9.8.7",
		Labels:     map[string]string{"example.marina.dev/pool": "default"},
		Taints:     []corev1.Taint{{Key: "example.marina.dev/dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}},
		// marina's names for the Machine, which spare it a Node write.
		Annotations: map[string]string{"cluster.marina.dev/machine": node},
		Capacity: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("2"),
			corev1.ResourceMemory: resource.MustParse("4Gi"),
			corev1.ResourcePods:   resource.MustParse("110"),
			"nvidia.com/gpu":      resource.MustParse("1"),
		},
		KubeletVersion:          "v1.37.2",
		ContainerRuntimeVersion: "containerd://2.1.4",
	}
	if err := sandbox.WriteBootstrap(dir, b); err != nil {
		t.Fatal(err)
	}
	return dir, b
}

func TestAgent(t *testing.T) {
	ctx := t.Context()
	cs := adminClient(t)
	token := joinToken(t, cs)
	node := "agent-" + rand.String(6)
	dir, b := bootstrapDir(t, node, token)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, dir, fast) }()
	t.Cleanup(func() { stop(); <-done })

	t.Log("the Node registers with the machine's identity and capacity, Ready")
	var (
		n   *corev1.Node
		err error
	)
	eventually(t, 30*time.Second, "node registered and Ready", func() error {
		n, err = cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c := nodeCondition(n, corev1.NodeReady); c == nil || c.Status != corev1.ConditionTrue || c.Reason != reasonReady {
			return fmt.Errorf("ready condition is %+v", c)
		}
		return nil
	})
	checkNode(t, n, b)

	t.Log("the Lease is held by the node, owned by the Node, and renewed")
	var first *coordinationv1.Lease
	eventually(t, 10*time.Second, "lease created", func() error {
		first, err = cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, node, metav1.GetOptions{})
		return err
	})
	if ptr.Deref(first.Spec.HolderIdentity, "") != node || ptr.Deref(first.Spec.LeaseDurationSeconds, 0) != 40 {
		t.Errorf("lease spec = %+v, want holder %s and 40s", first.Spec, node)
	}
	if len(first.OwnerReferences) != 1 || first.OwnerReferences[0].UID != n.UID || first.OwnerReferences[0].Kind != "Node" {
		t.Errorf("lease owners = %+v, want the Node %s", first.OwnerReferences, n.UID)
	}
	eventually(t, 10*time.Second, "lease renewed", func() error {
		l, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !l.Spec.RenewTime.After(first.Spec.RenewTime.Time) {
			return fmt.Errorf("renewTime still %v", l.Spec.RenewTime)
		}
		return nil
	})

	t.Log("the Ready condition gets heartbeats")
	beat := nodeCondition(n, corev1.NodeReady).LastHeartbeatTime
	eventually(t, 10*time.Second, "ready heartbeat", func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c := nodeCondition(n, corev1.NodeReady); !c.LastHeartbeatTime.After(beat.Time) {
			return fmt.Errorf("lastHeartbeatTime still %v", c.LastHeartbeatTime)
		}
		return nil
	})

	t.Log("a pod bound to the node runs and becomes Ready")
	ns := env.Namespace(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: corev1.PodSpec{
			NodeName:       node,
			InitContainers: []corev1.Container{{Name: "init", Image: "busybox"}},
			Containers:     []corev1.Container{{Name: "web", Image: "nginx"}, {Name: "sidecar", Image: "busybox"}},
		},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "pod running and ready", func() error {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		for _, ct := range []corev1.PodConditionType{corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled, corev1.PodInitialized} {
			if c := podCondition(&p.Status, ct); c == nil || c.Status != corev1.ConditionTrue {
				return fmt.Errorf("condition %s is %+v", ct, c)
			}
		}
		if p.Status.PodIP != b.Address || p.Status.StartTime == nil {
			return fmt.Errorf("podIP %q, startTime %v", p.Status.PodIP, p.Status.StartTime)
		}
		if len(p.Status.ContainerStatuses) != 2 {
			return fmt.Errorf("%d container statuses", len(p.Status.ContainerStatuses))
		}
		for _, s := range p.Status.ContainerStatuses {
			if !s.Ready || s.State.Running == nil {
				return fmt.Errorf("container %s: %+v", s.Name, s)
			}
		}
		return nil
	})

	t.Log("a pod deleted with a grace period is confirmed gone")
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "web", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](30)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "pod gone", func() error {
		_, err := cs.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("pod still there: %v", err)
	})

	t.Log("a second agent for the sandbox refuses to run")
	if err := run(ctx, dir, fast); !errors.Is(err, sandbox.ErrLocked) {
		t.Errorf("second agent: err = %v, want ErrLocked", err)
	}

	t.Log("cancelling the context stops the agent and its renewals")
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("agent returned %v after cancel, want nil", err)
		}
		done <- nil // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("agent still running 10s after its context was cancelled")
	}
	last, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A negative can only be watched for a while: ten renewal periods.
	time.Sleep(10 * fast.leaseRenew)
	after, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !after.Spec.RenewTime.Equal(last.Spec.RenewTime) {
		t.Errorf("lease renewed after the agent stopped: %v -> %v", last.Spec.RenewTime, after.Spec.RenewTime)
	}
	if held, err := sandbox.Held(dir); err != nil || held {
		t.Errorf("agent lock still held after stop (held=%v, err=%v)", held, err)
	}

	t.Log("a restarted agent takes its existing Node and Lease over")
	ctx2, stop2 := context.WithCancel(ctx)
	done2 := make(chan error, 1)
	go func() { done2 <- run(ctx2, dir, fast) }()
	defer stop2()
	eventually(t, 10*time.Second, "lease renewed by the restarted agent", func() error {
		l, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !l.Spec.RenewTime.After(after.Spec.RenewTime.Time) {
			return fmt.Errorf("renewTime still %v", l.Spec.RenewTime)
		}
		return nil
	})

	t.Log("an agent whose sandbox is removed stops")
	if err := os.Remove(filepath.Join(dir, sandbox.BootstrapFile)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done2:
		if err != nil {
			t.Errorf("agent returned %v after its sandbox was removed, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent still running 10s after its sandbox was removed")
	}
}

func checkNode(t *testing.T, n *corev1.Node, b *sandbox.Bootstrap) {
	t.Helper()
	if n.Spec.ProviderID != b.ProviderID {
		t.Errorf("providerID = %q, want %q", n.Spec.ProviderID, b.ProviderID)
	}
	for k, v := range map[string]string{
		"example.marina.dev/pool": "default",
		hostnameLabel:             b.NodeName,
		instanceTypeLabel:         instanceType,
	} {
		if n.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, n.Labels[k], v)
		}
	}
	if got := n.Annotations["cluster.marina.dev/machine"]; got != b.NodeName {
		t.Errorf("annotation cluster.marina.dev/machine = %q, want %q", got, b.NodeName)
	}
	// The API server adds node.kubernetes.io/not-ready at creation (the
	// node lifecycle controller, absent here, removes it): look for ours.
	found := false
	for _, taint := range n.Spec.Taints {
		found = found || (taint.MatchTaint(&b.Taints[0]) && taint.Value == b.Taints[0].Value)
	}
	if !found {
		t.Errorf("taints = %+v, want them to include %+v", n.Spec.Taints, b.Taints[0])
	}
	for name, want := range b.Capacity {
		if got := n.Status.Capacity[name]; got.Cmp(want) != 0 {
			t.Errorf("capacity %s = %s, want %s", name, got.String(), want.String())
		}
		if got := n.Status.Allocatable[name]; got.Cmp(want) != 0 {
			t.Errorf("allocatable %s = %s, want %s", name, got.String(), want.String())
		}
	}
	if n.Status.NodeInfo.KubeletVersion != b.KubeletVersion {
		t.Errorf("kubeletVersion = %q, want %q", n.Status.NodeInfo.KubeletVersion, b.KubeletVersion)
	}
	if n.Status.NodeInfo.ContainerRuntimeVersion != b.ContainerRuntimeVersion {
		t.Errorf("containerRuntimeVersion = %q, want %q", n.Status.NodeInfo.ContainerRuntimeVersion, b.ContainerRuntimeVersion)
	}
	wantAddrs := map[corev1.NodeAddressType]string{corev1.NodeInternalIP: b.Address, corev1.NodeHostName: b.NodeName}
	for _, a := range n.Status.Addresses {
		if wantAddrs[a.Type] == a.Address {
			delete(wantAddrs, a.Type)
		}
	}
	if len(wantAddrs) > 0 {
		t.Errorf("addresses = %+v, missing %v", n.Status.Addresses, wantAddrs)
	}
}

func nodeCondition(n *corev1.Node, t corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == t {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// Between reports the agent writes the Node's status only when it differs
// from its own: a Ready condition the node lifecycle controller set to
// Unknown (an outage) is put back at the next look, while an unchanged
// status is not written at all (a thousand simulated workers posting every
// look cost their API servers a write each).
func TestAgentPostsStatusOnlyWhenItDiffers(t *testing.T) {
	ctx := t.Context()
	cs := adminClient(t)
	quiet := fast
	quiet.statusUpdate = 200 * time.Millisecond
	quiet.statusReport = time.Hour
	node, _, _ := runAgent(t, "status-", quiet)

	var (
		n   *corev1.Node
		err error
	)
	eventually(t, 30*time.Second, "node registered and Ready", func() error {
		n, err = cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c := nodeCondition(n, corev1.NodeReady); c == nil || c.Status != corev1.ConditionTrue {
			return fmt.Errorf("ready condition is %+v", c)
		}
		return nil
	})

	// Ten looks later, the Node is the same object: nothing was written.
	rv := n.ResourceVersion
	time.Sleep(10 * quiet.statusUpdate) // the absence of writes over ten looks is the assertion
	if n, err = cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if n.ResourceVersion != rv {
		t.Errorf("the Node was written while its status did not change: resourceVersion %s, then %s", rv, n.ResourceVersion)
	}

	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i].Status = corev1.ConditionUnknown
			n.Status.Conditions[i].Reason = "NodeStatusUnknown"
		}
	}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "Ready put back", func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c := nodeCondition(n, corev1.NodeReady); c.Status != corev1.ConditionTrue || c.Reason != reasonReady {
			return fmt.Errorf("ready condition is %+v", c)
		}
		return nil
	})
}

// runAgent runs, until the test ends, an agent of a new sandbox whose node
// name starts with prefix, joining with a fresh token.
func runAgent(t *testing.T, prefix string, timing timing) (node, dir, token string) {
	t.Helper()
	token = joinToken(t, adminClient(t))
	node = prefix + rand.String(6)
	dir, _ = bootstrapDir(t, node, token)
	runCtx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- run(runCtx, dir, timing) }()
	t.Cleanup(func() { stop(); <-done })
	return node, dir, token
}

// joinToken allows TLS bootstrap on the API server, as the machine
// controller does (with kube-controller-manager approving in place of the
// machine controller), and makes a bootstrap token of a new machine.
func joinToken(t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	if err := bootstraptoken.EnsureRBAC(t.Context(), cs); err != nil {
		t.Fatal(err)
	}
	if err := testenv.ApproveBootstrapCertificates(t.Context(), cs); err != nil {
		t.Fatal(err)
	}
	token, err := bootstraptoken.Ensure(t.Context(), cs, uuid.NewUUID(), bootstraptoken.DefaultTTL, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return token
}

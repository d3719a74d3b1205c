package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/provider"
)

// Issue: scale. Pooled workers of one cluster run in one process, each
// with its own sandbox, lock, Node and Lease. Deleting one leaves the
// others running; killing the pool is the loss of its machines, each of
// which Create brings back, once, as it does a dead agent process; the
// last one deleted takes the pool away.
func TestPooledWorkersShareOneProcess(t *testing.T) {
	ctx := t.Context()
	env, cs, token := joinToken(t)
	p := newProvider(t)
	var reqs []*provider.Request
	for i := range 3 {
		req := request(fmt.Sprintf("pooled-%d", i))
		req.Machine.ClusterName = "pooled"
		req.ProviderSpec = []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","agent":"Pooled"}}`)
		req.Bootstrap = provider.Bootstrap{Server: env.Config.Host, CAData: env.Config.CAData, Token: token}
		inst, err := p.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if inst.State != provider.InstanceRunning {
			t.Errorf("Create of a pooled machine: %s, want Running (it waits for the member's lock)", inst.State)
		}
		reqs = append(reqs, req)
	}
	poolDir := filepath.Join(p.root, poolsDir, "default_pooled")
	nodesReady(t, ctx, cs, "pooled-0", "pooled-1", "pooled-2")
	poolPID, err := p.AgentPID(reqs[0].UID)
	if err != nil {
		t.Fatal(err)
	}
	if n := agentsOf(poolDir); n != 1 {
		t.Errorf("%d pool processes, want 1", n)
	}
	for _, req := range reqs {
		if n := agentsOf(p.sandboxDir(req.UID)); n != 0 {
			t.Errorf("%s has %d agent processes of its own, want none", req.Name, n)
		}
		if pid, _ := p.AgentPID(req.UID); pid != poolPID {
			t.Errorf("%s: agent PID %d, want the pool's %d", req.Name, pid, poolPID)
		}
		log, err := os.ReadFile(filepath.Join(p.sandboxDir(req.UID), sandbox.LogFile))
		if err != nil || !strings.Contains(string(log), "Starting node agent") {
			t.Errorf("%s's own log does not show its agent starting (%v):\n%s", req.Name, err, log)
		}
	}

	t.Log("deleting one machine leaves the others running")
	if err := p.Delete(ctx, reqs[2].UID); err != nil {
		t.Fatal(err)
	}
	for _, req := range reqs[:2] {
		if inst, err := p.Get(ctx, req.UID); err != nil || inst.State != provider.InstanceRunning {
			t.Errorf("%s after another's deletion: %+v, %v", req.Name, inst, err)
		}
	}
	lease0 := leaseRenewal(t, ctx, cs, "pooled-0")
	eventually(t, 30*time.Second, "pooled-0 renewing its Lease", func() error {
		if !leaseRenewal(t, ctx, cs, "pooled-0").After(lease0) {
			return fmt.Errorf("not renewed since %s", lease0)
		}
		return nil
	})

	t.Log("the pool killed: its machines are Stopped; Create brings each back once")
	if err := syscall.Kill(poolPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "both machines stopped", func() error {
		for _, req := range reqs[:2] {
			inst, err := p.Get(ctx, req.UID)
			if err != nil {
				return err
			}
			if inst.State != provider.InstanceStopped {
				return fmt.Errorf("%s is %s", req.Name, inst.State)
			}
		}
		return nil
	})
	for _, req := range reqs[:2] {
		if _, err := p.Create(ctx, req); err != nil {
			t.Fatalf("Create of %s after the pool's death: %v", req.Name, err)
		}
	}
	eventually(t, 10*time.Second, "both machines running again", func() error {
		for _, req := range reqs[:2] {
			if inst, err := p.Get(ctx, req.UID); err != nil || inst.State != provider.InstanceRunning {
				return fmt.Errorf("%s: %+v, %v", req.Name, inst, err)
			}
		}
		return nil
	})
	if n := agentsOf(poolDir); n != 1 {
		t.Errorf("%d pool processes after recovery, want 1", n)
	}
	if pid, _ := p.AgentPID(reqs[0].UID); pid == poolPID {
		t.Errorf("the pool's PID %d did not change", pid)
	}
	uids, err := p.UIDs()
	if err != nil || len(uids) != 2 {
		t.Errorf("sandboxes after recovery: %v (%v), want 2", uids, err)
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pooled := 0
	for _, n := range nodes.Items {
		if strings.HasPrefix(n.Name, "pooled-") {
			pooled++
		}
	}
	if pooled != 3 { // pooled-2's Node stays for the machine controller to delete
		t.Errorf("%d pooled Nodes, want 3: no duplicate after the recovery", pooled)
	}
	nodesReady(t, ctx, cs, "pooled-0", "pooled-1")

	t.Log("the last machine out takes the pool with it")
	for _, req := range reqs[:2] {
		if err := p.Delete(ctx, req.UID); err != nil {
			t.Fatal(err)
		}
	}
	if n := agentsOf(poolDir); n != 0 {
		t.Errorf("%d pool processes after the last deletion", n)
	}
	if _, err := os.Stat(poolDir); !os.IsNotExist(err) {
		t.Errorf("the pool's directory is left: %v", err)
	}
	for _, name := range []string{"pooled-0", "pooled-1", "pooled-2"} {
		_ = cs.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	}
}

func TestPooledControlPlaneIsRefused(t *testing.T) {
	p := newProvider(t)
	req := request("cp")
	req.ProviderSpec = []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","agent":"Pooled"}}`)
	req.Bootstrap = provider.Bootstrap{ControlPlane: []byte(`{}`)}
	_, err := p.Create(t.Context(), req)
	if err == nil || !strings.Contains(err.Error(), "spec.agent") {
		t.Errorf("a pooled control-plane machine: %v, want an error naming spec.agent", err)
	}
}

func nodesReady(t *testing.T, ctx context.Context, cs kubernetes.Interface, names ...string) {
	t.Helper()
	eventually(t, 60*time.Second, fmt.Sprintf("Nodes %v Ready", names), func() error {
		for _, name := range names {
			n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			ready := false
			for _, c := range n.Status.Conditions {
				ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
			}
			if !ready {
				return fmt.Errorf("%s not Ready", name)
			}
		}
		return nil
	})
}

func leaseRenewal(t *testing.T, ctx context.Context, cs kubernetes.Interface, node string) time.Time {
	t.Helper()
	var lease *coordinationv1.Lease
	eventually(t, 30*time.Second, "the Lease of "+node, func() error {
		var err error
		lease, err = cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, node, metav1.GetOptions{})
		if err == nil && lease.Spec.RenewTime == nil {
			return fmt.Errorf("never renewed")
		}
		return err
	})
	return lease.Spec.RenewTime.Time
}

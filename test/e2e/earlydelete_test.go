package e2e

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
)

// Issue 22, finding 1, on real processes: during a scale 1 → 3, a new
// control-plane Machine is deleted the moment it exists, before it has an
// address, twice. Its member (the agent may have added it already) is
// removed before its sandbox goes: the cluster ends with 3 machines and 3
// healthy voting members (no learner left), and keeps serving writes.
func TestControlPlaneMachinesDeletedBeforeTheirAddressDoNotCostTheQuorum(t *testing.T) {
	u, root, c := startUpWithClient(t)
	ctx := context.Background()
	cluster := `apiVersion: cluster.marina.dev/v1alpha1
kind: Cluster
metadata: {name: early, namespace: default}
spec:
  clusterNetwork: {pods: ["10.244.0.0/16"], services: ["10.96.0.0/12"], dnsDomain: cluster.local}
  controlPlane:
    version: v1.37.2
    replicas: 1
    providerSpec:
      apiVersion: local.marina.dev/v1alpha1
      kind: LocalMachine
      spec: {cpu: 2, memory: 2Gi}
`
	if out, err := u.kubectlStdin(t, cluster, "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	key := types.NamespacedName{Namespace: "default", Name: "early"}
	waitControlPlane(t, ctx, c, key, 1, 4*time.Minute)
	w := startWriter(ctx, workloadClient(t, ctx, c, key))
	defer w.stop()

	if out, err := u.kubectl(t, "patch", "cluster", "early", "--type=merge", "-p", `{"spec":{"controlPlane":{"replicas":3}}}`); err != nil {
		t.Fatalf("kubectl patch: %v\n%s", err, out)
	}
	// Looked for every 20ms: the provider takes longer than that to make
	// a machine and record its address.
	var deleted []string
	for deadline := time.Now().Add(3 * time.Minute); len(deleted) < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d new control-plane machines were seen without an address", len(deleted))
		}
		for _, m := range controlPlaneMachines(t, ctx, c, key) {
			if m.Name == "early-cp-0" || !m.DeletionTimestamp.IsZero() || len(m.Status.Addresses) > 0 || len(deleted) == 2 {
				continue
			}
			uid := m.UID
			if err := c.Delete(ctx, &m, client.Preconditions{UID: &uid}); err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				t.Fatal(err)
			}
			t.Logf("%s: deleted %s before it had an address", time.Now().Format("15:04:05.000"), m.Name)
			deleted = append(deleted, m.Name)
		}
	}
	waitControlPlane(t, ctx, c, key, 3, 6*time.Minute)
	for _, m := range controlPlaneMachines(t, ctx, c, key) {
		for _, name := range deleted {
			if m.Name == name {
				t.Errorf("machine %s, deleted, is back", name)
			}
		}
		if _, ok := m.Annotations[clusterv1.EtcdMemberIDAnnotation]; !ok {
			t.Errorf("machine %s records no etcd member", m.Name)
		}
	}
	longest, failures, writes := w.stop()
	t.Logf("writer: %d writes, %d failed, longest outage %s", writes, failures, longest)
	if writes < 50 || longest > 5*time.Second {
		t.Errorf("writes through the endpoint: %d, failing for %s in a row at the longest; want them served throughout", writes, longest)
	}

	if out, err := u.kubectl(t, "delete", "cluster", "early", "--wait=false"); err != nil {
		t.Fatalf("kubectl delete cluster: %v\n%s", err, out)
	}
	testenv.Eventually(t, 3*time.Minute, "the cluster and everything of it gone", func() error {
		if err := c.Get(ctx, key, &clusterv1.Cluster{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster still there (%v)", err)
		}
		if left := leftovers(t, root); len(left) > 0 {
			return fmt.Errorf("left on disk: %v", left)
		}
		return nil
	})
	u.stopAndCheckNoLeftovers(t, syscall.SIGTERM)
}

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/internal/testenv"
)

// Issue 22, finding 1, on real processes: during a scale 1 → 3, a new
// control-plane Machine is deleted the moment it exists, before it has an
// address, twice. Its member (the agent may have added it already) is
// removed before its sandbox goes: the cluster ends with 3 machines and 3
// healthy voting members (no learner left), and keeps serving writes.
func TestControlPlaneMachinesDeletedBeforeTheirAddressDoNotCostTheQuorum(t *testing.T) {
	t.Parallel()
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

	// A watch sees every new Machine as it is created, before the machine
	// controller could record an address on it (status is written apart,
	// after the provider answers); polling a list could miss that moment.
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(u.stateDir, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	watchCtx, stopWatch := context.WithTimeout(ctx, 3*time.Minute)
	defer stopWatch()
	events, err := wc.Watch(watchCtx, &clusterv1.MachineList{}, client.InNamespace("default"))
	if err != nil {
		t.Fatal(err)
	}
	defer events.Stop()

	if out, err := u.kubectl(t, "patch", "cluster", "early", "--type=merge", "-p", `{"spec":{"controlPlane":{"replicas":3}}}`); err != nil {
		t.Fatalf("kubectl patch: %v\n%s", err, out)
	}
	var deleted []string
	for len(deleted) < 2 {
		ev, ok := <-events.ResultChan()
		if !ok {
			t.Fatalf("only %d new control-plane machines were seen without an address in 3 minutes", len(deleted))
		}
		m, isMachine := ev.Object.(*clusterv1.Machine)
		if !isMachine || ev.Type != watch.Added || m.Spec.ClusterName != "early" || m.Name == "early-cp-0" ||
			!m.DeletionTimestamp.IsZero() || len(m.Status.Addresses) > 0 {
			continue
		}
		uid := m.UID
		if err := c.Delete(ctx, m, client.Preconditions{UID: &uid}); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			t.Fatal(err)
		}
		t.Logf("%s: deleted %s as it was created, before it had an address", time.Now().Format("15:04:05.000"), m.Name)
		deleted = append(deleted, m.Name)
	}
	events.Stop()
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

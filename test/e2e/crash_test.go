package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/testenv"
)

// marina killed (SIGKILL) in the middle of making a cluster and again in
// the middle of deleting it, and started again each time, ends as an
// uninterrupted run does: one CA, one etcd member per control-plane machine,
// one sandbox per machine, one endpoint; then nothing at all.
func TestUpKilledWhileMakingAndDeletingAClusterConverges(t *testing.T) {
	t.Parallel()
	stateDir := t.TempDir()
	u := startUp(t, stateDir)
	root := filepath.Join(stateDir, "machines")
	t.Cleanup(func() { stopAgents(t, root) })
	c := mgmtClient(t, stateDir)
	ctx := context.Background()
	u.applyExample(t, "minimal")

	testenv.Eventually(t, time.Minute, "the control-plane machine made by its provider", func() error {
		m := &clusterv1.Machine{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "minimal-cp-0"}, m); err != nil {
			return err
		}
		if m.Status.ProviderID == "" {
			return fmt.Errorf("not provisioned yet")
		}
		return nil
	})
	u = restartKilled(t, u, stateDir)
	c = mgmtClient(t, stateDir)

	key := types.NamespacedName{Namespace: "default", Name: "minimal"}
	testenv.Eventually(t, 3*time.Minute, "cluster minimal Ready after the restart", func() error {
		cluster := &clusterv1.Cluster{}
		if err := c.Get(ctx, key, cluster); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(cluster.Status.Conditions, clusterv1.ReadyCondition) {
			return fmt.Errorf("not Ready: %v", cluster.Status.Conditions)
		}
		etcd := meta.FindStatusCondition(cluster.Status.Conditions, clusterv1.ClusterEtcdHealthyCondition)
		if etcd == nil || etcd.Message != "1 of 1 etcd members are healthy" {
			return fmt.Errorf("etcd: %+v", etcd)
		}
		return machinesRunning(ctx, c, 3)
	})
	// Exactly one of each Secret, one sandbox per machine, one endpoint.
	var secrets corev1.SecretList
	if err := c.List(ctx, &secrets, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	var pkiSecrets []string
	for _, s := range secrets.Items {
		if s.Type == clusterpki.SecretType {
			pkiSecrets = append(pkiSecrets, s.Name)
		}
	}
	if len(pkiSecrets) != 4 {
		t.Errorf("key-material Secrets %v, want the cluster, etcd and front-proxy CAs and the service-account key, once each", pkiSecrets)
	}
	if n := sandboxes(t, root); n != 3 {
		t.Errorf("%d sandboxes, want 3 (one per machine)", n)
	}
	if eps, _ := os.ReadDir(filepath.Join(root, ".endpoints")); len(eps) != 1 {
		t.Errorf("%d endpoints, want 1", len(eps))
	}

	// Killed again while the control-plane machine is being deleted.
	if out, err := u.kubectl(t, "delete", "cluster", "minimal", "--wait=false"); err != nil {
		t.Fatalf("kubectl delete cluster: %v\n%s", err, out)
	}
	testenv.Eventually(t, 2*time.Minute, "the control-plane machine being deleted", func() error {
		m := &clusterv1.Machine{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "minimal-cp-0"}, m); err != nil {
			return err
		}
		if m.DeletionTimestamp.IsZero() {
			return fmt.Errorf("not deleting yet")
		}
		return nil
	})
	u = restartKilled(t, u, stateDir)
	c = mgmtClient(t, stateDir)
	testenv.Eventually(t, 2*time.Minute, "the cluster and everything of it gone", func() error {
		if err := c.Get(ctx, key, &clusterv1.Cluster{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster still there (%v)", err)
		}
		if left := leftovers(t, root); len(left) > 0 {
			return fmt.Errorf("left on disk: %v", left)
		}
		if pids := processesUnder(root); len(pids) > 0 {
			return fmt.Errorf("processes still run from the sandboxes: %v", pids)
		}
		return nil
	})
	u.stopAndCheckNoLeftovers(t, syscall.SIGTERM)
}

// restartKilled kills marina up outright and starts it again on the same
// state.
func restartKilled(t *testing.T, u *upProcess, stateDir string) *upProcess {
	t.Helper()
	if err := u.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-u.done
	return startUp(t, stateDir)
}

// sandboxes counts the machine sandboxes under root.
func sandboxes(t *testing.T, root string) int {
	t.Helper()
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			n++
		}
	}
	return n
}

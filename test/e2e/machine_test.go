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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider/local"
)

// The whole path a user takes: marina up runs the local provider in its own
// process, and a Machine applied to it becomes a node-agent process whose
// Node joins the workload cluster; deleting the Machine takes both away.
func TestUpRunsAndDeletesALocalMachine(t *testing.T) {
	t.Parallel()
	workload, err := testenv.StartWorkload()
	if err != nil {
		t.Fatal(err)
	}
	defer workload.Stop()
	stateDir := t.TempDir()
	u := startUp(t, stateDir)
	t.Cleanup(func() { stopAgents(t, filepath.Join(stateDir, "machines")) })

	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(stateDir, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := "e2e"
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&clusterv1.Cluster{
			ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: ns,
				// The test's own API server stands in for the control plane.
				Annotations: map[string]string{clusterv1.ExternalControlPlaneAnnotation: "true"}},
			Spec: clusterv1.ClusterSpec{
				ClusterNetwork: clusterv1.ClusterNetwork{Pods: []clusterv1.CIDR{"10.244.0.0/16"}, Services: []clusterv1.CIDR{"10.96.0.0/12"}},
				ControlPlane: clusterv1.ControlPlaneSpec{Version: "v1.37.2", Replicas: 1,
					ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"2Gi"}}`)}},
			},
		},
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: remote.KubeconfigSecretName("c1"), Namespace: ns,
				Labels: map[string]string{clusterv1.ClusterNameLabel: "c1"}},
			Data: map[string][]byte{remote.KubeconfigSecretKey: workload.Kubeconfig},
		},
		&clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: "worker-0", Namespace: ns},
			Spec: clusterv1.MachineSpec{
				ClusterName:  "c1",
				Roles:        []clusterv1.MachineRole{clusterv1.WorkerRole},
				Versions:     clusterv1.MachineVersions{Kubelet: "v1.37.2"},
				Labels:       map[string]string{"pool": "e2e"},
				ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi"}}`)},
			},
		},
	} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("creating %T: %v", obj, err)
		}
	}

	key := types.NamespacedName{Namespace: ns, Name: "worker-0"}
	m := &clusterv1.Machine{}
	testenv.Eventually(t, 2*time.Minute, "the machine to run with its Node", func() error {
		if err := c.Get(ctx, key, m); err != nil {
			return err
		}
		if m.Status.Phase != clusterv1.MachinePhaseRunning || m.Status.NodeRef == nil {
			return fmt.Errorf("phase %q, conditions %v", m.Status.Phase, m.Status.Conditions)
		}
		return nil
	})
	node := &corev1.Node{}
	if err := workload.Client.Get(ctx, types.NamespacedName{Name: m.Status.NodeRef.Name}, node); err != nil {
		t.Fatal(err)
	}
	if node.Labels["pool"] != "e2e" || node.Spec.ProviderID != m.Status.ProviderID {
		t.Errorf("node labels %v, providerID %q; machine providerID %q", node.Labels, node.Spec.ProviderID, m.Status.ProviderID)
	}
	if n := agentProcesses(t, string(m.UID)); n != 1 {
		t.Errorf("%d node-agent processes for the machine, want 1", n)
	}

	if out, err := u.kubectl(t, "-n", ns, "delete", "machine", "worker-0", "--wait=false"); err != nil {
		t.Fatalf("kubectl delete machine: %v\n%s", err, out)
	}
	testenv.Eventually(t, time.Minute, "the machine, its Node and its agent to be gone", func() error {
		if err := c.Get(ctx, key, &clusterv1.Machine{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("machine still there (%v)", err)
		}
		if err := workload.Client.Get(ctx, types.NamespacedName{Name: node.Name}, &corev1.Node{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("node still there (%v)", err)
		}
		if n := agentProcesses(t, string(m.UID)); n != 0 {
			return fmt.Errorf("%d agents still run", n)
		}
		return nil
	})
	u.stopAndCheckNoLeftovers(t, syscall.SIGTERM)
}

// agentProcesses counts node-agent processes whose command line names the
// machine's sandbox.
func agentProcesses(t *testing.T, uid string) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	n := 0
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if strings.Contains(string(data), "node-agent") && strings.Contains(string(data), uid) {
			n++
		}
	}
	return n
}

// stopAgents ends every agent a failed test left behind.
func stopAgents(t *testing.T, root string) {
	p, err := local.New(local.Options{Root: root, AgentCommand: []string{marinaBin, "node-agent"}, LoadBalancerCommand: []string{marinaBin, "load-balancer"}})
	if err != nil {
		t.Error(err)
		return
	}
	if err := p.DeleteAll(context.Background()); err != nil {
		t.Error(err)
	}
}

package e2e

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
)

// localControlPlaneCluster: one local control-plane machine whose
// endpoint is set at the management host's end of the hosts' bridge
// (10.77.0.1, port %d), and a worker on SSH host 1; the test moves them
// to localCPHosts' network.
const localControlPlaneCluster = `apiVersion: cluster.marina.dev/v1alpha1
kind: Cluster
metadata: {name: lcp, namespace: default}
spec:
  clusterNetwork:
    pods: ["10.244.0.0/16"]
    services: ["10.96.0.0/12"]
  controlPlaneEndpoint: {host: 10.77.0.1, port: %d}
  controlPlane:
    version: v1.36.3
    replicas: 1
    etcd: {type: Stacked}
    providerSpec:
      apiVersion: local.marina.dev/v1alpha1
      kind: LocalMachine
      spec: {cpu: 2, memory: 4Gi}
---
apiVersion: cluster.marina.dev/v1alpha1
kind: Machine
metadata:
  name: lcp-ssh-worker
  namespace: default
  labels: {cluster.marina.dev/cluster-name: lcp}
spec:
  clusterName: lcp
  roles: [Worker]
  versions: {kubelet: v1.36.3}
  providerSpec:
    apiVersion: ssh.marina.dev/v1alpha1
    kind: SSHMachine
    spec:
      hosts: [{address: 10.77.0.11, port: 22, user: root}]
      secretRef: {name: ssh-hosts}
`

// Issue 26's other direction: a local control plane with a worker on an
// SSH host. The user sets the endpoint at an address of the management
// host the hosts reach; the local provider's balancer listens there (its
// API servers stay on loopback behind it), and the worker's Node, whose
// kubelet talks to that address from its own network namespace, is Ready.
func TestLocalControlPlaneWithAnSSHWorker(t *testing.T) {
	t.Parallel()
	manifests, _ := sshHosts(t, localCPHosts, 1)
	// A free port on the bridge (it exists once the hosts are up).
	l, err := net.Listen("tcp", localCPHosts.host(0)+":0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()

	// The operator opens the bridge's address to clusters' endpoints.
	u, _, c := startUpWithClient(t, "--endpoint-addresses", localCPHosts.host(0))
	testenv.OnFailure(t, func() {
		t.Logf("marina up's output, the cluster's lines:\n%s", grepLines(u.out.String(), "lcp"))
	})
	ctx := context.Background()
	if out, err := u.kubectlStdin(t, manifests, "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply -f - (the hosts): %v\n%s", err, out)
	}
	if out, err := u.kubectlStdin(t, localCPHosts.in(fmt.Sprintf(localControlPlaneCluster, port)), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply -f - (the cluster): %v\n%s", err, out)
	}
	key := types.NamespacedName{Namespace: "default", Name: "lcp"}
	testenv.Eventually(t, 10*time.Minute, "cluster lcp with its 2 machines Running", func() error {
		if err := machinesRunning(ctx, c, 2); err != nil {
			return fmt.Errorf("%w: %s", err, machineStates(ctx, c))
		}
		return nil
	})
	waitControlPlane(t, ctx, c, key, 1, 2*time.Minute)
	waitWorkers(t, ctx, c, key, 1, "v1.36.3", 2*time.Minute)

	cluster := &clusterv1.Cluster{}
	if err := c.Get(ctx, key, cluster); err != nil {
		t.Fatal(err)
	}
	if ep := cluster.Spec.ControlPlaneEndpoint; ep.Host != localCPHosts.host(0) || int(ep.Port) != port {
		t.Errorf("spec.controlPlaneEndpoint %+v, want the user's %s:%d", ep, localCPHosts.host(0), port)
	}
	if cluster.Annotations[clusterv1.ManagedEndpointAnnotation] != "true" {
		t.Errorf("the endpoint at an address of this machine is not marked as marina's: annotations %v", cluster.Annotations)
	}

	cs, err := kubernetes.NewForConfig(workloadConfig(t, ctx, c, key))
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 4*time.Minute, "both Nodes Ready, the SSH worker's among them", func() error {
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(nodes.Items) != 2 {
			return fmt.Errorf("%d Nodes", len(nodes.Items))
		}
		onHost := false
		for _, n := range nodes.Items {
			if !nodeReady(&n) {
				return fmt.Errorf("node %s not Ready", n.Name)
			}
			for _, a := range n.Status.Addresses {
				onHost = onHost || a.Address == localCPHosts.host(1)
			}
		}
		if !onHost {
			return fmt.Errorf("no Node has the SSH host's address %s", localCPHosts.host(1))
		}
		return nil
	})
}

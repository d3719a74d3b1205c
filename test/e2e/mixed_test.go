package e2e

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/internal/prober"
	"marina.dev/marina/internal/testenv"
)

// mixedCluster: the control plane on SSH host 1 (its address is the
// endpoint, as in examples/ssh), a worker on SSH host 2 and a worker of
// the local provider, all at upgradeFrom, upgraded InPlace.
const mixedCluster = `apiVersion: cluster.marina.dev/v1alpha1
kind: Cluster
metadata: {name: mixed, namespace: default}
spec:
  clusterNetwork:
    pods: ["10.244.0.0/16"]
    services: ["10.96.0.0/12"]
  controlPlaneEndpoint: {host: 10.77.0.11, port: 6443}
  controlPlane:
    version: v1.36.3
    replicas: 1
    upgradeStrategy: {type: InPlace, stepTimeout: 3m}
    providerSpec:
      apiVersion: ssh.marina.dev/v1alpha1
      kind: SSHMachine
      spec:
        hostsRef: {name: ssh-hosts}
        hostSelector: {role: control-plane}
        secretRef: {name: ssh-hosts}
---
apiVersion: cluster.marina.dev/v1alpha1
kind: Machine
metadata:
  name: mixed-ssh-worker
  namespace: default
  labels: {cluster.marina.dev/cluster-name: mixed}
spec:
  clusterName: mixed
  roles: [Worker]
  versions: {kubelet: v1.36.3}
  providerSpec:
    apiVersion: ssh.marina.dev/v1alpha1
    kind: SSHMachine
    spec:
      hostsRef: {name: ssh-hosts}
      hostSelector: {role: worker}
      secretRef: {name: ssh-hosts}
---
apiVersion: cluster.marina.dev/v1alpha1
kind: Machine
metadata:
  name: mixed-local-worker
  namespace: default
  labels: {cluster.marina.dev/cluster-name: mixed}
spec:
  clusterName: mixed
  roles: [Worker]
  versions: {kubelet: v1.36.3}
  providerSpec:
    apiVersion: local.marina.dev/v1alpha1
    kind: LocalMachine
    spec: {cpu: 2, memory: 4Gi}
`

// A cluster mixing both providers (issue 26) upgrades InPlace as the local
// one does: the control plane on an SSH host, a worker on another host
// and a local worker move from upgradeFrom to upgradeTo, the control-plane
// components in M12's order, with no failed request through the endpoint.
// The workers are standalone machines (the upgrade rolls only
// deployments): their spec is moved once the control plane is done, and
// they too change in place. Every machine learns its versions from its
// Node: during the upgrade the management host writes none of the files
// it put in the machine when it made it (only the SSH provider copies the
// new binaries into the host's binary directory).
func TestMixedProvidersUpgradeInPlaceWithoutAFailedRequest(t *testing.T) {
	manifests, onHost := sshHosts(t, 2)
	u, root, c := startUpWithClient(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("marina up's output, the provider's lines:\n%s", grepLines(u.out.String(), `provider="ssh"`, "mixed-"))
		}
	})
	ctx := context.Background()
	if out, err := u.kubectlStdin(t, manifests, "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply -f - (the hosts): %v\n%s", err, out)
	}
	if out, err := u.kubectlStdin(t, mixedCluster, "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply -f - (the cluster): %v\n%s", err, out)
	}
	key := types.NamespacedName{Namespace: "default", Name: "mixed"}
	testenv.Eventually(t, 8*time.Minute, "cluster mixed Ready with its 3 machines Running", func() error {
		if err := machinesRunning(ctx, c, 3); err != nil {
			return fmt.Errorf("%w: %s", err, machineStates(ctx, c))
		}
		return nil
	})
	waitControlPlane(t, ctx, c, key, 1, 2*time.Minute)
	waitWorkers(t, ctx, c, key, 2, upgradeFrom, 2*time.Minute)
	testenv.Eventually(t, time.Minute, "the control-plane machine reporting "+upgradeFrom, func() error {
		for _, m := range controlPlaneMachines(t, ctx, c, key) {
			if v := m.Status.Versions.ControlPlane; v == nil || v.APIServer != upgradeFrom {
				return fmt.Errorf("machine %s reports %+v", m.Name, v)
			}
		}
		return nil
	})

	cfg := workloadConfig(t, ctx, c, key)
	cfg.QPS, cfg.Burst = 200, 400
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	before := machineFiles(t, root, onHost)
	if !strings.Contains(fmt.Sprint(before), "local:") || !strings.Contains(fmt.Sprint(before), "host 2:") {
		t.Fatalf("the machines' directories were not all found: %v", before)
	}
	probe, err := prober.Start(ctx, cs, "default", 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	rec := recordVersions(ctx, u.stateDir, key)

	start := time.Now()
	if out, err := u.kubectl(t, "patch", "cluster", key.Name, "--type=merge", "-p", fmt.Sprintf(`{"spec":{"controlPlane":{"version":%q}}}`, upgradeTo)); err != nil {
		t.Fatalf("kubectl patch: %v\n%s", err, out)
	}
	waitUpgraded(t, ctx, c, key, 10*time.Minute)
	controlPlaneTook := time.Since(start)
	for _, w := range []string{"mixed-ssh-worker", "mixed-local-worker"} {
		if out, err := u.kubectl(t, "patch", "machine", w, "--type=merge", "-p", fmt.Sprintf(`{"spec":{"versions":{"kubelet":%q}}}`, upgradeTo)); err != nil {
			t.Fatalf("kubectl patch machine %s: %v\n%s", w, err, out)
		}
	}
	testenv.Eventually(t, 4*time.Minute, "every Node Ready at "+upgradeTo, func() error {
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(nodes.Items) != 3 {
			return fmt.Errorf("%d Nodes", len(nodes.Items))
		}
		for _, n := range nodes.Items {
			if v := n.Status.NodeInfo.KubeletVersion; v != upgradeTo || !nodeReady(&n) {
				return fmt.Errorf("node %s: kubelet %s, ready %v", n.Name, v, nodeReady(&n))
			}
		}
		return nil
	})
	took := time.Since(start)
	res := probe.Stop()
	changes := rec.stop()

	t.Logf("InPlace %s → %s of a control plane on an SSH host, an SSH worker and a local worker: control plane %s, all Nodes %s; prober: %d requests (%.1f/s), %d failed",
		upgradeFrom, upgradeTo, controlPlaneTook.Round(time.Second), took.Round(time.Second), res.Requests, res.Rate(), res.Failures)
	for _, ch := range changes {
		t.Logf("  %s  %-24s %s", ch.at.Sub(start).Round(100*time.Millisecond), ch.component, ch.machine)
	}
	checkProbe(t, res)
	checkOrder(t, changes, 1)

	// The control plane's host runs the new binaries, and no old one.
	exes := onHost(1, "for p in /proc/[0-9]*; do readlink $p/exe; done")
	for _, comp := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if !strings.Contains(exes, "/"+comp+"-"+upgradeTo+"\n") || strings.Contains(exes, "/"+comp+"-"+upgradeFrom) {
			t.Errorf("host 1 does not run %s at %s alone; executables there:\n%s", comp, upgradeTo, exes)
		}
	}

	// What the management host put in each machine when it made it is as
	// it was: the machines learnt their versions from their Nodes.
	after := machineFiles(t, root, onHost)
	for path, was := range before {
		if now := after[path]; now != was && !agentsOwn(path) {
			t.Errorf("%s changed during the upgrade (%s → %s)", path, was, now)
		}
	}
	for path := range after {
		if _, ok := before[path]; !ok && !agentsOwn(path) {
			t.Errorf("%s appeared during the upgrade", path)
		}
	}
}

// agentsOwn: files a machine's agent writes itself in its directory: the
// versions it read from its Node, its log and lock.
func agentsOwn(path string) bool {
	switch filepath.Base(path) {
	case sandbox.DesiredVersionsFile, sandbox.LogFile, sandbox.LockFile:
		return true
	}
	return false
}

// machineFiles is the size and modification time of every file at the
// top of each machine's directory (what the provider writes there; the
// components' data is below): the local machines' under root, and
// /var/lib/marina/machine on the first two SSH hosts.
func machineFiles(t *testing.T, root string, onHost func(int, string) string) map[string]string {
	t.Helper()
	out := map[string]string{}
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(path), sandbox.BootstrapFile)); err != nil {
			return nil // not a machine's directory
		}
		if fi, err := d.Info(); err == nil {
			out["local:"+strings.TrimPrefix(path, root)] = fmt.Sprintf("%d@%s", fi.Size(), fi.ModTime().Format(time.RFC3339Nano))
		}
		return nil
	})
	for i := 1; i <= 2; i++ {
		for _, l := range strings.Split(strings.TrimSpace(onHost(i, "find /var/lib/marina/machine -maxdepth 1 -type f -printf '%f %s@%T@\\n'")), "\n") {
			if name, v, ok := strings.Cut(l, " "); ok {
				out[fmt.Sprintf("host %d:%s", i, name)] = v
			}
		}
	}
	return out
}

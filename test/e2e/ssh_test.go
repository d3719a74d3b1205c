package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
)

// sshHosts starts n hosts with tools/ssh-hosts, as the docs do (its
// default names and addresses: examples/ssh names 10.77.0.11), and
// returns the manifests it printed and a way to run a command on host i.
// The hosts and everything they ran go when the test ends.
func sshHosts(t *testing.T, n int) (manifests string, onHost func(i int, command string) string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("tools/ssh-hosts needs root (network namespaces, sshd)")
	}
	repo, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "hosts")
	tool := filepath.Join(repo, "tools", "ssh-hosts")
	env := append(os.Environ(), "MARINA_SSH_HOSTS_DIR="+dir)
	up := exec.Command(tool, "up", fmt.Sprint(n))
	up.Env = env
	var stderr strings.Builder
	up.Stderr = &stderr
	out, err := up.Output()
	t.Cleanup(func() {
		down := exec.Command(tool, "down")
		down.Env = env
		if out, err := down.CombinedOutput(); err != nil {
			t.Errorf("tools/ssh-hosts down: %v\n%s", err, out)
		}
	})
	if err != nil {
		t.Fatalf("tools/ssh-hosts up %d: %v\n%s", n, err, stderr.String())
	}
	return string(out), func(i int, command string) string {
		t.Helper()
		out, err := exec.Command("ssh", "-q", "-o", "BatchMode=yes", "-o", "UserKnownHostsFile="+filepath.Join(dir, "known_hosts"),
			"-i", filepath.Join(dir, "id_ed25519"), fmt.Sprintf("root@10.77.0.%d", 10+i), command).CombinedOutput()
		if err != nil {
			t.Fatalf("ssh host %d %q: %v\n%s", i, command, err, out)
		}
		return string(out)
	}
}

// The path for servers people own: tools/ssh-hosts up 3 | kubectl
// apply -f -, then kubectl apply -f examples/ssh/: the control plane (real
// etcd and Kubernetes components) on one host, a worker on each of the two
// others, Ready, three Ready Nodes through the cluster's kubeconfig;
// deleting it leaves every host released, with no process of the machine
// and no file but the provisioning log.
func TestSSHHostsRunTheExampleCluster(t *testing.T) {
	manifests, onHost := sshHosts(t, 3)
	u, _, c := startUpWithClient(t)
	ctx := context.Background()
	if out, err := u.kubectlStdin(t, manifests, "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply -f - (the hosts): %v\n%s", err, out)
	}
	applied := time.Now()
	u.applyExample(t, "ssh")
	key := types.NamespacedName{Namespace: "default", Name: "ssh"}
	cluster := &clusterv1.Cluster{}
	testenv.Eventually(t, 6*time.Minute, "cluster ssh Ready with its 3 machines Running", func() error {
		if err := c.Get(ctx, key, cluster); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(cluster.Status.Conditions, clusterv1.ReadyCondition) {
			return fmt.Errorf("not Ready: %v", cluster.Status.Conditions)
		}
		return machinesRunning(ctx, c, 3)
	})
	t.Logf("examples/ssh: Ready %.1fs after kubectl apply", time.Since(applied).Seconds())
	checkNodes(t, ctx, workloadClient(t, ctx, c, key))

	// One machine per host, the control plane on host 1.
	var machines clusterv1.MachineList
	if err := c.List(ctx, &machines, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	hosts := map[string]bool{}
	for _, m := range machines.Items {
		addr := ""
		for _, a := range m.Status.Addresses {
			if a.Type == clusterv1.MachineInternalIP {
				addr = a.Address
			}
		}
		hosts[addr] = true
		if slices.Contains(m.Spec.Roles, clusterv1.ControlPlaneRole) && addr != "10.77.0.11" {
			t.Errorf("control-plane machine %s is on %q, want 10.77.0.11 (the host labelled role=control-plane)", m.Name, addr)
		}
		if !strings.HasPrefix(m.Status.ProviderID, "ssh://") {
			t.Errorf("machine %s has providerID %q, want ssh://", m.Name, m.Status.ProviderID)
		}
	}
	if len(hosts) != 3 {
		t.Errorf("the machines are on hosts %v, want one on each of 3", hosts)
	}
	if got := strings.TrimSpace(onHost(1, "stat -c %a /var/lib/marina/machine/controlplane.json")); got != "600" {
		t.Errorf("the control-plane bundle has mode %s on host 1, want 600", got)
	}

	if out, err := u.kubectl(t, "delete", "-f", filepath.Join(u.repoRoot(t), "examples", "ssh"), "--wait=false"); err != nil {
		t.Fatalf("kubectl delete -f examples/ssh: %v\n%s", err, out)
	}
	testenv.Eventually(t, 3*time.Minute, "cluster ssh and its machines gone", func() error {
		if err := c.Get(ctx, key, &clusterv1.Cluster{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster still there (%v)", err)
		}
		var list clusterv1.MachineList
		if err := c.List(ctx, &list, client.InNamespace("default")); err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d machines left", len(list.Items))
		}
		return nil
	})
	for i := 1; i <= 3; i++ {
		if got := strings.TrimSpace(onHost(i, "ls -A /var/lib/marina")); got != "log" {
			t.Errorf("host %d keeps %q in /var/lib/marina, want only the provisioning log", i, got)
		}
		if ps := onHost(i, "for p in /proc/[0-9]*; do readlink $p/exe; done"); strings.Contains(ps, "/var/lib/marina") {
			t.Errorf("processes of the machine still run on host %d:\n%s", i, ps)
		}
	}
}

func (u *upProcess) repoRoot(t *testing.T) string {
	t.Helper()
	repo, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return repo
}

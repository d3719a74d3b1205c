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

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
)

// sshNet is the names and addresses a test's SSH hosts take on this
// host: each test that makes hosts has its own, so that the tests run side
// by side (issue 34).
type sshNet struct {
	prefix string // tools/ssh-hosts' MARINA_SSH_HOSTS_PREFIX
	net    string // the first three octets of the hosts' /24
	// namespace of the hosts' Secret and ConfigMap; "" for default.
	namespace string
}

var (
	// exampleHosts are tools/ssh-hosts' defaults, which examples/ssh names
	// (10.77.0.11).
	exampleHosts = sshNet{prefix: "mssh", net: "10.77.0", namespace: sshNS}
	mixedHosts   = sshNet{prefix: "msshmix", net: "10.77.1"}
	localCPHosts = sshNet{prefix: "msshlcp", net: "10.77.2"}
)

// in rewrites the default network's addresses in s (a manifest written
// for tools/ssh-hosts' defaults) into this one's.
func (n sshNet) in(s string) string { return strings.ReplaceAll(s, exampleHosts.net+".", n.net+".") }

// host is the address of host i (1..n), or of the management host's end
// of the bridge for 0.
func (n sshNet) host(i int) string {
	if i == 0 {
		return n.net + ".1"
	}
	return fmt.Sprintf("%s.%d", n.net, 10+i)
}

// sshHosts starts n hosts on network hn with tools/ssh-hosts, as the docs
// do, and returns the manifests it printed and a way to run a command on
// host i. The hosts and everything they ran go when the test ends.
func sshHosts(t *testing.T, hn sshNet, n int) (manifests string, onHost func(i int, command string) string) {
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
	env := append(os.Environ(), "MARINA_SSH_HOSTS_DIR="+dir, "MARINA_SSH_HOSTS_PREFIX="+hn.prefix, "MARINA_SSH_HOSTS_NET="+hn.net)
	if hn.namespace != "" {
		env = append(env, "MARINA_SSH_HOSTS_NAMESPACE="+hn.namespace)
	}
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
			"-i", filepath.Join(dir, "id_ed25519"), "root@"+hn.host(i), command).CombinedOutput()
		if err != nil {
			t.Fatalf("ssh host %d %q: %v\n%s", i, command, err, out)
		}
		return string(out)
	}
}

// sshNS is the namespace the example's SSH cluster runs in here, so that
// the test can end by deleting the namespace.
const sshNS = "ssh-e2e"

// exampleManifests are the files of examples/<name>, as one stream.
func exampleManifests(t *testing.T, u *upProcess, name string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(u.repoRoot(t), "examples", name, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("examples/%s: %v (%d files)", name, err, len(files))
	}
	var docs []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(data))
	}
	return strings.Join(docs, "\n---\n")
}

// inSSHNamespace moves manifests written for namespace default to sshNS.
func inSSHNamespace(t *testing.T, manifests string) string {
	t.Helper()
	out := strings.ReplaceAll(manifests, "namespace: default", "namespace: "+sshNS)
	if out == manifests {
		t.Fatal("the manifests name no namespace default to move")
	}
	return out
}

// The path for servers people own: tools/ssh-hosts up | kubectl
// apply -f -, then kubectl apply -f examples/ssh/: the control plane (real
// etcd and Kubernetes components) on one host, a worker on each of two
// others, Ready, three Ready Nodes through the cluster's kubeconfig. A
// worker whose operator template fails on its second step names the step
// and its output in its condition and events; fixing the ConfigMap lets the
// next attempt succeed. Deleting the cluster leaves every host released,
// with no process of the machine and no file but the provisioning log.
func TestSSHHostsRunTheExampleCluster(t *testing.T) {
	t.Parallel()
	// A fourth host for the machine whose provisioning fails, below.
	manifests, onHost := sshHosts(t, exampleHosts, 4)
	u, _, c := startUpWithClient(t)
	testenv.OnFailure(t, func() {
		t.Logf("marina up's output, the provider's lines:\n%s", grepLines(u.out.String(), `provider="ssh"`, "ssh-worker", "ssh-control-plane"))
	})
	ctx := context.Background()
	// A namespace of its own, deleted at the end as a whole (issue 36):
	// its Secret and ConfigMaps go before its Machines.
	if out, err := u.kubectl(t, "create", "namespace", sshNS); err != nil {
		t.Fatalf("kubectl create namespace: %v\n%s", err, out)
	}
	if out, err := u.kubectlStdin(t, manifests, "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply -f - (the hosts): %v\n%s", err, out)
	}
	applied := time.Now()
	if out, err := u.kubectlStdin(t, inSSHNamespace(t, exampleManifests(t, u, "ssh")), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply examples/ssh in namespace %s: %v\n%s", sshNS, err, out)
	}
	key := types.NamespacedName{Namespace: sshNS, Name: "ssh"}
	cluster := &clusterv1.Cluster{}
	testenv.Eventually(t, 6*time.Minute, "cluster ssh Ready with its 3 machines Running", func() error {
		if err := c.Get(ctx, key, cluster); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(cluster.Status.Conditions, clusterv1.ReadyCondition) {
			return fmt.Errorf("not Ready: %v", cluster.Status.Conditions)
		}
		if err := machinesRunningIn(ctx, c, sshNS, 3); err != nil {
			return fmt.Errorf("%w: %s", err, machineStatesIn(ctx, c, sshNS))
		}
		return nil
	})
	t.Logf("examples/ssh: Ready %.1fs after kubectl apply", time.Since(applied).Seconds())
	checkNodes(t, ctx, workloadClient(t, ctx, c, key))

	// One machine per host, the control plane on host 1.
	var machines clusterv1.MachineList
	if err := c.List(ctx, &machines, client.InNamespace(sshNS)); err != nil {
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

	t.Run("marina move refuses the SSH machines and touches nothing", func(t *testing.T) {
		moveRefused(t, ctx, u, c, onHost)
	})
	t.Run("a failing step is named and a fixed ConfigMap is used", func(t *testing.T) {
		failingStepThenFixed(t, ctx, u, c)
	})
	t.Run("a local worker joins the control plane on a host", func(t *testing.T) {
		localWorkerJoins(t, ctx, u, c, key)
	})

	// The whole namespace at once: the namespace controller deletes the
	// hosts' Secret and ConfigMap, the templates and the cluster's own
	// Secrets alongside the Machines. The SSH provider deprovisions with
	// the key and the steps it kept; the namespace is gone well within
	// the machines' deletion.
	deleted := time.Now()
	if out, err := u.kubectl(t, "delete", "namespace", sshNS, "--wait=false"); err != nil {
		t.Fatalf("kubectl delete namespace %s: %v\n%s", sshNS, err, out)
	}
	testenv.Eventually(t, 3*time.Minute, "namespace "+sshNS+" gone, with cluster ssh and its machines", func() error {
		if err := c.Get(ctx, types.NamespacedName{Name: sshNS}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("namespace still there (%v): %s", err, machineStatesIn(ctx, c, sshNS))
		}
		return nil
	})
	t.Logf("namespace %s gone %.1fs after kubectl delete namespace", sshNS, time.Since(deleted).Seconds())
	for i := 1; i <= 4; i++ {
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

// moveRefused: the SSH provider's records stay on this plane, so marina
// move refuses the namespace (issue 36), naming the machines, before it
// reaches the target (here a plane that does not exist) or pauses
// anything; the hosts' agents run on.
func moveRefused(t *testing.T, ctx context.Context, u *upProcess, c client.Client, onHost func(int, string) string) {
	agents := onHost(1, "cat /var/lib/marina/machine/agent.pid")
	target := filepath.Join(t.TempDir(), "nowhere.kubeconfig")
	nowhere := "apiVersion: v1\nkind: Config\nclusters: [{name: x, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: x, user: {token: x}}]\ncontexts: [{name: x, context: {cluster: x, user: x}}]\ncurrent-context: x\n"
	if err := os.WriteFile(target, []byte(nowhere), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := u.marinaErr("move", "-n", sshNS, "--to-kubeconfig", target)
	if err == nil {
		t.Fatalf("marina move of SSH machines succeeded:\n%s", out)
	}
	for _, want := range []string{"cannot move to another management plane", "Cluster " + sshNS + "/ssh (SSHMachine)", "Machine " + sshNS + "/ssh-worker-0 (SSHMachine)", "Keep SSH clusters on the plane that made them"} {
		if !strings.Contains(out, want) {
			t.Errorf("marina move's refusal does not say %q:\n%s", want, out)
		}
	}
	var machines clusterv1.MachineList
	if err := c.List(ctx, &machines, client.InNamespace(sshNS)); err != nil {
		t.Fatal(err)
	}
	for _, m := range machines.Items {
		if _, paused := m.Annotations[clusterv1.PausedAnnotation]; paused {
			t.Errorf("machine %s was paused by a refused move", m.Name)
		}
	}
	if again := onHost(1, "cat /var/lib/marina/machine/agent.pid"); again != agents {
		t.Errorf("the control-plane host's agent changed (%q, then %q)", agents, again)
	}
}

// failingStepThenFixed adds a worker to cluster ssh whose templates (a
// ConfigMap) fail on their second step, checks its condition and events
// name the step with its output, fixes the ConfigMap and waits for the
// worker to run.
func failingStepThenFixed(t *testing.T, ctx context.Context, u *upProcess, c client.Client) {
	const broken = `apiVersion: v1
kind: ConfigMap
metadata: {name: provisioning, namespace: ssh-e2e}
data:
  provision-10-check.sh: |
    echo checking {{.Host.Address}}
  provision-20-packages.sh: |
    echo fetching packages for {{.Role}}
    echo mirror.example unreachable >&2
    exit 3
  provision-30-start-agent.sh: |
    cd {{.SandboxDir}}
    setsid nohup {{.AgentCommand}} >>agent.log 2>&1 </dev/null &
    echo $! > agent.pid
  deprovision-10-stop.sh: |
    kill -TERM -- -$(cat {{.SandboxDir}}/agent.pid) 2>/dev/null || true
    sleep 1
    kill -KILL -- -$(cat {{.SandboxDir}}/agent.pid) 2>/dev/null || true
    rm -rf {{.SandboxDir}} {{.BinDir}}
---
apiVersion: cluster.marina.dev/v1alpha1
kind: Machine
metadata:
  name: ssh-worker-templated
  namespace: ssh-e2e
  labels: {cluster.marina.dev/cluster-name: ssh}
spec:
  clusterName: ssh
  roles: [Worker]
  versions: {kubelet: v1.37.2}
  providerSpec:
    apiVersion: ssh.marina.dev/v1alpha1
    kind: SSHMachine
    spec:
      hostsRef: {name: ssh-hosts}
      hostSelector: {role: worker}
      secretRef: {name: ssh-hosts}
      templatesRef: {name: provisioning}
`
	if out, err := u.kubectlStdin(t, broken, "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	key := types.NamespacedName{Namespace: sshNS, Name: "ssh-worker-templated"}
	m := &clusterv1.Machine{}
	testenv.Eventually(t, 2*time.Minute, "the machine's condition names the failing step and its output", func() error {
		if err := c.Get(ctx, key, m); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineProvisionedCondition)
		if cond == nil {
			return fmt.Errorf("no %s condition yet", clusterv1.MachineProvisionedCondition)
		}
		for _, want := range []string{"step 20-packages", "ConfigMap " + sshNS + "/provisioning key provision-20-packages.sh", "exited with status 3", "fetching packages for worker", "mirror.example unreachable"} {
			if !strings.Contains(cond.Message, want) {
				return fmt.Errorf("%s condition %s: %q does not say %q", clusterv1.MachineProvisionedCondition, cond.Reason, cond.Message, want)
			}
		}
		return nil
	})
	var events corev1.EventList
	if err := c.List(ctx, &events, client.InNamespace(sshNS)); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range events.Items {
		found = found || e.InvolvedObject.Name == key.Name && e.Reason == "ProvisioningStepFailed" && strings.Contains(e.Message, "mirror.example unreachable")
	}
	if !found {
		t.Errorf("no ProvisioningStepFailed event with the step's output on machine %s", key.Name)
	}

	fixed := strings.Replace(broken, "    echo mirror.example unreachable >&2\n    exit 3\n", "    echo packages ready\n", 1)
	if out, err := u.kubectlStdin(t, fixed, "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply (fixed): %v\n%s", err, out)
	}
	testenv.Eventually(t, 3*time.Minute, "the machine runs once its ConfigMap is fixed", func() error {
		if err := c.Get(ctx, key, m); err != nil {
			return err
		}
		if m.Status.Phase != clusterv1.MachinePhaseRunning {
			return fmt.Errorf("phase %s, conditions %v", m.Status.Phase, m.Status.Conditions)
		}
		return nil
	})
	if err := c.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Minute, "the templated machine deleted", func() error {
		if err := c.Get(ctx, key, m); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
}

// localWorkerJoins adds a worker of the local provider to cluster ssh: the
// two providers side by side in one cluster, its agent reaching the
// control plane on the host through the bridge.
func localWorkerJoins(t *testing.T, ctx context.Context, u *upProcess, c client.Client, key types.NamespacedName) {
	const worker = `apiVersion: cluster.marina.dev/v1alpha1
kind: Machine
metadata:
  name: ssh-local-worker
  namespace: ssh-e2e
  labels: {cluster.marina.dev/cluster-name: ssh}
spec:
  clusterName: ssh
  roles: [Worker]
  versions: {kubelet: v1.37.2}
  providerSpec:
    apiVersion: local.marina.dev/v1alpha1
    kind: LocalMachine
    spec: {cpu: 2, memory: 4Gi}
`
	if out, err := u.kubectlStdin(t, worker, "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	mkey := types.NamespacedName{Namespace: sshNS, Name: "ssh-local-worker"}
	m := &clusterv1.Machine{}
	testenv.Eventually(t, 2*time.Minute, "the local worker runs with a Ready Node", func() error {
		if err := c.Get(ctx, mkey, m); err != nil {
			return err
		}
		if m.Status.Phase != clusterv1.MachinePhaseRunning || m.Status.NodeRef == nil {
			return fmt.Errorf("phase %s, conditions %v", m.Status.Phase, m.Status.Conditions)
		}
		n, err := workloadClient(t, ctx, c, key).CoreV1().Nodes().Get(ctx, m.Status.NodeRef.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !nodeReady(n) {
			return fmt.Errorf("node %s not Ready", n.Name)
		}
		return nil
	})
	if !strings.HasPrefix(m.Status.ProviderID, "local://") {
		t.Errorf("providerID %q, want local://", m.Status.ProviderID)
	}
	if err := c.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Minute, "the local worker deleted", func() error {
		if err := c.Get(ctx, mkey, m); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
}

// machineStates says each machine's phase and its conditions that are not
// True, for a failure's message.
func machineStates(ctx context.Context, c client.Client) string {
	return machineStatesIn(ctx, c, "default")
}

func machineStatesIn(ctx context.Context, c client.Client, ns string) string {
	var list clusterv1.MachineList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, m := range list.Items {
		fmt.Fprintf(&b, "\n%s %s %s", m.Name, m.Status.Phase, m.Status.ProviderID)
		for _, cond := range m.Status.Conditions {
			if cond.Status != metav1.ConditionTrue {
				fmt.Fprintf(&b, "\n  %s=%s %s: %s", cond.Type, cond.Status, cond.Reason, cond.Message)
			}
		}
	}
	return b.String()
}

// grepLines keeps the last 200 lines of s holding any of words.
func grepLines(s string, words ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	if len(out) > 200 {
		out = out[len(out)-200:]
	}
	return strings.Join(out, "\n")
}

package e2e

import (
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/tools"
)

// The README's path for a cluster (issue: clusters): apply
// examples/minimal to marina up, watch the cluster become Ready, reach it
// with its kubeconfig, see its three Nodes; a killed component comes back;
// no key marina made reaches a log; deleting the cluster leaves nothing.
func TestUpMakesTheMinimalClusterReal(t *testing.T) {
	t.Parallel()
	u, root, c := startUpWithClient(t)
	ctx := context.Background()
	applied := time.Now()
	u.applyExample(t, "minimal")
	key := types.NamespacedName{Namespace: "default", Name: "minimal"}
	cluster := &clusterv1.Cluster{}
	testenv.Eventually(t, 4*time.Minute, "cluster minimal Ready with its 3 machines Running", func() error {
		if err := c.Get(ctx, key, cluster); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(cluster.Status.Conditions, clusterv1.ReadyCondition) {
			return fmt.Errorf("not Ready: %v", cluster.Status.Conditions)
		}
		return machinesRunning(ctx, c, 3)
	})
	t.Logf("examples/minimal: Ready %.1fs after kubectl apply", time.Since(applied).Seconds())

	workload := workloadClient(t, ctx, c, key)
	ver, err := workload.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if ver.GitVersion != "v1.37.2" {
		t.Errorf("the workload API server reports %s, want v1.37.2", ver.GitVersion)
	}
	checkNodes(t, ctx, workload)
	// The versions are the components' own word, reported by the agent
	// every few seconds.
	testenv.Eventually(t, 30*time.Second, "status.controlPlane reports what runs", func() error {
		if err := c.Get(ctx, key, cluster); err != nil {
			return err
		}
		st := cluster.Status.ControlPlane
		want := clusterv1.ComponentVersions{APIServer: "v1.37.2", ControllerManager: "v1.37.2", Scheduler: "v1.37.2", Etcd: tools.Pinned().Etcd}
		if st.ReadyReplicas != 1 || st.Components != want || st.Version != "v1.37.2" {
			return fmt.Errorf("status.controlPlane = %+v, want 1 ready replica running %+v", st, want)
		}
		return nil
	})

	t.Run("workers joined as nodes by TLS bootstrap", func(t *testing.T) {
		testenv.Eventually(t, 30*time.Second, "no bootstrap token left once the workers joined", func() error {
			secrets, err := workload.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{FieldSelector: "type=bootstrap.kubernetes.io/token"})
			if err != nil {
				return err
			}
			if n := len(secrets.Items); n > 0 {
				return fmt.Errorf("%d bootstrap tokens left", n)
			}
			return nil
		})
		worker := &clusterv1.Machine{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "minimal-worker-0"}, worker); err != nil {
			t.Fatal(err)
		}
		// The worker's own credential is a node's: the Node authorizer and
		// NodeRestriction let it touch its own Node only.
		sandboxDir := filepath.Join(root, string(worker.UID))
		certPEM, err := os.ReadFile(filepath.Join(sandboxDir, "node.crt"))
		if err != nil {
			t.Fatal(err)
		}
		keyPEM, err := os.ReadFile(filepath.Join(sandboxDir, "node.key"))
		if err != nil {
			t.Fatal(err)
		}
		if info, err := os.Stat(filepath.Join(sandboxDir, "node.key")); err != nil || info.Mode().Perm() != 0o600 {
			t.Errorf("node.key: %v, mode %v; want 0600", err, info.Mode())
		}
		cfg := rest.CopyConfig(workloadConfig(t, ctx, c, key))
		cfg.TLSClientConfig.CertData, cfg.TLSClientConfig.KeyData = certPEM, keyPEM
		asNode, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := asNode.CoreV1().Nodes().Get(ctx, worker.Status.NodeRef.Name, metav1.GetOptions{}); err != nil {
			t.Errorf("the worker cannot read its own Node: %v", err)
		}
		other := "minimal-worker-1"
		patch := []byte(`{"metadata":{"labels":{"example.marina.dev/hijacked":"true"}}}`)
		if _, err := asNode.CoreV1().Nodes().Patch(ctx, other, types.MergePatchType, patch, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("worker-0's credential patched Node %s (err %v), want Forbidden", other, err)
		}
		// Issue 24: nor delete a kube-system pod (one bound to another
		// node), nor mint a token.
		pod, err := workload.CoreV1().Pods("kube-system").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "victim-"},
			Spec:       corev1.PodSpec{NodeName: other, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := asNode.CoreV1().Pods("kube-system").Delete(ctx, pod.Name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("worker-0's credential deleted kube-system pod %s (err %v), want Forbidden", pod.Name, err)
		}
		if got, err := workload.CoreV1().Pods("kube-system").Get(ctx, pod.Name, metav1.GetOptions{}); err != nil || got.DeletionTimestamp != nil {
			t.Errorf("kube-system pod %s is being deleted (%v)", pod.Name, err)
		}
		sa, err := workload.CoreV1().ServiceAccounts("kube-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{GenerateName: "victim-"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
		if _, err := asNode.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, sa.Name, req, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("worker-0's credential minted a token of kube-system/%s (err %v), want Forbidden", sa.Name, err)
		}
	})

	t.Run("a killed component is restarted and the cluster stays Ready", func(t *testing.T) {
		pid := componentPID(t, root, "kube-scheduler")
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, time.Minute, "a new kube-scheduler process", func() error {
			if now := componentPIDOrZero(root, "kube-scheduler"); now == 0 || now == pid {
				return fmt.Errorf("kube-scheduler pid %d", now)
			}
			return nil
		})
		if err := c.Get(ctx, key, cluster); err != nil {
			t.Fatal(err)
		}
		if !meta.IsStatusConditionTrue(cluster.Status.Conditions, clusterv1.ReadyCondition) {
			t.Errorf("the cluster is not Ready after the restart: %v", cluster.Status.Conditions)
		}
		if _, err := workload.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("the workload API does not answer: %v", err)
		}
	})

	t.Run("no private key or token reaches a log", func(t *testing.T) {
		secrets := secretMaterial(t, ctx, c, "default")
		if len(secrets) < 4 {
			t.Fatalf("found %d pieces of key material in the cluster's Secrets, want the CA keys, the service-account key and the admin key", len(secrets))
		}
		for _, dir := range []string{filepath.Join(u.stateDir, "logs"), root} {
			_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() || !strings.HasSuffix(path, ".log") {
					return nil
				}
				data, err := os.ReadFile(path)
				if err != nil {
					return nil
				}
				for _, s := range secrets {
					if bytes.Contains(data, s) {
						t.Errorf("%s holds key material of the cluster's Secrets", path)
						break
					}
				}
				return nil
			})
		}
		if out := u.out.String(); containsAny([]byte(out), secrets) {
			t.Error("marina up's output holds key material of the cluster's Secrets")
		}
	})

	if out, err := u.kubectl(t, "delete", "cluster", "minimal", "--wait=false"); err != nil {
		t.Fatalf("kubectl delete cluster: %v\n%s", err, out)
	}
	testenv.Eventually(t, 2*time.Minute, "the cluster, its machines, sandboxes, endpoint and processes gone", func() error {
		if err := c.Get(ctx, key, &clusterv1.Cluster{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster still there (%v)", err)
		}
		var machines clusterv1.MachineList
		if err := c.List(ctx, &machines, client.InNamespace("default")); err != nil || len(machines.Items) > 0 {
			return fmt.Errorf("%d machines left (%v)", len(machines.Items), err)
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

// startUpWithClient starts marina up for a test that makes clusters: it
// returns the local provider's root (every sandbox and endpoint, cleaned up
// whatever happens) and a client of the management plane.
func startUpWithClient(t *testing.T, args ...string) (*upProcess, string, client.Client) {
	t.Helper()
	stateDir := t.TempDir()
	u := startUp(t, stateDir, args...)
	root := filepath.Join(stateDir, "machines")
	t.Cleanup(func() { stopAgents(t, root) })
	return u, root, mgmtClient(t, stateDir)
}

// applyExample applies examples/<name>/ with kubectl, as the README does.
func (u *upProcess) applyExample(t *testing.T, name string) {
	t.Helper()
	repo, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := u.kubectl(t, "apply", "-f", filepath.Join(repo, "examples", name)); err != nil {
		t.Fatalf("kubectl apply -f examples/%s: %v\n%s", name, err, out)
	}
}

func mgmtClient(t *testing.T, stateDir string) client.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(stateDir, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// workloadClient reaches the cluster as its users do: with the admin
// kubeconfig marina keeps in <cluster>-kubeconfig.
func workloadClient(t *testing.T, ctx context.Context, c client.Client, key types.NamespacedName) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(workloadConfig(t, ctx, c, key))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func workloadConfig(t *testing.T, ctx context.Context, c client.Client, key types.NamespacedName) *rest.Config {
	t.Helper()
	secret := &corev1.Secret{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: key.Namespace, Name: remote.KubeconfigSecretName(key.Name)}, secret); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data[remote.KubeconfigSecretKey])
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// clusterReady says why cluster key is not Ready with want machines
// Running, or nil.
func clusterReady(ctx context.Context, c client.Client, key types.NamespacedName, want int) error {
	cluster := &clusterv1.Cluster{}
	if err := c.Get(ctx, key, cluster); err != nil {
		return err
	}
	if !meta.IsStatusConditionTrue(cluster.Status.Conditions, clusterv1.ReadyCondition) {
		return fmt.Errorf("not Ready: %v", cluster.Status.Conditions)
	}
	return machinesRunning(ctx, c, want)
}

func machinesRunning(ctx context.Context, c client.Client, want int) error {
	return machinesRunningIn(ctx, c, "default", want)
}

func machinesRunningIn(ctx context.Context, c client.Client, ns string, want int) error {
	var list clusterv1.MachineList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return err
	}
	running := 0
	var others []string
	for _, m := range list.Items {
		if m.Status.Phase == clusterv1.MachinePhaseRunning {
			running++
			continue
		}
		// What holds the others back, for a failure to name it.
		why := string(m.Status.Phase)
		for _, c := range m.Status.Conditions {
			if c.Status != metav1.ConditionTrue {
				why += fmt.Sprintf("; %s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
			}
		}
		others = append(others, m.Name+": "+why)
	}
	if len(list.Items) != want || running != want {
		return fmt.Errorf("%d machines, %d Running, want %d\n%s", len(list.Items), running, want, strings.Join(others, "\n"))
	}
	return nil
}

// checkNodes: one control-plane Node, tainted and labelled (M9), and two
// workers, all Ready at v1.37.2.
func checkNodes(t *testing.T, ctx context.Context, cs kubernetes.Interface) {
	t.Helper()
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != 3 {
		t.Fatalf("%d Nodes, want 3", len(nodes.Items))
	}
	controlPlanes := 0
	for _, n := range nodes.Items {
		if !nodeReady(&n) {
			t.Errorf("node %s is not Ready", n.Name)
		}
		if v := n.Status.NodeInfo.KubeletVersion; v != "v1.37.2" {
			t.Errorf("node %s: kubelet %s, want v1.37.2", n.Name, v)
		}
		_, cp := n.Labels["node-role.kubernetes.io/control-plane"]
		tainted := false
		for _, taint := range n.Spec.Taints {
			if taint.Key == "node-role.kubernetes.io/control-plane" && taint.Effect == corev1.TaintEffectNoSchedule {
				tainted = true
			}
		}
		if cp {
			controlPlanes++
		}
		if cp != tainted {
			t.Errorf("node %s: control-plane label %v but NoSchedule taint %v", n.Name, cp, tainted)
		}
	}
	if controlPlanes != 1 {
		t.Errorf("%d control-plane Nodes, want 1", controlPlanes)
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// componentPID finds the one process of a control-plane component run from
// a sandbox under root.
func componentPID(t *testing.T, root, component string) int {
	t.Helper()
	pid := componentPIDOrZero(root, component)
	if pid == 0 {
		t.Fatalf("no %s process runs from %s", component, root)
	}
	return pid
}

func componentPIDOrZero(root, component string) int {
	for _, pid := range processesUnder(root) {
		data, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		argv0, _, _ := strings.Cut(string(data), "\x00")
		if strings.HasPrefix(filepath.Base(argv0), component) && alive(pid) {
			return pid
		}
	}
	return 0
}

// processesUnder lists the live processes whose command line names a path
// under root (agents, components, load balancers).
func processesUnder(root string) []int {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []int
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(data, []byte(root)) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err == nil && pid != os.Getpid() && alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// leftovers lists what remains under root besides empty bookkeeping
// directories.
func leftovers(t *testing.T, root string) []string {
	t.Helper()
	var left []string
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == root {
			return nil
		}
		if !d.IsDir() {
			left = append(left, strings.TrimPrefix(path, root))
			return nil
		}
		return nil
	})
	return left
}

// secretMaterial collects, from every Secret in ns, the private keys (the
// base64 body of each PEM block) and the kubeconfigs' embedded keys: what
// must never appear in a log.
func secretMaterial(t *testing.T, ctx context.Context, c client.Client, ns string) [][]byte {
	t.Helper()
	var list corev1.SecretList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, s := range list.Items {
		for _, data := range s.Data {
			out = append(out, privateKeys(data)...)
			if cfg, err := clientcmd.Load(data); err == nil {
				for _, a := range cfg.AuthInfos {
					out = append(out, privateKeys(a.ClientKeyData)...)
					if a.Token != "" {
						out = append(out, []byte(a.Token))
					}
				}
			}
		}
	}
	return out
}

// privateKeys returns a line from the middle of each private key PEM block
// in data: long enough never to match by chance, short enough to be found
// in a log that wraps or re-encodes lines.
func privateKeys(data []byte) [][]byte {
	var out [][]byte
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return out
		}
		if !strings.Contains(block.Type, "PRIVATE KEY") {
			continue
		}
		body := pem.EncodeToMemory(block)
		lines := bytes.Split(body, []byte("\n"))
		if len(lines) > 2 {
			out = append(out, lines[1])
		}
	}
}

func containsAny(data []byte, needles [][]byte) bool {
	for _, n := range needles {
		if bytes.Contains(data, n) {
			return true
		}
	}
	return false
}

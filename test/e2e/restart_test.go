package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/internal/testenv"
)

// Issue 25: a power cut. examples/minimal and examples/workers run, a
// ConfigMap is written in the workload cluster; then every process whose
// command line names the state directory is killed at once (marina up and
// its management plane, the agents, the balancer, the components), as a
// host losing power would. marina up again: within 90 s the cluster is
// Ready with 6 Nodes whose agents are alive again, the same machines (no
// replacement), the ConfigMap still there, the CA unchanged, and one
// process of each kind, no duplicate.
func TestUpComesBackAfterAPowerCut(t *testing.T) {
	t.Parallel()
	powerCut(t, []string{"minimal", "workers"}, types.NamespacedName{Namespace: "default", Name: "minimal"}, 6, 1)
}

// The same with examples/ha: its three stacked etcd members all stop at
// once, and none has a quorum until the others are started too; Ready
// again, with 3 healthy voting members.
func TestUpBringsBackAStackedControlPlaneAfterAPowerCut(t *testing.T) {
	t.Parallel()
	powerCut(t, []string{"ha"}, types.NamespacedName{Namespace: "default", Name: "ha"}, 7, 3)
}

// powerCut applies examples, waits for cluster key Ready with machines
// Ready Nodes, cuts the power and checks what comes back; controlPlanes is
// the number of control-plane machines (and etcd members).
func powerCut(t *testing.T, examples []string, key types.NamespacedName, machines, controlPlanes int) {
	stateDir := t.TempDir()
	u := startUp(t, stateDir)
	root := filepath.Join(stateDir, "machines")
	t.Cleanup(func() { stopAgents(t, root) })
	c := mgmtClient(t, stateDir)
	ctx := context.Background()
	applied := time.Now()
	for _, example := range examples {
		u.applyExample(t, example)
	}
	testenv.Eventually(t, 8*time.Minute, fmt.Sprintf("cluster %s Ready with %d Ready Nodes", key.Name, machines), func() error {
		return clusterBack(ctx, c, key, machines, controlPlanes, applied)
	})
	t.Logf("examples %v Ready %.1fs after kubectl apply", examples, time.Since(applied).Seconds())
	cs := workloadClient(t, ctx, c, key)
	caBefore := workloadConfig(t, ctx, c, key).CAData
	kept := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "survives-a-power-cut", Namespace: "default"}, Data: map[string]string{"written": applied.String()}}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, kept, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := machineUIDs(t, ctx, c)

	cutPower(t, u, stateDir)
	restarted := time.Now()
	u = startUp(t, stateDir)
	c = mgmtClient(t, stateDir)
	testenv.Eventually(t, 90*time.Second, fmt.Sprintf("cluster %s Ready again with %d live Ready Nodes", key.Name, machines), func() error {
		return clusterBack(ctx, c, key, machines, controlPlanes, restarted)
	})
	t.Logf("Ready again %.1fs after marina up was started again", time.Since(restarted).Seconds())

	if after := machineUIDs(t, ctx, c); !slices.Equal(after, before) {
		t.Errorf("machines after the power cut %v, want the same ones as before %v", after, before)
	}
	cs = workloadClient(t, ctx, c, key)
	got, err := cs.CoreV1().ConfigMaps("default").Get(ctx, kept.Name, metav1.GetOptions{})
	if err != nil {
		t.Errorf("the ConfigMap written before the power cut: %v", err)
	} else if got.Data["written"] != kept.Data["written"] {
		t.Errorf("the ConfigMap holds %v, want %v", got.Data, kept.Data)
	}
	if caAfter := workloadConfig(t, ctx, c, key).CAData; !bytes.Equal(caAfter, caBefore) {
		t.Error("the cluster's CA changed across the power cut")
	}
	t.Run("one process of each, no duplicate", func(t *testing.T) {
		counts := map[string]int{}
		for _, pid := range processesUnder(root) {
			data, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
			args := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
			what := filepath.Base(args[0])
			if len(args) > 2 && (args[1] == "node-agent" || args[1] == "load-balancer") {
				what = args[1] + " " + args[len(args)-1] // the sandbox or directory
			}
			counts[what]++
		}
		for what, n := range counts {
			if n != 1 && !strings.HasPrefix(what, "kube-") && !strings.HasPrefix(what, "etcd") {
				t.Errorf("%d processes of %s, want 1", n, what)
			}
		}
		// One of each component per control-plane machine.
		for _, component := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			n := 0
			for what, k := range counts {
				if strings.HasPrefix(what, component+"-") || what == component {
					n += k
				}
			}
			if n != controlPlanes {
				t.Errorf("%d %s processes, want %d (%v)", n, component, controlPlanes, counts)
			}
		}
	})
}

// cutPower kills, at once, marina up and every process whose command line
// names stateDir (its management plane, the agents, the balancer, the
// components), as a host losing power would, and waits until all are gone.
func cutPower(t *testing.T, u *upProcess, stateDir string) {
	t.Helper()
	victims := processesUnder(stateDir)
	t.Logf("power cut: killing %d processes whose command line names %s", len(victims), stateDir)
	for _, pid := range append(victims, u.cmd.Process.Pid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	<-u.done
	testenv.Eventually(t, 30*time.Second, "every process of the state directory gone", func() error {
		if left := processesUnder(stateDir); len(left) > 0 {
			return fmt.Errorf("still running: %v", left)
		}
		return nil
	})
}

// clusterBack: the Cluster is Ready with all its etcd members healthy,
// its machines all Running with their instance running, and want Nodes
// Ready whose Leases were renewed since since (a Node's Ready from before
// a power cut proves nothing).
func clusterBack(ctx context.Context, c client.Client, key types.NamespacedName, want, members int, since time.Time) error {
	cluster := &clusterv1.Cluster{}
	if err := c.Get(ctx, key, cluster); err != nil {
		return err
	}
	if !meta.IsStatusConditionTrue(cluster.Status.Conditions, clusterv1.ReadyCondition) {
		return fmt.Errorf("cluster not Ready: %v", meta.FindStatusCondition(cluster.Status.Conditions, clusterv1.ReadyCondition))
	}
	etcd := meta.FindStatusCondition(cluster.Status.Conditions, clusterv1.ClusterEtcdHealthyCondition)
	if wantMsg := fmt.Sprintf("%d of %d etcd members are healthy", members, members); etcd == nil || etcd.Status != metav1.ConditionTrue || etcd.Message != wantMsg {
		return fmt.Errorf("etcd: %+v, want %q", etcd, wantMsg)
	}
	if err := machinesRunning(ctx, c, want); err != nil {
		return err
	}
	var list clusterv1.MachineList
	if err := c.List(ctx, &list, client.InNamespace(key.Namespace)); err != nil {
		return err
	}
	for _, m := range list.Items {
		if !meta.IsStatusConditionTrue(m.Status.Conditions, clusterv1.MachineInstanceRunningCondition) {
			return fmt.Errorf("machine %s: %v", m.Name, meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineInstanceRunningCondition))
		}
	}
	secret := &corev1.Secret{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: key.Namespace, Name: remote.KubeconfigSecretName(key.Name)}, secret); err != nil {
		return err
	}
	cs, err := workloadClientset(secret)
	if err != nil {
		return err
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	ready := 0
	for i := range nodes.Items {
		n := &nodes.Items[i]
		lease, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil || lease.Spec.RenewTime == nil || lease.Spec.RenewTime.Time.Before(since) {
			continue
		}
		if nodeReady(n) {
			ready++
		}
	}
	if len(nodes.Items) != want || ready != want {
		return fmt.Errorf("%d Nodes, %d Ready with a Lease renewed since %s, want %d", len(nodes.Items), ready, since.Format(time.TimeOnly), want)
	}
	return nil
}

func workloadClientset(secret *corev1.Secret) (kubernetes.Interface, error) {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data[remote.KubeconfigSecretKey])
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 5 * time.Second
	return kubernetes.NewForConfig(cfg)
}

// machineUIDs are the UIDs of the machines of the default namespace, sorted.
func machineUIDs(t *testing.T, ctx context.Context, c client.Client) []types.UID {
	t.Helper()
	var list clusterv1.MachineList
	if err := c.List(ctx, &list, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	var uids []types.UID
	for _, m := range list.Items {
		uids = append(uids, m.UID)
	}
	slices.Sort(uids)
	return uids
}

package bench

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider/local"
)

var (
	controlPlanes  = flag.Int("control-planes", 1, "control-plane machines of the cluster BenchmarkClusterReady makes (1, 3 or 5)")
	clusterWorkers = flag.Int("cluster-workers", 2, "worker machines of the cluster BenchmarkClusterReady makes")
)

// BenchmarkClusterReady measures what a user of marina up waits for: from
// applying a Cluster (with -control-planes control-plane machines and a
// MachineDeployment of -cluster-workers workers) to the cluster Ready with
// every machine Running, and what a control-plane machine costs in memory
// (its agent and its etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler processes).
//
//	go test -run '^$' -bench BenchmarkClusterReady -benchtime 1x ./bench/ -args -control-planes=3
func BenchmarkClusterReady(b *testing.B) {
	ctx := context.Background()
	c, root := startUp(b)

	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("bench-%d", i)
		start := time.Now()
		must(b, c.Create(ctx, benchCluster(name, *controlPlanes)))
		must(b, c.Create(ctx, benchWorkers(name, *clusterWorkers)))
		key := types.NamespacedName{Namespace: "default", Name: name}
		testenv.Eventually(b, 10*time.Minute, "the cluster Ready with every machine Running", func() error {
			cl := &clusterv1.Cluster{}
			if err := c.Get(ctx, key, cl); err != nil {
				return err
			}
			if !meta.IsStatusConditionTrue(cl.Status.Conditions, clusterv1.ReadyCondition) || cl.Status.ControlPlane.ReadyReplicas != int32(*controlPlanes) {
				return fmt.Errorf("not Ready")
			}
			var list clusterv1.MachineList
			if err := c.List(ctx, &list, client.InNamespace("default"), client.MatchingLabels{clusterv1.ClusterNameLabel: name}); err != nil {
				return err
			}
			running := 0
			for _, m := range list.Items {
				if m.Status.Phase == clusterv1.MachinePhaseRunning {
					running++
				}
			}
			if running != *controlPlanes+*clusterWorkers {
				return fmt.Errorf("%d of %d machines Running", running, *controlPlanes+*clusterWorkers)
			}
			return nil
		})
		ready := time.Since(start)
		b.ReportMetric(ready.Seconds(), "s-to-ready")
		fmt.Printf("cluster %s: %d control-plane + %d workers Ready and Running %.1fs after apply\n", name, *controlPlanes, *clusterWorkers, ready.Seconds())

		var list clusterv1.MachineList
		must(b, c.List(ctx, &list, client.InNamespace("default"), client.HasLabels{clusterv1.ControlPlaneLabel}))
		var maxRSS float64
		for _, m := range list.Items {
			rss, peak, n := treeMemory(filepath.Join(root, string(m.UID)))
			fmt.Printf("  %s: %d processes, RSS %.0f MiB now, %.0f MiB summed peaks\n", m.Name, n, rss, peak)
			maxRSS = max(maxRSS, peak)
		}
		b.ReportMetric(maxRSS, "MiB-per-control-plane")

		must(b, c.Delete(ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}))
		testenv.Eventually(b, 5*time.Minute, "the cluster deleted", func() error {
			err := c.Get(ctx, key, &clusterv1.Cluster{})
			if client.IgnoreNotFound(err) != nil {
				return err
			}
			if err == nil {
				return fmt.Errorf("still there")
			}
			return nil
		})
	}
}

// startUp builds marina, starts marina up in a temporary state directory
// and returns a management-plane client and the local provider's root;
// everything is stopped and removed when b ends.
func startUp(b *testing.B) (client.Client, string) {
	tmp := b.TempDir()
	marina, err := testenv.BuildMarina(tmp)
	must(b, err)
	binDir, err := testenv.BinDir()
	must(b, err)
	state := filepath.Join(tmp, "state")
	port := testenv.FreePorts(b, 5)
	up := exec.Command(marina, "up", "--state-dir", state, "--bin-dir", binDir,
		"--api-port", strconv.Itoa(port), "--etcd-port", strconv.Itoa(port+1), "--webhook-port", strconv.Itoa(port+3),
		"--registry-port", strconv.Itoa(port+4))
	logPath := filepath.Join(tmp, "up.log")
	logFile, err := os.Create(logPath)
	must(b, err)
	b.Cleanup(func() { logFile.Close() })
	up.Stdout, up.Stderr = logFile, logFile
	must(b, up.Start())
	root := filepath.Join(state, "machines")
	b.Cleanup(func() {
		_ = up.Process.Signal(syscall.SIGTERM)
		_ = up.Wait()
		stopSandboxes(b, marina, root)
	})
	var c client.Client
	testenv.Eventually(b, 3*time.Minute, "the management plane", func() error {
		cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(state, "admin.kubeconfig"))
		if err != nil {
			return err
		}
		if c, err = client.New(cfg, client.Options{Scheme: scheme.New()}); err != nil {
			return err
		}
		if log, _ := os.ReadFile(logPath); !bytes.Contains(log, []byte("management plane is up")) {
			return fmt.Errorf("not up yet")
		}
		return nil
	})
	return c, root
}

func benchCluster(name string, replicas int) *clusterv1.Cluster {
	return &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: clusterv1.ClusterSpec{
			ControlPlane: clusterv1.ControlPlaneSpec{
				Version:      "v1.37.2",
				Replicas:     int32(replicas),
				ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"2Gi"}}`)},
			},
		},
	}
}

func benchWorkers(cluster string, replicas int) *clusterv1.MachineDeployment {
	n := int32(replicas)
	labels := map[string]string{"pool": cluster}
	return &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Name: cluster + "-workers", Namespace: "default"},
		Spec: clusterv1.MachineDeploymentSpec{
			ClusterName: cluster,
			Replicas:    &n,
			Selector:    metav1.LabelSelector{MatchLabels: labels},
			Template: clusterv1.MachineTemplateSpec{
				ObjectMeta: clusterv1.MachineTemplateMeta{Labels: labels},
				Spec: clusterv1.MachineSpec{
					ClusterName:  cluster,
					Roles:        []clusterv1.MachineRole{clusterv1.WorkerRole},
					Versions:     clusterv1.MachineVersions{Kubelet: "v1.37.2"},
					ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi"}}`)},
				},
			},
		},
	}
}

// treeMemory sums, over the live processes whose command line names dir
// (a machine's agent and its components), the resident memory now and the
// peak each reached (VmHWM), in MiB.
func treeMemory(dir string) (rss, peak float64, n int) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(data, []byte(dir)) {
			continue
		}
		f, err := os.Open(filepath.Join(filepath.Dir(p), "status"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 2 {
				continue
			}
			kb, _ := strconv.ParseFloat(fields[1], 64)
			switch fields[0] {
			case "VmRSS:":
				rss += kb / 1024
			case "VmHWM:":
				peak += kb / 1024
			}
		}
		f.Close()
		n++
	}
	return rss, peak, n
}

// stopSandboxes ends whatever a failed run left under root: agents,
// their components, endpoints.
func stopSandboxes(b *testing.B, marina, root string) {
	p, err := local.New(local.Options{Root: root, AgentCommand: []string{marina, "node-agent"}, LoadBalancerCommand: []string{marina, "load-balancer"}})
	if err == nil {
		err = p.DeleteAll(context.Background())
	}
	if err != nil {
		b.Errorf("cleaning up %s: %v", root, err)
	}
}

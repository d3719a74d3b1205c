package bench

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/internal/testenv"
)

var realWorkers = flag.Int("real-workers", 5, "real workers of the cluster BenchmarkRealWorkers makes")

// BenchmarkRealWorkers measures what a user of real workers waits for and
// what one costs (issue 32): from applying a one-control-plane Cluster with
// -real-workers real workers and one simulated worker, to a pod of the
// locally built hello image Running and answering on every real worker;
// then the memory of each real worker (its agent, kubelet, containerd and
// its shims, kube-proxy: everything but the pods) beside the simulated
// worker's agent.
//
//	go test -run '^$' -bench BenchmarkRealWorkers -benchtime 1x ./bench/ -args -real-workers=5
//
// Each answer comes through a NodePort Service with externalTrafficPolicy
// Local, asked at each real Node's address from this host: only a pod on
// that Node may answer, and the answer names it.
func BenchmarkRealWorkers(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("real workers need root")
	}
	ctx := context.Background()
	c, root := startUp(b)
	n := *realWorkers

	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("real-%d", i)
		start := time.Now()
		must(b, c.Create(ctx, benchCluster(name, 1)))
		must(b, c.Create(ctx, benchWorkers(name, 1)))
		must(b, c.Create(ctx, benchRealWorkers(name, n)))

		var cs kubernetes.Interface
		testenv.Eventually(b, 5*time.Minute, "the workload cluster's API", func() error {
			secret := &corev1.Secret{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: remote.KubeconfigSecretName(name)}, secret); err != nil {
				return err
			}
			cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data[remote.KubeconfigSecretKey])
			if err != nil {
				return err
			}
			if cs, err = kubernetes.NewForConfig(cfg); err != nil {
				return err
			}
			_, err = cs.Discovery().ServerVersion()
			return err
		})
		apiUp := time.Since(start)
		// The app goes in as soon as the API answers, as a user's
		// pipeline would apply it: its pods wait for their Nodes.
		must(b, helloEverywhere(ctx, cs, name, n))

		var nodesReady time.Duration
		answered := map[string]time.Duration{}
		testenv.Eventually(b, 10*time.Minute, fmt.Sprintf("a hello pod answering on each of %d real Nodes", n), func() error {
			nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "pool=" + name + "-real"})
			if err != nil {
				return err
			}
			ready := 0
			for _, node := range nodes.Items {
				if nodeIsReady(&node) {
					ready++
				}
				if _, ok := answered[node.Name]; ok {
					continue
				}
				if _, err := askNodePort(ctx, &node); err == nil {
					answered[node.Name] = time.Since(start)
				}
			}
			if ready == n && nodesReady == 0 {
				nodesReady = time.Since(start)
			}
			if len(answered) < n {
				return fmt.Errorf("%d of %d real Nodes Ready, %d answering", ready, n, len(answered))
			}
			return nil
		})
		var last time.Duration
		for _, d := range answered {
			last = max(last, d)
		}
		fmt.Printf("cluster %s: API answering %.1fs, %d real Nodes Ready %.1fs, a pod answering on every one %.1fs after apply\n",
			name, apiUp.Seconds(), n, nodesReady.Seconds(), last.Seconds())
		b.ReportMetric(last.Seconds(), "s-to-pods-answering")

		var list clusterv1.MachineList
		must(b, c.List(ctx, &list, client.InNamespace("default"), client.MatchingLabels{clusterv1.ClusterNameLabel: name}))
		var realMax, simulated float64
		for _, m := range list.Items {
			if _, cp := m.Labels[clusterv1.ControlPlaneLabel]; cp {
				continue
			}
			rss, anon, peak, procs, byBinary := workerMemory(root, m.UID)
			kind := "simulated"
			if m.Spec.Labels["pool"] == name+"-real" {
				kind = "real"
				realMax = max(realMax, rss)
			} else {
				simulated = rss
			}
			fmt.Printf("  %s (%s): %d processes, RSS %.0f MiB now (%.0f MiB anonymous, the rest the binaries' pages), %.0f MiB summed peaks; now by binary: %s\n",
				m.Name, kind, procs, rss, anon, peak, largestFirst(byBinary, "%.0f", 1))
		}
		fmt.Printf("  the largest real worker: %.0f MiB; the simulated worker: %.0f MiB\n", realMax, simulated)
		b.ReportMetric(realMax, "MiB-per-real-worker")
		b.ReportMetric(simulated, "MiB-per-simulated-worker")

		must(b, c.Delete(ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}))
		testenv.Eventually(b, 5*time.Minute, "the cluster deleted", func() error {
			err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &clusterv1.Cluster{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err == nil {
				return fmt.Errorf("still there")
			}
			return err
		})
	}
}

func benchRealWorkers(cluster string, replicas int) *clusterv1.MachineDeployment {
	md := benchWorkers(cluster, replicas)
	md.Name = cluster + "-real"
	labels := map[string]string{"pool": cluster + "-real"}
	md.Spec.Selector.MatchLabels = labels
	md.Spec.Template.ObjectMeta.Labels = labels
	// The Node carries the pool label too, so the app can select real Nodes.
	md.Spec.Template.Spec.Labels = labels
	md.Spec.Template.Spec.ContainerRuntime.Name = "containerd"
	md.Spec.Template.Spec.ProviderSpec = &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","kubelet":"Real"}}`)}
	return md
}

// helloEverywhere creates the hello Deployment with one pod per real Node
// and a NodePort Service that answers only from the Node's own pod.
func helloEverywhere(ctx context.Context, cs kubernetes.Interface, cluster string, replicas int) error {
	labels := map[string]string{"app": "hello"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(replicas)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{"pool": cluster + "-real"},
					// Not a topology spread: it counts only the Nodes
					// already there, and the app goes in before they join.
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
							TopologyKey: corev1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
						}},
					}},
					Containers: []corev1.Container{{
						Name: "hello", Image: "marina.local/hello:v1", ImagePullPolicy: corev1.PullIfNotPresent,
						Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}},
							PeriodSeconds: 1,
						},
					}},
				},
			},
		},
	}
	if _, err := cs.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the hello Deployment: %w", err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeNodePort,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Selector:              labels,
			Ports:                 []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30080}},
		},
	}
	if _, err := cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the hello Service: %w", err)
	}
	return nil
}

// askNodePort asks the hello Service at node's address and returns the
// name of the pod that answered.
func askNodePort(ctx context.Context, node *corev1.Node) (string, error) {
	var addr string
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			addr = a.Address
		}
	}
	if addr == "" {
		return "", fmt.Errorf("node %s has no address", node.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return testenv.AskHello(ctx, nil, "http://"+net.JoinHostPort(addr, "30080")+"/")
}

func nodeIsReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// workerMemory sums the memory of a worker's own processes: those whose
// command line names its sandbox (the agent, kubelet, containerd,
// kube-proxy) and those in its cgroup outside the pods' (containerd's
// shims). The pods themselves are the workload, not the worker. Of the
// resident memory, the anonymous part is the processes' own; the rest is
// their binaries' pages, which processes of one binary share.
func workerMemory(root string, uid any) (rss, anon, peak float64, n int, byBinary map[string]float64) {
	byBinary = map[string]float64{}
	dir := filepath.Join(root, fmt.Sprint(uid))
	group := []byte("/marina/" + fmt.Sprint(uid))
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cmdline, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue
		}
		cgroup, _ := os.ReadFile(filepath.Join(p, "cgroup"))
		ours := bytes.Contains(cmdline, []byte(dir)) ||
			(bytes.Contains(cgroup, group) && !bytes.Contains(cgroup, []byte("kubepods")))
		if !ours {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(p))
		now := float64(statusKB(pid, "VmRSS:")) / 1024
		rss += now
		anon += float64(statusKB(pid, "RssAnon:")) / 1024
		peak += float64(statusKB(pid, "VmHWM:")) / 1024
		binary, _, _ := bytes.Cut(cmdline, []byte{0})
		byBinary[filepath.Base(string(binary))] += now
		n++
	}
	return rss, anon, peak, n, byBinary
}

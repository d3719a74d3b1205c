package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/internal/testenv"
)

// world is what every benchmark runs in: a management plane and a workload
// API server (envtest, the pinned binaries), a Cluster "bench" in namespace
// "bench" whose kubeconfig points at the workload server, and `marina
// controller` as its own process with the local provider.
type world struct {
	mgmt, workload *testenv.Env
	ns             string
	marina         string
	sandboxes      string
	ctl            *exec.Cmd
	logFile        *os.File
	cleanups       []func()
}

func startWorld(b *testing.B) *world {
	ctx := context.Background()
	tmp := b.TempDir()
	w := &world{ns: "bench"}
	var err error
	w.marina, err = testenv.BuildMarina(tmp)
	must(b, err)
	w.mgmt, err = testenv.Start()
	must(b, err)
	w.cleanups = append(w.cleanups, func() { _ = w.mgmt.Stop() })
	w.workload, err = testenv.StartWorkload()
	if err != nil {
		w.stop()
		b.Fatal(err)
	}
	w.cleanups = append(w.cleanups, func() { _ = w.workload.Stop() })

	must(b, w.mgmt.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}}))
	must(b, w.mgmt.Client.Create(ctx, &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: "bench", Namespace: w.ns,
			// The suite's workload API server stands in for the control plane.
			Annotations: map[string]string{clusterv1.ExternalControlPlaneAnnotation: "true"}},
		Spec: clusterv1.ClusterSpec{
			ClusterNetwork: clusterv1.ClusterNetwork{Pods: []clusterv1.CIDR{"10.244.0.0/16"}, Services: []clusterv1.CIDR{"10.96.0.0/12"}},
			ControlPlane: clusterv1.ControlPlaneSpec{Version: "v1.37.2", Replicas: 1,
				ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"2Gi"}}`)}},
		},
	}))
	must(b, w.mgmt.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: remote.KubeconfigSecretName("bench"), Namespace: w.ns,
			Labels: map[string]string{clusterv1.ClusterNameLabel: "bench"}},
		Data: map[string][]byte{remote.KubeconfigSecretKey: w.workload.Kubeconfig},
	}))

	w.sandboxes = filepath.Join(tmp, "machines")
	kubeconfig := filepath.Join(tmp, "mgmt.kubeconfig")
	must(b, os.WriteFile(kubeconfig, w.mgmt.Kubeconfig, 0o600))
	w.ctl = exec.Command(w.marina, "controller", "--kubeconfig", kubeconfig, "--leader-elect=false",
		"--local-provider-dir", w.sandboxes, "--metrics-bind-address=0", "--health-probe-bind-address=0",
		// The benchmark measures the controllers; its API server calls no webhook.
		"--webhook-port=0")
	w.logFile, err = os.Create(filepath.Join(tmp, "controller.log"))
	must(b, err)
	w.ctl.Stdout, w.ctl.Stderr = w.logFile, w.logFile
	w.ctl.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := w.ctl.Start(); err != nil {
		w.stop()
		b.Fatal(err)
	}
	w.cleanups = append(w.cleanups,
		func() { w.logFile.Close() },
		func() { cleanupSandboxes(b, w.marina, w.sandboxes) },
		func() { _ = w.ctl.Process.Signal(syscall.SIGTERM); _ = w.ctl.Wait() },
	)
	return w
}

// stop undoes startWorld, last step first: the controller, the agents, the
// API servers.
func (w *world) stop() {
	for i := len(w.cleanups) - 1; i >= 0; i-- {
		w.cleanups[i]()
	}
	w.cleanups = nil
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/image"
	"marina.dev/marina/internal/install"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/internal/version"
)

// Issue 28: the image make image builds is the controller of a management
// plane. podman (with runc: crun cannot run containers on this machine's
// hybrid cgroups, docs/management-plane.md) runs it as a container would
// run in a cluster: its own user, a read-only root, the host's loopback
// network to reach the API server. marina init installs marina into a
// real API server and the container's controller serves the webhook,
// leads, and makes examples/minimal Ready with the local provider, whose
// machines' processes run inside the container, then deletes it.
func TestTheImageRunsTheControllerThatMakesACluster(t *testing.T) {
	t.Parallel()
	podman := requirePodman(t)
	dir := t.TempDir()
	// A version of this run's own, so the image loaded is this one.
	v := fmt.Sprintf("v0.0.0-e2e.%d", time.Now().UnixNano())
	const rev, repo = "e2e0000000000000000000000000000000000000", "localhost/marina-e2e"
	bin, err := testenv.BuildStaticMarina(dir, version.LDFlags(v, rev, repo))
	if err != nil {
		t.Fatal(err)
	}
	img, err := image.Build(image.Options{Binary: bin, Arch: runtime.GOARCH, Version: v, Revision: rev,
		Created: time.Unix(0, 0), CACerts: "/etc/ssl/certs/ca-certificates.crt"})
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(repo + ":" + v)
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "marina-image.tar")
	if _, err := image.Write(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(podman.bin, "load", "-i", archive).CombinedOutput(); err != nil {
		t.Fatalf("podman load: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command(podman.bin, "rmi", "-f", tag.String()).Run() })
	if out, err := podman.run(t, tag.String(), nil, "version").CombinedOutput(); err != nil || !strings.Contains(string(out), "marina "+v+"\n") {
		t.Fatalf("marina version in the container: %v\n%s", err, out)
	}

	env, err := testenv.StartWorkload()
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	// Garbage collection and namespaces, as every real cluster has them.
	testenv.StartControllerManager(t, env, []string{"garbage-collector-controller", "namespace-controller", "serviceaccount-token-controller"})
	admin := filepath.Join(dir, "admin.kubeconfig")
	if err := os.WriteFile(admin, env.Kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	base := testenv.FreePorts(t, 2)
	webhookPort, healthPort := base, base+1

	// The controller's files, mounted at the same paths in the container
	// and owned by the image's user: nothing else is writable there.
	machines := filepath.Join(dir, "machines")
	certs := filepath.Join(dir, "webhook-certs")
	secrets := filepath.Join(dir, "controller")
	for _, d := range []string{machines, certs, secrets} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { stopAgents(t, machines) })

	initOut := &syncBuffer{}
	initCmd := exec.Command(marinaBin, "init", "--kubeconfig", admin, "--webhook-url", fmt.Sprintf("https://127.0.0.1:%d", webhookPort), "--timeout", "3m")
	initCmd.Stdout, initCmd.Stderr = initOut, initOut
	if err := initCmd.Start(); err != nil {
		t.Fatal(err)
	}
	initDone := make(chan error, 1)
	go func() { initDone <- initCmd.Wait() }()
	defer func() {
		if initCmd.ProcessState == nil {
			_ = initCmd.Process.Kill()
			<-initDone
		}
	}()
	testenv.Eventually(t, time.Minute, "init has established the CRDs and the controller's account", func() error {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := env.Client.Get(ctx, types.NamespacedName{Name: "machines.cluster.marina.dev"}, crd); err != nil {
			return err
		}
		return env.Client.Get(ctx, types.NamespacedName{Namespace: install.Namespace, Name: "marina-controller"}, &corev1.ServiceAccount{})
	})
	cs := kubernetes.NewForConfigOrDie(env.Config)
	kubeconfig := tokenKubeconfig(t, ctx, cs, env.Kubeconfig, install.Namespace, "marina-controller", secrets)
	for _, p := range []string{machines, certs, secrets, kubeconfig} {
		if err := os.Chown(p, image.UID, image.GID); err != nil {
			t.Fatal(err)
		}
	}
	binDir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}

	controllerOut := &syncBuffer{}
	controller := podman.run(t, tag.String(), []string{machines, certs, secrets, binDir + ":ro"},
		"controller", "--kubeconfig", kubeconfig,
		"--webhook-host", "127.0.0.1", "--webhook-port", strconv.Itoa(webhookPort), "--webhook-cert-dir", certs,
		"--metrics-bind-address", "0", "--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", healthPort),
		"--local-provider-dir", machines, "--bin-dir", binDir)
	controller.Stdout, controller.Stderr = controllerOut, controllerOut
	if err := controller.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		podman.stop(t)
		_ = controller.Wait()
		if t.Failed() {
			t.Logf("the image's controller:\n%s", controllerOut)
		}
	}()

	select {
	case err = <-initDone:
	case <-time.After(4 * time.Minute):
		t.Fatalf("marina init did not end:\n%s", initOut)
	}
	if err != nil || !strings.Contains(initOut.String(), "marina is installed") {
		t.Fatalf("marina init with the image's controller: %v\n%s", err, initOut)
	}

	kubectl := filepath.Join(binDir, "kubectl")
	t.Run("the hardened Deployment of init --dry-run passes a server-side dry run", func(t *testing.T) {
		manifests, err := exec.Command(marinaBin, "init", "--dry-run", "-o", "yaml", "--image", tag.String()).Output()
		if err != nil {
			t.Fatalf("marina init --dry-run: %v", err)
		}
		for _, want := range []string{"kind: Deployment", "kind: PodDisruptionBudget", "readOnlyRootFilesystem: true", "image: " + tag.String()} {
			if !strings.Contains(string(manifests), want) {
				t.Errorf("marina init --dry-run -o yaml shows no %q", want)
			}
		}
		apply := exec.Command(kubectl, "--kubeconfig", admin, "apply", "--server-side", "--force-conflicts", "--field-manager", install.FieldOwner, "--dry-run=server", "-f", "-")
		apply.Stdin = strings.NewReader(string(manifests))
		if out, err := apply.CombinedOutput(); err != nil || !strings.Contains(string(out), "deployment.apps/marina-controller serverside-applied (server dry run)") {
			t.Errorf("kubectl apply --dry-run=server of marina init's objects: %v\n%s", err, out)
		}
	})

	repoRoot, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(kubectl, "--kubeconfig", admin, "apply", "-f", filepath.Join(repoRoot, "examples", "minimal")).CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply -f examples/minimal: %v\n%s", err, out)
	}
	key := types.NamespacedName{Namespace: "default", Name: "minimal"}
	testenv.Eventually(t, 3*time.Minute, "cluster minimal Ready with its 3 machines Running", func() error { return clusterReady(ctx, env.Client, key, 3) })
	checkNodes(t, ctx, workloadClient(t, ctx, env.Client, key))

	if out, err := exec.Command(kubectl, "--kubeconfig", admin, "delete", "cluster", "minimal", "--timeout", "2m").CombinedOutput(); err != nil {
		t.Fatalf("kubectl delete cluster minimal: %v\n%s", err, out)
	}
	testenv.Eventually(t, time.Minute, "no machine and no sandbox left", func() error {
		var list clusterv1.MachineList
		if err := env.Client.List(ctx, &list); err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d machines left", len(list.Items))
		}
		if left := leftovers(t, machines); len(left) > 0 {
			return fmt.Errorf("left in the machines directory: %v", left)
		}
		return nil
	})
}

// containerRuntime runs images with podman and runc, as root.
type containerRuntime struct {
	bin, runc string
	names     []string
}

// requirePodman finds podman and runc (make test installs them) or fails
// the test saying what to install.
func requirePodman(t *testing.T) *containerRuntime {
	t.Helper()
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Fatal("podman is not installed: make test-deps installs Debian's podman and runc (as root)")
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Fatal("runc is not installed: make test-deps installs Debian's podman and runc (as root)")
	}
	return &containerRuntime{bin: podman, runc: runc}
}

// run returns the command that runs ref with a read-only root on the
// host's network, each of mounts (host paths, ":ro" for read-only) at the
// same path inside.
func (r *containerRuntime) run(t *testing.T, ref string, mounts []string, args ...string) *exec.Cmd {
	t.Helper()
	name := fmt.Sprintf("marina-e2e-%d-%d", os.Getpid(), len(r.names))
	r.names = append(r.names, name)
	var nofile syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &nofile); err != nil {
		t.Fatal(err)
	}
	podmanArgs := []string{"--runtime", r.runc, "run", "--rm", "--name", name, "--network", "host", "--read-only",
		// podman's default limits are above what this machine lets a
		// process raise its own to; ask for what it has.
		"--ulimit", fmt.Sprintf("nofile=%d:%d", nofile.Cur, nofile.Max), "--ulimit", "nproc=8192:8192"}
	for _, m := range mounts {
		path, opt, _ := strings.Cut(m, ":")
		spec := path + ":" + path
		if opt != "" {
			spec += ":" + opt
		}
		podmanArgs = append(podmanArgs, "-v", spec)
	}
	podmanArgs = append(podmanArgs, ref)
	return exec.Command(r.bin, append(podmanArgs, args...)...)
}

// stop removes every container run started, with what runs in it.
func (r *containerRuntime) stop(t *testing.T) {
	t.Helper()
	for _, name := range r.names {
		if out, err := exec.Command(r.bin, "rm", "-f", "-t", "5", name).CombinedOutput(); err != nil && !strings.Contains(string(out), "no such container") {
			t.Errorf("podman rm %s: %v\n%s", name, err, out)
		}
	}
}

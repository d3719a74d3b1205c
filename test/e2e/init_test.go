package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/install"
	"marina.dev/marina/internal/testenv"
)

// Issue: the CLI (marina init), M18. marina init into a fresh API server
// applies everything, and ends only once its post-conditions hold: CRDs
// established, the tenancy policy bound, a controller leading and the
// webhook answering. A second run changes nothing. The controller runs as
// the service account init made, so its RBAC is the installed one; it runs
// as a process here, outside the cluster (--webhook-url), because this API
// server has no nodes to run its Deployment. Its metrics endpoint answers
// only callers allowed to get /metrics.
func TestInitInstallsMarinaAndItsPostConditionsHold(t *testing.T) {
	t.Parallel()
	env, err := testenv.StartWorkload()
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	dir := t.TempDir()
	admin := filepath.Join(dir, "admin.kubeconfig")
	if err := os.WriteFile(admin, env.Kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	base := testenv.FreePorts(t, 3)
	webhookPort, metricsPort, healthPort := base, base+1, base+2
	webhookURL := fmt.Sprintf("https://127.0.0.1:%d", webhookPort)

	initArgs := []string{"init", "--kubeconfig", admin, "--webhook-url", webhookURL, "--timeout", "2m"}
	first := exec.Command(marinaBin, initArgs...)
	out := &syncBuffer{}
	first.Stdout, first.Stderr = out, out
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	initDone := make(chan error, 1)
	go func() { initDone <- first.Wait() }()
	defer func() {
		if first.ProcessState == nil {
			_ = first.Process.Kill()
			<-initDone
		}
	}()

	// The controller can start once init has made its CRDs and account.
	testenv.Eventually(t, time.Minute, "init has established the CRDs", func() error {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := env.Client.Get(ctx, types.NamespacedName{Name: "machines.cluster.marina.dev"}, crd); err != nil {
			return err
		}
		sa := &corev1.ServiceAccount{}
		return env.Client.Get(ctx, types.NamespacedName{Namespace: install.Namespace, Name: "marina-controller"}, sa)
	})
	cs := kubernetes.NewForConfigOrDie(env.Config)
	controllerKubeconfig := tokenKubeconfig(t, ctx, cs, env.Kubeconfig, install.Namespace, "marina-controller", dir)
	controller := exec.Command(marinaBin, "controller", "--kubeconfig", controllerKubeconfig,
		"--webhook-host", "127.0.0.1", "--webhook-port", strconv.Itoa(webhookPort), "--webhook-cert-dir", filepath.Join(dir, "webhook-certs"),
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", metricsPort), "--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", healthPort),
		"--external-provider-kinds", "example.com/v1/Elsewhere")
	controllerOut := &syncBuffer{}
	controller.Stdout, controller.Stderr = controllerOut, controllerOut
	if err := controller.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = controller.Process.Kill()
		_ = controller.Wait()
		if t.Failed() {
			t.Logf("marina controller:\n%s", controllerOut)
		}
	}()

	select {
	case err = <-initDone:
	case <-time.After(3 * time.Minute):
		t.Fatalf("marina init did not end:\n%s", out)
	}
	t.Logf("marina init:\n%s", out)
	if err != nil {
		t.Fatalf("marina init: %v", err)
	}
	for _, want := range []string{"created Namespace/marina-system", "created CustomResourceDefinition/machines.cluster.marina.dev",
		"created ClusterRole/marina-manager", "created ValidatingWebhookConfiguration/marina-validation",
		"✓ CRDs established (6)", "✓ tenancy policy bound", "✓ controller leader elected", "✓ admission webhook answering", "marina is installed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("marina init's output does not show %q", want)
		}
	}
	if strings.Contains(out.String(), "Deployment") {
		t.Errorf("with --webhook-url, init installed a Deployment")
	}

	t.Run("a second run changes nothing", func(t *testing.T) {
		objs, err := install.Objects(install.Options{WebhookURL: webhookURL})
		if err != nil {
			t.Fatal(err)
		}
		before := resourceVersions(t, ctx, env, objs)
		again, err := exec.Command(marinaBin, initArgs...).CombinedOutput()
		t.Logf("marina init, again:\n%s", again)
		if err != nil {
			t.Fatalf("marina init, again: %v", err)
		}
		if n := strings.Count(string(again), "  unchanged "); n != len(objs) {
			t.Errorf("%d of %d objects reported unchanged", n, len(objs))
		}
		after := resourceVersions(t, ctx, env, objs)
		for k, v := range before {
			if after[k] != v {
				t.Errorf("%s changed: resourceVersion %s → %s", k, v, after[k])
			}
		}
	})

	t.Run("the webhook refuses what it should", func(t *testing.T) {
		m := &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "no-class"},
			Spec: clusterv1.MachineSpec{ClusterName: "c1", Roles: []clusterv1.MachineRole{clusterv1.WorkerRole},
				ClassRef: &clusterv1.MachineClassReference{Name: "missing"}, Versions: clusterv1.MachineVersions{Kubelet: "v1.37.2"}},
		}
		err := env.Client.Create(ctx, m)
		if err == nil || !strings.Contains(err.Error(), "denied the request") {
			t.Errorf("a Machine of a missing class: %v, want the webhook's denial", err)
		}
	})

	t.Run("metrics answer only allowed callers", func(t *testing.T) {
		// A machine of a kind owned elsewhere, so marina_machines has a row.
		m := &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "elsewhere"},
			Spec: clusterv1.MachineSpec{ClusterName: "c1", Roles: []clusterv1.MachineRole{clusterv1.WorkerRole},
				Versions:     clusterv1.MachineVersions{Kubelet: "v1.37.2"},
				ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"example.com/v1","kind":"Elsewhere"}`)}},
		}
		if err := env.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		reader := serviceAccountToken(t, ctx, cs, "default", "scraper", "marina-metrics-reader")
		stranger := serviceAccountToken(t, ctx, cs, "default", "stranger", "")
		url := fmt.Sprintf("https://127.0.0.1:%d/metrics", metricsPort)
		if code, _ := scrape(t, url, ""); code != http.StatusUnauthorized {
			t.Errorf("without a token: HTTP %d, want 401", code)
		}
		if code, _ := scrape(t, url, stranger); code != http.StatusForbidden {
			t.Errorf("a caller not bound to marina-metrics-reader: HTTP %d, want 403", code)
		}
		testenv.Eventually(t, 30*time.Second, "marina's metrics", func() error {
			code, body := scrape(t, url, reader)
			if code != http.StatusOK {
				return fmt.Errorf("HTTP %d: %s", code, body)
			}
			for _, want := range []string{`marina_machines{namespace="default",phase=`, "controller_runtime_reconcile_total{controller=\"machine\""} {
				if !strings.Contains(body, want) {
					return fmt.Errorf("no %s in the metrics", want)
				}
			}
			return nil
		})
	})
}

// resourceVersions of the installed objects, by kind/namespace/name.
func resourceVersions(t *testing.T, ctx context.Context, env *testenv.Env, objs []*unstructured.Unstructured) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, obj := range objs {
		have := &unstructured.Unstructured{}
		have.SetGroupVersionKind(obj.GroupVersionKind())
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.GetName()}, have); err != nil {
			t.Fatal(err)
		}
		out[obj.GetKind()+"/"+obj.GetNamespace()+"/"+obj.GetName()] = have.GetResourceVersion()
	}
	return out
}

// tokenKubeconfig writes a kubeconfig that acts as the service account.
func tokenKubeconfig(t *testing.T, ctx context.Context, cs kubernetes.Interface, adminKubeconfig []byte, namespace, name, dir string) string {
	t.Helper()
	admin, err := clientcmd.Load(adminKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	var cluster *clientcmdapi.Cluster
	for _, c := range admin.Clusters {
		cluster = c
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = cluster
	cfg.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: token(t, ctx, cs, namespace, name)}
	cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "sa"}
	cfg.CurrentContext = "c"
	path := filepath.Join(dir, name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func token(t *testing.T, ctx context.Context, cs kubernetes.Interface, namespace, name string) string {
	t.Helper()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	res, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for service account %s/%s: %v", namespace, name, err)
	}
	return res.Status.Token
}

// serviceAccountToken makes a service account, bound to clusterRole unless
// it is empty, and returns a token of it.
func serviceAccountToken(t *testing.T, ctx context.Context, cs kubernetes.Interface, namespace, name, clusterRole string) string {
	t.Helper()
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if clusterRole != "" {
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: clusterRole},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: namespace, Name: name}},
		}
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return token(t, ctx, cs, namespace, name)
}

// scrape GETs the metrics endpoint with a bearer token (none when empty).
// Its certificate is self-signed by controller-runtime, on loopback.
func scrape(t *testing.T, url, bearer string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	res, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

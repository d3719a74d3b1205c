package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/internal/webhook"
)

// config/default is what `kubectl apply -k` installs into an existing
// cluster for `marina controller`: it must apply cleanly to a real API
// server, and its tenancy policy must hold there (M6).
func TestConfigDefault(t *testing.T) {
	t.Parallel()
	env, err := testenv.StartWorkload()
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.Kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	binDir, _ := testenv.BinDir()
	kubectl := func(stdin string, args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(binDir, "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := kubectl("", "apply", "-k", filepath.Join(env.RepoRoot, "config", "default")); err != nil {
		t.Fatalf("kubectl apply -k config/default: %v\n%s", err, out)
	}
	t.Run("installs every part", func(t *testing.T) {
		for _, obj := range [][]string{
			{"crd", "machines.cluster.marina.dev"},
			{"clusterrole", "marina-manager"},
			{"-n", "marina-system", "deployment", "marina-controller"},
			{"-n", "marina-system", "role", "marina-leader-election"},
			{"validatingadmissionpolicy", "marina-tenant-machines"},
			{"validatingwebhookconfiguration", webhook.ConfigurationName},
			{"-n", "marina-system", "service", "marina-webhook"},
		} {
			if out, err := kubectl("", append([]string{"get"}, obj...)...); err != nil {
				t.Errorf("kubectl get %v after apply: %v\n%s", obj, err, out)
			}
		}
	})
	t.Run("the tenancy policy type-checks against every kind it matches", func(t *testing.T) {
		// kube-controller-manager checks a policy's expressions against the
		// schema of each kind it matches (marina init's post-condition reads
		// the result): a field only some kinds have must be read through a
		// variable, or the policy carries a warning.
		testenv.StartControllerManager(t, env, []string{"validatingadmissionpolicy-status-controller"})
		testenv.Eventually(t, 60*time.Second, "the tenancy policy to be type-checked without warnings", func() error {
			policy := &admissionregistrationv1.ValidatingAdmissionPolicy{}
			if err := env.Client.Get(context.Background(), types.NamespacedName{Name: "marina-tenant-machines"}, policy); err != nil {
				return err
			}
			tc := policy.Status.TypeChecking
			switch {
			case tc == nil || policy.Status.ObservedGeneration != policy.Generation:
				return fmt.Errorf("not checked yet")
			case len(tc.ExpressionWarnings) > 0:
				t.Fatalf("type-checking warnings: %+v", tc.ExpressionWarnings)
			}
			return nil
		})
	})
	t.Run("the controller manages its webhook's certificate", func(t *testing.T) {
		testWebhookCert(t, env)
	})
	t.Run("tenants make machines from classes only", func(t *testing.T) {
		// No controller runs here to serve the webhook, and its Service's
		// address is not one this test may send to: the tenancy policy is
		// checked on its own (internal/webhook tests the webhook, failing
		// closed included).
		if out, err := kubectl("", "delete", "validatingwebhookconfiguration", webhook.ConfigurationName); err != nil {
			t.Fatalf("removing the webhook: %v\n%s", err, out)
		}
		testTenancy(t, kubectl)
	})
}

// testTenancy: a tenant (not in marina:admins) makes machines from
// published classes only, and workers only; an administrator may do either.
func testTenancy(t *testing.T, kubectl func(stdin string, args ...string) (string, error)) {
	// Tenants may create machines at all (RBAC); the policy decides which.
	if out, err := kubectl(tenantSetup, "apply", "-f", "-"); err != nil {
		t.Fatalf("setting up the tenant: %v\n%s", err, out)
	}

	classless := machineYAML("classless", "Worker", `providerSpec: {apiVersion: local.marina.dev/v1alpha1, kind: LocalMachine, spec: {cpu: 2, memory: 4Gi}}`)
	controlPlane := machineYAML("master", "ControlPlane", `classRef: {name: small}`)
	fromClass := machineYAML("from-class", "Worker", `classRef: {name: small}`)
	tenant := []string{"--as=alice", "--as-group=tenants", "create", "-f", "-"}

	// The policy takes effect asynchronously after it is created.
	testenv.Eventually(t, 30*time.Second, "a tenant's class-less machine to be refused", func() error {
		out, err := kubectl(classless, tenant...)
		if err == nil {
			_, _ = kubectl("", "delete", "machine", "classless")
			return fmt.Errorf("accepted: %s", out)
		}
		if !strings.Contains(out, "only marina administrators may describe a machine without a MachineClass") {
			return fmt.Errorf("refused for another reason: %s", out)
		}
		return nil
	})
	if out, err := kubectl(controlPlane, tenant...); err == nil || !strings.Contains(out, "only marina administrators may create control-plane machines") {
		t.Errorf("a tenant's control-plane machine: err %v\n%s", err, out)
	}
	if out, err := kubectl(fromClass, tenant...); err != nil {
		t.Errorf("a tenant's machine from a class was refused: %v\n%s", err, out)
	}
	if out, err := kubectl(classless, "--as=bob", "--as-group=marina:admins", "create", "-f", "-"); err != nil {
		t.Errorf("an administrator's class-less machine was refused: %v\n%s", err, out)
	}
	// Issue 24: only marina's own service account is exempt, not every
	// workload that runs in marina-system.
	intruder := machineYAML("intruder", "Worker", `providerSpec: {apiVersion: local.marina.dev/v1alpha1, kind: LocalMachine, spec: {cpu: 2, memory: 4Gi}}`)
	if out, err := kubectl(intruder, "--as=system:serviceaccount:marina-system:other", "--as-group=tenants", "create", "-f", "-"); err == nil ||
		!strings.Contains(out, "only marina administrators may describe a machine without a MachineClass") {
		t.Errorf("another service account of marina-system made a class-less machine: err %v\n%s", err, out)
	}
	// Issue 24: a tenant's control plane comes from a class, as its
	// machines do.
	classless = clusterYAML("classless", `providerSpec: {apiVersion: local.marina.dev/v1alpha1, kind: LocalMachine, spec: {cpu: 2, memory: 4Gi}}`)
	if out, err := kubectl(classless, tenant...); err == nil || !strings.Contains(out, "only marina administrators may describe a control plane without a MachineClass") {
		t.Errorf("a tenant's Cluster without a class: err %v\n%s", err, out)
	}
	if out, err := kubectl(clusterYAML("from-class", `classRef: {name: small}`), tenant...); err != nil {
		t.Errorf("a tenant's Cluster from a class was refused: %v\n%s", err, out)
	}
	controller := machineYAML("by-controller", "Worker", `providerSpec: {apiVersion: local.marina.dev/v1alpha1, kind: LocalMachine, spec: {cpu: 2, memory: 4Gi}}`)
	if out, err := kubectl(controller, "--as=system:serviceaccount:marina-system:marina-controller", "--as-group=tenants", "create", "-f", "-"); err != nil {
		t.Errorf("marina's controller was refused a class-less machine: %v\n%s", err, out)
	}
}

const tenantSetup = `
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: tenant-machines}
rules:
- apiGroups: [cluster.marina.dev]
  resources: [machines, clusters]
  verbs: [create, get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: tenant-machines}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: tenant-machines}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: tenants}
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: "marina:admins"}
---
apiVersion: cluster.marina.dev/v1alpha1
kind: MachineClass
metadata: {name: small}
spec:
  providerSpec: {apiVersion: local.marina.dev/v1alpha1, kind: LocalMachine, spec: {cpu: 2, memory: 4Gi}}
`

func machineYAML(name, role, provider string) string {
	versions := "{kubelet: v1.37.2}"
	if role == "ControlPlane" {
		versions = "{kubelet: v1.37.2, controlPlane: v1.37.2}"
	}
	return fmt.Sprintf(`apiVersion: cluster.marina.dev/v1alpha1
kind: Machine
metadata: {name: %s, namespace: default}
spec:
  clusterName: c1
  roles: [%s]
  versions: %s
  %s
`, name, role, versions, provider)
}

func clusterYAML(name, provider string) string {
	return fmt.Sprintf(`apiVersion: cluster.marina.dev/v1alpha1
kind: Cluster
metadata: {name: %s, namespace: default}
spec:
  controlPlane:
    version: v1.37.2
    %s
`, name, provider)
}

// testWebhookCert: `marina controller` gives its webhook a certificate of
// its own, shared by replicas through one Secret, and makes the API server
// trust it; running it again changes nothing.
func testWebhookCert(t *testing.T, env *testenv.Env) {
	ctx := context.Background()
	opts := webhook.CertOptions{Namespace: "marina-system", Service: "marina-webhook", SecretName: "marina-webhook-tls", Dir: t.TempDir()}
	if err := webhook.EnsureServingCert(ctx, env.Client, opts, time.Now()); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{}
	if err := env.Client.Get(ctx, types.NamespacedName{Namespace: opts.Namespace, Name: opts.SecretName}, secret); err != nil {
		t.Fatal(err)
	}
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := env.Client.Get(ctx, types.NamespacedName{Name: webhook.ConfigurationName}, cfg); err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(secret.Data["ca.crt"]) {
		t.Fatal("the Secret's ca.crt holds no certificate")
	}
	for _, w := range cfg.Webhooks {
		if !bytes.Equal(w.ClientConfig.CABundle, secret.Data["ca.crt"]) {
			t.Errorf("webhook %s does not trust the Secret's CA", w.Name)
		}
		if s := w.ClientConfig.Service; s == nil || s.Namespace != opts.Namespace || s.Name != opts.Service {
			t.Errorf("webhook %s is not sent to Service %s/%s: %+v", w.Name, opts.Namespace, opts.Service, s)
		}
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(opts.Dir, "tls.crt"), filepath.Join(opts.Dir, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "marina-webhook.marina-system.svc"}); err != nil {
		t.Errorf("the serving certificate does not verify for the Service's name: %v", err)
	}
	if st, err := os.Stat(filepath.Join(opts.Dir, "tls.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("tls.key: mode %v, err %v; want 0600", st.Mode().Perm(), err)
	}
	version := secret.ResourceVersion
	if err := webhook.EnsureServingCert(ctx, env.Client, opts, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, types.NamespacedName{Namespace: opts.Namespace, Name: opts.SecretName}, secret); err != nil {
		t.Fatal(err)
	}
	if secret.ResourceVersion != version {
		t.Error("a second run rewrote a certificate that was still good")
	}
}

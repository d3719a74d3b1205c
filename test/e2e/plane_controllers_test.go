package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"marina.dev/marina/internal/testenv"
)

// The management plane's kube-controller-manager does what a user of any
// Kubernetes cluster relies on: deleting an owner deletes its dependents,
// in the background or in the foreground; a deleted namespace goes away with
// everything in it; service accounts get their token Secrets filled. Every
// cascade marina relies on (a deployment's sets and machines, a cluster's
// Secrets) needs the first. envtest runs no controller manager, so only
// marina up can show it.
func TestUpCascadesDeletesNamespacesAndTokens(t *testing.T) {
	t.Parallel()
	stateDir := t.TempDir()
	u := startUp(t, stateDir)
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(stateDir, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cascade"}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cms := cs.CoreV1().ConfigMaps(ns.Name)

	// ownerAndDependent makes a ConfigMap owned by another.
	ownerAndDependent := func(t *testing.T, name string) (owner, dependent *corev1.ConfigMap) {
		t.Helper()
		owner, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name + "-owner"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		dependent, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name:            name + "-dependent",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return owner, dependent
	}
	gone := func(t *testing.T, what string, get func() error) {
		t.Helper()
		testenv.Eventually(t, time.Minute, what+" is deleted", func() error {
			if err := get(); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (get: %v)", err)
			}
			return nil
		})
	}
	getCM := func(name string) func() error {
		return func() error { _, err := cms.Get(ctx, name, metav1.GetOptions{}); return err }
	}

	t.Run("background deletion removes dependents", func(t *testing.T) {
		owner, dependent := ownerAndDependent(t, "background")
		policy := metav1.DeletePropagationBackground
		if err := cms.Delete(ctx, owner.Name, metav1.DeleteOptions{PropagationPolicy: &policy}); err != nil {
			t.Fatal(err)
		}
		gone(t, "the dependent ConfigMap", getCM(dependent.Name))
	})
	t.Run("foreground deletion removes dependents before the owner", func(t *testing.T) {
		owner, dependent := ownerAndDependent(t, "foreground")
		policy := metav1.DeletePropagationForeground
		if err := cms.Delete(ctx, owner.Name, metav1.DeleteOptions{PropagationPolicy: &policy}); err != nil {
			t.Fatal(err)
		}
		gone(t, "the owner ConfigMap", getCM(owner.Name))
		if err := getCM(dependent.Name)(); !apierrors.IsNotFound(err) {
			t.Errorf("the owner is gone but its dependent is not (get: %v)", err)
		}
	})
	t.Run("service accounts get tokens", func(t *testing.T) {
		testenv.Eventually(t, time.Minute, "the namespace's default ServiceAccount exists", func() error {
			_, err := cs.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
			return err
		})
		if _, err := cs.CoreV1().ServiceAccounts(ns.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "robot"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		secret, err := cs.CoreV1().Secrets(ns.Name).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "robot-token", Annotations: map[string]string{corev1.ServiceAccountNameKey: "robot"}},
			Type:       corev1.SecretTypeServiceAccountToken,
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, time.Minute, "the token controller fills the Secret", func() error {
			s, err := cs.CoreV1().Secrets(ns.Name).Get(ctx, secret.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(s.Data[corev1.ServiceAccountTokenKey]) == 0 || len(s.Data[corev1.ServiceAccountRootCAKey]) == 0 {
				return fmt.Errorf("no token or ca.crt yet (keys: %d)", len(s.Data))
			}
			return nil
		})
	})
	t.Run("a deleted namespace goes with its contents", func(t *testing.T) {
		if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "left-behind"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := cs.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		gone(t, "namespace "+ns.Name, func() error {
			_, err := cs.CoreV1().Namespaces().Get(ctx, ns.Name, metav1.GetOptions{})
			return err
		})
	})

	t.Run("the admission webhook refuses a machine at apply time", func(t *testing.T) {
		manifest := filepath.Join(t.TempDir(), "machine.yaml")
		if err := os.WriteFile(manifest, []byte(`
apiVersion: cluster.marina.dev/v1alpha1
kind: Machine
metadata: {name: typo, namespace: default}
spec:
  clusterName: prod
  roles: [Worker]
  versions: {kubelet: v1.37.2}
  classRef: {name: no-such-class}
`), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := u.kubectl(t, "apply", "-f", manifest)
		if err == nil || !strings.Contains(out, "spec.classRef.name") || !strings.Contains(out, "no such MachineClass") {
			t.Fatalf("kubectl apply of a machine naming a missing class: want it refused at spec.classRef.name, got %v:\n%s", err, out)
		}
	})

	t.Run("deleting a MachineDeployment deletes its sets and machines", func(t *testing.T) {
		manifest := filepath.Join(t.TempDir(), "fleet.yaml")
		if err := os.WriteFile(manifest, []byte(`
apiVersion: cluster.marina.dev/v1alpha1
kind: Cluster
metadata: {name: fleet, namespace: default, annotations: {cluster.marina.dev/external-control-plane: "true"}}
spec:
  controlPlane:
    version: v1.37.2
    providerSpec: {apiVersion: local.marina.dev/v1alpha1, kind: LocalMachine, spec: {cpu: 2, memory: 2Gi}}
---
apiVersion: cluster.marina.dev/v1alpha1
kind: MachineDeployment
metadata: {name: pool, namespace: default}
spec:
  clusterName: fleet
  replicas: 2
  selector: {matchLabels: {pool: a}}
  template:
    metadata: {labels: {pool: a}}
    spec:
      clusterName: fleet
      roles: [Worker]
      versions: {kubelet: v1.37.2}
      providerSpec: {apiVersion: local.marina.dev/v1alpha1, kind: LocalMachine, spec: {cpu: 2, memory: 2Gi}}
`), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := u.kubectl(t, "apply", "-f", manifest); err != nil {
			t.Fatalf("kubectl apply: %v\n%s", err, out)
		}
		count := func(kind string) (int, error) {
			out, err := u.kubectl(t, "get", kind, "-n", "default", "-l", "pool=a", "-o", "name")
			if err != nil {
				return 0, fmt.Errorf("%v: %s", err, out)
			}
			return len(strings.Fields(out)), nil
		}
		testenv.Eventually(t, time.Minute, "the deployment's 2 machines exist", func() error {
			if n, err := count("machines"); err != nil || n != 2 {
				return fmt.Errorf("%d machines (%v)", n, err)
			}
			return nil
		})
		if out, err := u.kubectl(t, "delete", "machinedeployment", "pool", "-n", "default"); err != nil {
			t.Fatalf("kubectl delete: %v\n%s", err, out)
		}
		testenv.Eventually(t, time.Minute, "the deployment's sets and machines are deleted", func() error {
			for _, kind := range []string{"machinesets", "machines"} {
				if n, err := count(kind); err != nil || n != 0 {
					return fmt.Errorf("%d %s left (%v)", n, kind, err)
				}
			}
			return nil
		})
	})

	// Nothing the plane's controllers tried was denied.
	log, err := os.ReadFile(filepath.Join(u.stateDir, "logs", "kube-controller-manager.log"))
	if err != nil {
		t.Fatal(err)
	}
	var denied []string
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "forbidden") || strings.Contains(line, "cannot ") {
			denied = append(denied, line)
		}
	}
	if len(denied) > 0 {
		t.Errorf("kube-controller-manager was denied %d times; the first:\n%s", len(denied), denied[0])
	}
}

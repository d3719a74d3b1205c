package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/remote"
)

// marina kubeconfig prints the cluster's admin kubeconfig from its Secret in
// the context's namespace, or writes it with mode 0600.
func TestKubeconfigCommand(t *testing.T) {
	env := managementPlane(t)
	isolate(t)
	ns := env.Namespace(t)
	path := writeKubeconfig(t, envKubeconfig(t, env, ns))
	const data = "apiVersion: v1\nkind: Config\n"
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: remote.KubeconfigSecretName("dev"), Namespace: ns},
		Data:       map[string][]byte{remote.KubeconfigSecretKey: []byte(data)},
	}
	if err := env.Client.Create(context.Background(), secret); err != nil {
		t.Fatal(err)
	}
	if out, _, err := marina(t, "kubeconfig", "dev", "--kubeconfig", path); err != nil || out != data {
		t.Errorf("marina kubeconfig dev: %q, %v; want the Secret's kubeconfig", out, err)
	}
	file := filepath.Join(t.TempDir(), "sub", "dev.kubeconfig")
	_, errOut, err := marina(t, "kubeconfig", "dev", "--output-file", file, "--kubeconfig", path)
	if err != nil || !strings.Contains(errOut, "Wrote the admin kubeconfig of dev to "+file+" (mode 0600)") {
		t.Fatalf("marina kubeconfig --output-file: %v\n%s", err, errOut)
	}
	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v, mode %v; want mode 0600", file, err, st.Mode().Perm())
	}
	if got, _ := os.ReadFile(file); string(got) != data {
		t.Errorf("%s holds %q, want the Secret's kubeconfig", file, got)
	}
	if _, _, err := marina(t, "kubeconfig", "nothing", "--kubeconfig", path); err == nil || !strings.Contains(err.Error(), "marina describe cluster nothing") {
		t.Errorf("marina kubeconfig of a cluster without a Secret: %v; want a hint", err)
	}
}

// marina delete cluster deletes the cluster of the context's namespace;
// with --wait it follows it until it is gone.
func TestDeleteCluster(t *testing.T) {
	env := managementPlane(t)
	isolate(t)
	ns := env.Namespace(t)
	path := writeKubeconfig(t, envKubeconfig(t, env, ns))
	ctx := context.Background()
	for _, name := range []string{"one", "two"} {
		createCluster(t, env, ns, name)
	}
	// No controller runs here: the Clusters have no finalizer and go at once.
	out, _, err := marina(t, "delete", "cluster", "one", "--kubeconfig", path)
	if err != nil || out != "deleting cluster "+ns+"/one with its 0 machines\n" {
		t.Errorf("marina delete cluster one: %q, %v", out, err)
	}
	out, _, err = marina(t, "delete", "cluster", "two", "--wait", "--kubeconfig", path)
	if err != nil || !strings.Contains(out, "✓ cluster gone") || !strings.Contains(out, "done in") {
		t.Errorf("marina delete cluster two --wait: %v\n%s", err, out)
	}
	for _, name := range []string{"one", "two"} {
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &clusterv1.Cluster{}); !apierrors.IsNotFound(err) {
			t.Errorf("cluster %s still there: %v", name, err)
		}
	}
	if _, _, err := marina(t, "delete", "cluster", "two", "--kubeconfig", path); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("deleting a cluster that is gone: %v", err)
	}
}

// marina move needs the target's kubeconfig, and refuses one that reaches
// the source or cannot be read, before it touches anything.
func TestMoveFlags(t *testing.T) {
	env := managementPlane(t)
	isolate(t)
	ns := env.Namespace(t)
	path := writeKubeconfig(t, envKubeconfig(t, env, ns))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{args: []string{"move", "--kubeconfig", path}, want: `"to-kubeconfig" not set`},
		{args: []string{"move", "--kubeconfig", path, "--to-kubeconfig", path}, want: "is the source"},
		{args: []string{"move", "--kubeconfig", path, "--to-kubeconfig", filepath.Join(t.TempDir(), "none")}, want: "loading the target's kubeconfig"},
	} {
		if _, _, err := marina(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("marina %v: %v; want an error saying %q", tc.args, err, tc.want)
		}
	}
}

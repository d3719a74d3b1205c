package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/capabilities"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider"
	"marina.dev/marina/provider/local"
)

// upgrade plan asks the controller which versions it can run (what it
// published), not the bin directory beside the CLI; without a controller
// it says so.
func TestUpgradePlanAsksTheController(t *testing.T) {
	env := managementPlane(t)
	isolate(t)
	ns := env.Namespace(t)
	path := writeKubeconfig(t, envKubeconfig(t, env, ns))
	ctx := context.Background()
	clusterAt(t, env, ns, "dev", "v1.36.3")
	plan := func(to string) (string, error) {
		out, _, err := marina(t, "upgrade", "plan", "dev", "--to", to, "--kubeconfig", path)
		return out, err
	}

	// No controller has published anything.
	unpublish(t, env)
	if out, err := plan("v1.37.2"); err == nil || !strings.Contains(err.Error(), "no marina controller has published which Kubernetes versions it can run") ||
		!strings.Contains(err.Error(), "is it running?") {
		t.Errorf("plan without a controller: got %v, want it to say no controller published its versions\n%s", err, out)
	}

	// A controller whose local provider has v1.36.3 only.
	binDir := t.TempDir()
	buildRelease(t, binDir, "v1.36.3")
	prov, err := local.New(local.Options{Root: t.TempDir(), AgentCommand: []string{"/bin/false"}, BinDir: binDir})
	if err != nil {
		t.Fatal(err)
	}
	registry, err := provider.NewRegistry(prov)
	if err != nil {
		t.Fatal(err)
	}
	publisher := capabilities.NewPublisher(env.Client, registry, 0, testr.New(t))
	if err := publisher.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unpublish(t, env) })
	out, err := plan("v1.37.2")
	if err == nil || !strings.Contains(err.Error(), "cluster dev cannot be upgraded to v1.37.2: the controller's provider local cannot run it; it can run v1.36.3") {
		t.Errorf("plan to a version the controller lacks: got %v, want it refused naming what the controller can run\n%s", err, out)
	}
	// The version rules come first: a skipped minor is named as such.
	if out, err := plan("v1.38.0"); err == nil || !strings.Contains(err.Error(), "skips a minor version") {
		t.Errorf("plan skipping a minor version: got %v, want the skew refusal\n%s", err, out)
	}

	// The controller's host gets v1.37.2.
	buildRelease(t, binDir, "v1.37.2")
	if err := publisher.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	out, err = plan("v1.37.2")
	if err != nil || !strings.Contains(out, "from v1.36.3 to v1.37.2") {
		t.Errorf("plan to a version the controller has: %v\n%s", err, out)
	}

	// A control plane of a kind no provider of the controller runs.
	other := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: ns},
		Spec: clusterv1.ClusterSpec{ControlPlane: clusterv1.ControlPlaneSpec{Version: "v1.36.3", Replicas: 1,
			ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"ssh.example.dev/v1","kind":"SSHMachine"}`)}}},
	}
	if err := env.Client.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	_, _, err = marina(t, "upgrade", "plan", "other", "--to", "v1.37.2", "--kubeconfig", path)
	if err == nil || !strings.Contains(err.Error(), `no provider in the marina controller runs the control plane's providerSpec kind "ssh.example.dev/v1/SSHMachine"; it runs local (local.marina.dev/v1alpha1/LocalMachine)`) {
		t.Errorf("plan of a control plane no provider of the controller runs: got %v", err)
	}
}

// clusterAt makes a cluster of one control-plane machine whose API server
// reports version, as if it ran.
func clusterAt(t *testing.T, env *testenv.Env, ns, name, version string) {
	t.Helper()
	ctx := context.Background()
	spec := &runtime.RawExtension{Raw: []byte(defaultLocalMachine)}
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: clusterv1.ClusterSpec{ControlPlane: clusterv1.ControlPlaneSpec{
			Version: clusterv1.KubernetesVersion(version), Replicas: 1, ProviderSpec: spec,
		}},
	}
	if err := env.Client.Create(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	v := clusterv1.KubernetesVersion(version)
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-cp-0", Namespace: ns, Labels: map[string]string{
			clusterv1.ClusterNameLabel: name, clusterv1.ControlPlaneLabel: "",
		}},
		Spec: clusterv1.MachineSpec{
			ClusterName: name, Roles: []clusterv1.MachineRole{clusterv1.ControlPlaneRole},
			Versions:     clusterv1.MachineVersions{Kubelet: v, ControlPlane: v},
			ProviderSpec: spec,
		},
	}
	if err := controllerutil.SetControllerReference(cluster, m, env.Client.Scheme()); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	m.Status.Versions = clusterv1.MachineObservedVersions{Kubelet: version, ControlPlane: &clusterv1.ComponentVersions{
		APIServer: version, ControllerManager: version, Scheduler: version, Etcd: "v3.6.16",
	}}
	if err := env.Client.Status().Update(ctx, m); err != nil {
		t.Fatal(err)
	}
}

// unpublish deletes what a controller published, making marina's
// namespace if it is missing.
func unpublish(t *testing.T, env *testenv.Env) {
	t.Helper()
	ctx := context.Background()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: capabilities.Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: capabilities.Namespace, Name: capabilities.Name}}
	if err := env.Client.Delete(ctx, cm); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

// buildRelease puts a release's kube-apiserver in binDir, as make setup does.
func buildRelease(t *testing.T, binDir, version string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(binDir, "kube-apiserver-"+version), nil, 0o755); err != nil {
		t.Fatal(err)
	}
}

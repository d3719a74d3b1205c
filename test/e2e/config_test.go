package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"marina.dev/marina/internal/testenv"
)

// config/default is what `kubectl apply -k` installs into an existing
// cluster for `marina controller`: it must apply cleanly to a real API server.
func TestConfigDefaultApplies(t *testing.T) {
	env, err := testenv.StartWorkload()
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.Kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	binDir, _ := testenv.BinDir()
	cmd := exec.Command(filepath.Join(binDir, "kubectl"), "--kubeconfig", kubeconfig, "apply", "-k", filepath.Join(env.RepoRoot, "config", "default"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply -k config/default: %v\n%s", err, out)
	}
	for _, obj := range [][]string{
		{"crd", "machines.cluster.marina.dev"},
		{"clusterrole", "marina-manager"},
		{"-n", "marina-system", "deployment", "marina-controller"},
		{"-n", "marina-system", "role", "marina-leader-election"},
	} {
		args := append([]string{"--kubeconfig", kubeconfig, "get"}, obj...)
		if out, err := exec.Command(filepath.Join(binDir, "kubectl"), args...).CombinedOutput(); err != nil {
			t.Errorf("kubectl get %v after apply: %v\n%s", obj, err, out)
		}
	}
}

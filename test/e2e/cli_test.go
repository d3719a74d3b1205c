package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"marina.dev/marina/internal/testenv"
)

// marina create cluster --wait on a terminal (a pseudo-terminal that
// script(1) gives it) shows a line per stage as it ends, redraws the stage
// under way in place, and exits 0 once the cluster is Ready; marina delete
// cluster --wait in a pipe shows the machines going and exits 0 once all
// is gone.
func TestCreateAndDeleteClusterWithProgress(t *testing.T) {
	t.Parallel()
	u, root, _ := startUpWithClient(t)
	kubeconfig := filepath.Join(u.stateDir, "admin.kubeconfig")
	create := fmt.Sprintf("%s create cluster dev --control-planes 1 --workers 2 --wait --timeout 5m --kubeconfig %s", marinaBin, kubeconfig)
	start := time.Now()
	out, err := exec.Command("script", "-qfec", create, "/dev/null").CombinedOutput()
	t.Logf("marina create cluster --wait, %s:\n%s", time.Since(start).Round(time.Second), strings.ReplaceAll(string(out), "\r\x1b[K", "\n[redraw] "))
	if err != nil {
		t.Fatalf("marina create cluster --wait: %v", err)
	}
	for _, want := range []string{"created Cluster/dev", "created MachineDeployment/dev-workers", "✓ certificates", "✓ first control-plane machine",
		"✓ control-plane machines ready 1/1", "✓ workers joined 2/2", "✓ cluster Ready", "done in"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the progress does not show %q", want)
		}
	}
	if !strings.Contains(string(out), "\r\x1b[K") {
		t.Errorf("on a terminal, the stage under way is not redrawn in place")
	}

	out, err = exec.Command(marinaBin, "delete", "cluster", "dev", "--wait", "--kubeconfig", kubeconfig).CombinedOutput()
	t.Logf("marina delete cluster --wait:\n%s", out)
	if err != nil {
		t.Fatalf("marina delete cluster --wait: %v", err)
	}
	for _, want := range []string{"✓ machines deleted 3/3", "✓ cluster gone", "done in"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the deletion's progress does not show %q", want)
		}
	}
	if strings.Contains(string(out), "\x1b[") {
		t.Errorf("escape codes in piped output")
	}
	testenv.Eventually(t, time.Minute, "nothing left", func() error {
		if left := leftovers(t, root); len(left) > 0 {
			return fmt.Errorf("left on disk: %v", left)
		}
		return nil
	})

	// A cluster that cannot be made ends --wait at once with the reason.
	out, err = exec.Command(marinaBin, "create", "cluster", "old", "--version", "v1.30.0", "--workers", "0", "--wait", "--timeout", "1m", "--kubeconfig", kubeconfig).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "v1.30.0") {
		t.Errorf("creating a cluster at a version not built: %v\n%s", err, out)
	}
	u.stopAndCheckNoLeftovers(t, syscall.SIGTERM)
}

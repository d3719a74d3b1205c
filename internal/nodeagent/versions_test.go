package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/desiredversions"
	"marina.dev/marina/internal/nodeagent/sandbox"
)

// An in-place upgrade reaches a running machine through its own Node, not
// through a file the management host writes into the sandbox (issue 26):
// the agent applies a change of the Node's desired-versions annotation,
// records it in the sandbox before acting, and a restarted agent keeps it
// even when the annotation is gone (a re-created Node): an absent
// annotation changes nothing. Before, the agent read only the sandbox's
// versions file, and the Node's kubelet version never moved.
func TestAgentAppliesTheDesiredVersionsOfItsNode(t *testing.T) {
	ctx := t.Context()
	cs := adminClient(t)
	token := joinToken(t, cs)
	node := "desired-" + rand.String(6)
	dir, b := bootstrapDir(t, node, token)
	start := func() (stop func()) {
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- run(runCtx, dir, fast) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent: %v", err)
			}
		}
	}
	kubeletIs := func(want string) {
		t.Helper()
		eventually(t, 30*time.Second, "node reports kubelet "+want, func() error {
			n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got := n.Status.NodeInfo.KubeletVersion; got != want {
				return fmt.Errorf("kubeletVersion is %q", got)
			}
			return nil
		})
	}
	setAnnotation := func(value *string) {
		t.Helper()
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]*string{clusterv1.DesiredVersionsAnnotation: value}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	stop := start()
	kubeletIs(b.KubeletVersion)
	if _, err := os.Stat(filepath.Join(dir, sandbox.DesiredVersionsFile)); !os.IsNotExist(err) {
		t.Fatalf("the sandbox holds desired versions before any were asked for: %v", err)
	}

	raw, err := desiredversions.Encode(desiredversions.Versions{Kubelet: "v1.38.0"})
	if err != nil {
		t.Fatal(err)
	}
	setAnnotation(&raw)
	kubeletIs("v1.38.0")
	if v, err := sandbox.ReadVersions(dir); err != nil || v.Kubelet != "v1.38.0" {
		t.Errorf("the sandbox records %+v (%v), want kubelet v1.38.0", v, err)
	}

	// Not marina's writing: ignored, what runs keeps running.
	bad := "{not json"
	setAnnotation(&bad)
	stop()

	// The Node loses the annotation while the agent is down.
	setAnnotation(nil)
	stop = start()
	defer stop()
	// The restarted agent reports what it applied, from its record.
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rv := n.ResourceVersion
	eventually(t, 30*time.Second, "the restarted agent posts its status", func() error {
		n, err = cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c := nodeCondition(n, corev1.NodeReady); n.ResourceVersion == rv || c == nil || c.Status != corev1.ConditionTrue {
			return fmt.Errorf("no status posted since the restart")
		}
		return nil
	})
	kubeletIs("v1.38.0")
}

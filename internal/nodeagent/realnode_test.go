package nodeagent

import (
	"path/filepath"
	"strings"
	"testing"

	"marina.dev/marina/internal/nodeagent/sandbox"
)

// unixPathMax is the longest path a unix socket may have on Linux
// (sun_path is 108 bytes with its terminating NUL).
const unixPathMax = 107

// TestRealNodeSocketsFitUnderALongSandbox: a real node's sandbox is below
// the state directory, which may be long (every test's is), yet the
// kubelet and containerd listen on unix sockets; a path over 107 bytes
// fails the bind and the kubelet exits, so the machine never becomes a
// Node (issue 32).
func TestRealNodeSocketsFitUnderALongSandbox(t *testing.T) {
	dir := "/tmp/" + strings.Repeat("a-long-state-directory/", 8) + "machines/0b0b3c5e-8c4e-4a59-9f39-5d2f1c3a7b11"
	n := &realNode{dir: dir, boot: &sandbox.Bootstrap{
		NodeName: "w-0",
		BinDir:   "/bin",
		// As the local provider names it: /run/marina/<hash of the UID>.
		Real: &sandbox.RealNode{RuntimeDir: "/run/marina/0123456789", ContainerdVersion: "2.3.7"},
	}}

	var root string
	for _, a := range n.kubeletManifest("v1.37.2", "/bin/kubelet").Args {
		if v, ok := strings.CutPrefix(a, "--root-dir="); ok {
			root = v
		}
	}
	if root == "" {
		t.Fatal("the kubelet's manifest has no --root-dir")
	}
	// The kubelet's sockets below its root, each made as a temporary name
	// of up to 10 digits first (k8s.io/cri-client's CreateListener), and
	// containerd's.
	sockets := []string{n.socket(), n.socket() + ".ttrpc"}
	for _, d := range []string{"pod-resources", "pods-api", "device-plugins", "plugins_registry"} {
		sockets = append(sockets, filepath.Join(root, d, "4294967295"), filepath.Join(root, d, "kubelet.sock"))
	}
	for _, s := range sockets {
		if len(s) > unixPathMax {
			t.Errorf("socket %s is %d bytes, more than a unix socket's %d", s, len(s), unixPathMax)
		}
	}
}

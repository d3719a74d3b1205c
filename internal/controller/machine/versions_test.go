package machine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/nodeagent"
	"marina.dev/marina/internal/nodeagent/sandbox"
)

// An in-place version change (M12) reaches a running machine through its
// own Node (issue 26): the controller stages the versions with the
// provider, then writes them in the Node's desired-versions annotation,
// which the machine's agent applies and reports. A controller killed
// between staging and the annotation converges when the next one starts.
// Before, the provider wrote a versions file into the sandbox and the Node
// never carried the versions.
func TestVersionChangeReachesTheMachineThroughItsNode(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	stop := f.startController(Options{})
	m := f.create(f.machine("inplace", ""))
	got := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
	desired := func(kubelet string) string {
		raw, err := nodeagent.EncodeDesiredVersions(sandbox.Versions{Kubelet: kubelet})
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	eventually(t, 30*time.Second, "the Node to carry the versions the machine runs", func() (bool, error) {
		n, err := f.node(got.Status.NodeRef.Name)
		if err != nil {
			return false, err
		}
		have := n.Annotations[clusterv1.DesiredVersionsAnnotation]
		return have == desired("v1.37.2"), fmt.Errorf("annotation %q", have)
	})
	stop()

	patch := client.MergeFrom(got.DeepCopy())
	got.Spec.Versions.Kubelet = "v1.37.3"
	if err := mgmt.Client.Patch(ctx, got, patch); err != nil {
		t.Fatal(err)
	}
	crashed := make(chan struct{})
	stop = f.startController(Options{crashAt: crashOnce("after-stage-versions", crashed)})
	<-crashed
	stop()
	n, err := f.node(got.Status.NodeRef.Name)
	if err != nil {
		t.Fatal(err)
	}
	if have := n.Annotations[clusterv1.DesiredVersionsAnnotation]; have != desired("v1.37.2") {
		t.Fatalf("the Node's desired versions changed before the controller got past staging: %q", have)
	}

	f.startController(Options{})
	eventually(t, 30*time.Second, "the new kubelet version asked for on the Node, run and reported", func() (bool, error) {
		n, err := f.node(got.Status.NodeRef.Name)
		if err != nil {
			return false, err
		}
		m, err := f.get(got)
		if err != nil {
			return false, err
		}
		return n.Annotations[clusterv1.DesiredVersionsAnnotation] == desired("v1.37.3") && n.Status.NodeInfo.KubeletVersion == "v1.37.3" &&
				m.Status.Versions.Kubelet == "v1.37.3",
			fmt.Errorf("annotation %q, node kubelet %q, machine status kubelet %q",
				n.Annotations[clusterv1.DesiredVersionsAnnotation], n.Status.NodeInfo.KubeletVersion, m.Status.Versions.Kubelet)
	})
	// The management host wrote nothing into the sandbox: the versions
	// file of before issue 26 does not exist.
	if _, err := os.Stat(filepath.Join(f.sandboxes, string(got.UID), "versions.json")); !os.IsNotExist(err) {
		t.Errorf("the sandbox has a versions file: %v", err)
	}
}

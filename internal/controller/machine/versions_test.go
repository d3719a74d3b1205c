package machine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/desiredversions"
	"marina.dev/marina/provider"
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
		raw, err := desiredversions.Encode(desiredversions.Versions{Kubelet: kubelet})
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

// A version the provider cannot stage (its binaries were not built) is
// said on the machine, and nothing is handed to its Node; one it can
// stage clears it. The local provider refuses only control-plane
// versions, which a worker cannot have, so a stager that refuses stands
// in for it here.
func TestVersionTheProviderCannotStageIsReported(t *testing.T) {
	m := versionedMachine()
	r := &Reconciler{}
	refuse := &stager{err: &provider.InvalidSpecError{Message: "kube-apiserver-v1.99.0 was not built here"}}
	desired, err := r.stageVersions(context.Background(), m, refuse)
	if !provider.IsInvalidSpec(err) || desired != nil {
		t.Fatalf("stageVersions = %v, %v; want no versions for the Node and the invalid spec", desired, err)
	}
	c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineUpToDateCondition)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != clusterv1.MachineVersionsUnavailableReason || !strings.Contains(c.Message, "kube-apiserver-v1.99.0") {
		t.Errorf("condition %+v, want UpToDate=False, %s, naming the binary", c, clusterv1.MachineVersionsUnavailableReason)
	}
	desired, err = r.stageVersions(context.Background(), m, &stager{})
	if err != nil || desired == nil || desired.Kubelet != "v1.37.2" {
		t.Fatalf("stageVersions = %+v, %v; want the spec's versions", desired, err)
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineUpToDateCondition); c != nil {
		t.Errorf("condition %+v left after the versions could be staged", c)
	}
}

func versionedMachine() *clusterv1.Machine {
	return &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: "ns", UID: "u"},
		Spec:       clusterv1.MachineSpec{Versions: clusterv1.MachineVersions{Kubelet: "v1.37.2"}},
	}
}

// stager is a provider that only stages, returning err.
type stager struct {
	provider.Provider
	err error
}

func (s *stager) Name() string { return "stager" }

func (s *stager) StageVersions(context.Context, types.UID, provider.Versions) error { return s.err }

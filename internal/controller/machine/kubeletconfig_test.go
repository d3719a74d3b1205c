package machine

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/kubeletconfig"
)

// M16: a machine names its kubelet configuration by reference. Until the
// ConfigMap exists (or while it holds no KubeletConfiguration) the machine
// is not made and a condition says what to fix; then its kubelet runs it
// (maxPods shows in the Node's capacity) and its status reports which.
func TestKubeletConfigByReference(t *testing.T) {
	f := newFixture(t)
	f.startController(Options{})
	ctx := context.Background()

	m := f.machine("kc", "")
	m.Spec.KubeletConfigRef = &clusterv1.KubeletConfigReference{Name: "kubelet-v2"}
	f.create(m)
	waitProvisionedReason(t, f, m, "does not exist")

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "kubelet-v2"},
		Data: map[string]string{kubeletconfig.Key: "apiVersion: v1\nkind: Pod\n"}}
	if err := mgmt.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	waitProvisionedReason(t, f, m, "want kubelet.config.k8s.io/v1beta1 KubeletConfiguration")
	if f.sandboxCount() != 0 {
		t.Fatalf("a machine with an unusable kubelet configuration was made")
	}

	doc := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 42\n"
	cm.Data[kubeletconfig.Key] = doc
	if err := mgmt.Client.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
	want, _ := kubeletconfig.Parse("kubelet-v2", []byte(doc))
	eventually(t, provisionTimeout, "status.kubeletConfig reported", func() (bool, error) {
		got, err := f.get(m)
		return err == nil && got.Status.KubeletConfig != nil && *got.Status.KubeletConfig == clusterv1.KubeletConfigStatus{Name: "kubelet-v2", Hash: want.Hash()}, err
	})
	got, err := f.get(m)
	if err != nil {
		t.Fatal(err)
	}
	node, err := f.node(got.Status.NodeRef.Name)
	if err != nil {
		t.Fatal(err)
	}
	if pods := node.Status.Capacity[corev1.ResourcePods]; pods.Value() != 42 {
		t.Errorf("the Node's pod capacity is %s, want the configuration's maxPods 42", pods.String())
	}
}

func waitProvisionedReason(t *testing.T, f *fixture, m *clusterv1.Machine, fragment string) {
	t.Helper()
	eventually(t, provisionTimeout, "Provisioned=False saying "+fragment, func() (bool, error) {
		got, err := f.get(m)
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineProvisionedCondition)
		return c != nil && c.Reason == clusterv1.MachineKubeletConfigUnavailableReason && strings.Contains(c.Message, fragment), nil
	})
}

package machine

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/remote"
)

// Issue 24, finding 6: marina caches only the Secrets labelled
// cluster.marina.dev/cluster-name. A kubeconfig Secret a user made for a
// cluster someone else runs, without the label, is not silently "missing":
// the machine says to label it, and runs once it is labelled.
func TestUnlabelledKubeconfigIsReportedUntilLabelled(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	secret := &corev1.Secret{}
	key := types.NamespacedName{Namespace: f.ns, Name: remote.KubeconfigSecretName(f.cluster)}
	if err := mgmt.Client.Get(ctx, key, secret); err != nil {
		t.Fatal(err)
	}
	delete(secret.Labels, clusterv1.ClusterNameLabel)
	if err := mgmt.Client.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	f.startController(Options{})
	m := f.create(f.machine("unlabelled", ""))
	eventually(t, 30*time.Second, "the machine to ask for the label", func() (bool, error) {
		got, err := f.get(m)
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineProvisionedCondition)
		want := fmt.Sprintf("label Secret %s with %s=%s", key, clusterv1.ClusterNameLabel, f.cluster)
		return c != nil && c.Reason == clusterv1.MachineWaitingForControlPlaneReason && strings.Contains(c.Message, want),
			fmt.Errorf("conditions %v", got.Status.Conditions)
	})

	if err := mgmt.Client.Get(ctx, key, secret); err != nil {
		t.Fatal(err)
	}
	secret.Labels = map[string]string{clusterv1.ClusterNameLabel: f.cluster}
	if err := mgmt.Client.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
}

// Issue 36, finding 2: a kubeconfig Secret whose user runs a program is
// not used; the machine names the field, and runs once the Secret holds
// only inline credentials again.
func TestKubeconfigThatRunsAProgramIsRefusedOnTheMachine(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	secret := &corev1.Secret{}
	key := types.NamespacedName{Namespace: f.ns, Name: remote.KubeconfigSecretName(f.cluster)}
	if err := mgmt.Client.Get(ctx, key, secret); err != nil {
		t.Fatal(err)
	}
	inline := secret.Data[remote.KubeconfigSecretKey]
	cfg, err := clientcmd.Load(inline)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range cfg.AuthInfos {
		u.Exec = &clientcmdapi.ExecConfig{APIVersion: "client.authentication.k8s.io/v1", Command: "/bin/true"}
	}
	if secret.Data[remote.KubeconfigSecretKey], err = clientcmd.Write(*cfg); err != nil {
		t.Fatal(err)
	}
	if err := mgmt.Client.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	f.startController(Options{})
	m := f.create(f.machine("refused", ""))
	eventually(t, 30*time.Second, "the machine to refuse the kubeconfig", func() (bool, error) {
		got, err := f.get(m)
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineProvisionedCondition)
		return c != nil && c.Reason == clusterv1.MachineKubeconfigRefusedReason && strings.Contains(c.Message, ".user.exec (runs a program)"),
			fmt.Errorf("conditions %v", got.Status.Conditions)
	})

	if err := mgmt.Client.Get(ctx, key, secret); err != nil {
		t.Fatal(err)
	}
	secret.Data[remote.KubeconfigSecretKey] = inline
	if err := mgmt.Client.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
}

package machinehealthcheck

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/internal/testenv/localenv"
)

// While the workload cluster does not answer, a Failed worker of a set is
// not remediated, and RemediationAllowed says why; once it answers again,
// the worker is deleted. No machine or set controller runs here: the
// machine's status is written by the test, and nothing holds its deletion.
func TestUnreachableClusterRemediatesNothing(t *testing.T) {
	f := suite.NewFixture(t)
	setKubeconfig(t, f, unreachableKubeconfig(t))

	set := f.WorkerSet("pool", 1, map[string]string{"pool": "workers"})
	create(t, set)
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{
			Name: "failed", Namespace: f.NS, Labels: map[string]string{"pool": "workers"},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(set, clusterv1.GroupVersion.WithKind("MachineSet"))},
		},
		Spec: f.WorkerSpec(),
	}
	create(t, m)
	m.Status.Phase = clusterv1.MachinePhaseFailed
	m.Status.FailureReason, m.Status.FailureMessage = "InvalidProviderSpec", "the disk is gone"
	if err := mgmt.Client.Status().Update(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	mhc := newCheck(f, nil)
	create(t, mhc)
	none := newCheck(f, nil)
	none.Name, none.Spec.Selector.MatchLabels = "none", map[string]string{"pool": "nobody"}
	create(t, none)
	startChecks(f, Options{UnreachableRetry: time.Second})

	testenv.Eventually(t, 20*time.Second, "a check selecting nothing to say so", func() error {
		c := condition(getCheck(t, none).Status.Conditions, clusterv1.RemediationAllowedCondition)
		if c == nil || c.Reason != clusterv1.NoMachinesSelectedReason {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})

	testenv.Eventually(t, 30*time.Second, "RemediationAllowed to say the cluster is unreachable", func() error {
		c := condition(getCheck(t, mhc).Status.Conditions, clusterv1.RemediationAllowedCondition)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != clusterv1.RemediationClusterUnreachableReason {
			return fmt.Errorf("condition %+v", c)
		}
		t.Logf("RemediationAllowed: %s", c.Message)
		return nil
	})
	got, err := getMachine(m.Name, f.NS)
	if err != nil || !got.DeletionTimestamp.IsZero() {
		t.Fatalf("the failed machine was remediated while its cluster was unreachable (err %v)", err)
	}
	if st := getCheck(t, mhc).Status; st.ExpectedMachines != 1 || st.RemediationsAllowed != 0 {
		t.Errorf("status %+v: want 1 expected machine and no remediation allowed", st)
	}

	setKubeconfig(t, f, workload.Kubeconfig)
	testenv.Eventually(t, 30*time.Second, "the failed machine to be remediated once the cluster answers", func() error {
		if _, err := getMachine(m.Name, f.NS); err == nil {
			return fmt.Errorf("machine %s still exists", m.Name)
		}
		return hasEvent(t, f.NS, "Remediated", m.Name)
	})
}

// unreachableKubeconfig is the workload cluster's kubeconfig pointed at a
// loopback port nothing listens on.
func unreachableKubeconfig(t *testing.T) []byte {
	t.Helper()
	cfg, err := clientcmd.Load(workload.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	port := testenv.FreePorts(t, 1)
	for _, c := range cfg.Clusters {
		c.Server = "https://127.0.0.1:" + strconv.Itoa(port)
	}
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func setKubeconfig(t *testing.T, f *localenv.Fixture, kubeconfig []byte) {
	t.Helper()
	secret := &corev1.Secret{}
	key := types.NamespacedName{Namespace: f.NS, Name: remote.KubeconfigSecretName(f.Cluster)}
	if err := mgmt.Client.Get(context.Background(), key, secret); err != nil {
		t.Fatal(err)
	}
	secret.Data[remote.KubeconfigSecretKey] = kubeconfig
	if err := mgmt.Client.Update(context.Background(), secret); err != nil {
		t.Fatal(err)
	}
}

package safety

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/controller/machine"
	"marina.dev/marina/internal/pki"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/internal/testenv/localenv"
	"marina.dev/marina/provider"
)

var suite *localenv.Suite

func TestMain(m *testing.M) {
	localenv.Main(m, "marina-safety-", func(s *localenv.Suite) { suite = s })
}

// A machine whose Machine object was removed with its finalizer stripped
// is an orphan: the safety controller removes its sandbox and processes
// after the grace period, and only it.
func TestOrphanSandboxIsRemovedAfterGrace(t *testing.T) {
	f := suite.NewFixture(t)
	registry, err := provider.NewRegistry(f.Provider)
	if err != nil {
		t.Fatal(err)
	}
	grace := 3 * time.Second
	localenv.StartManager(t, suite.Mgmt.Config, f.NS, func(ctx context.Context, mgr ctrl.Manager) error {
		if _, err := machine.SetupWithManager(ctx, mgr, machine.Options{Providers: registry, MaxConcurrentReconciles: 4}); err != nil {
			return err
		}
		return SetupWithManager(mgr, Options{Providers: registry, Period: 200 * time.Millisecond, Grace: grace})
	})
	ctx := context.Background()
	c := suite.Mgmt.Client
	var ms []*clusterv1.Machine
	for _, name := range []string{"kept", "orphan"} {
		m := &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.NS},
			Spec: clusterv1.MachineSpec{
				ClusterName: f.Cluster, Roles: []clusterv1.MachineRole{clusterv1.WorkerRole},
				Versions:     clusterv1.MachineVersions{Kubelet: "v1.37.2"},
				ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi"}}`)},
			},
		}
		if err := c.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	testenv.Eventually(t, time.Minute, "both machines made", func() error {
		uids, err := f.Provider.UIDs()
		if err != nil || len(uids) != 2 {
			return fmt.Errorf("%d sandboxes (%v)", len(uids), err)
		}
		return nil
	})

	// The orphan: its finalizer stripped, its Machine deleted. It is
	// paused first, and its controller seen to know it: a machine
	// controller that reconciled the strip would put the finalizer back
	// and then delete the machine itself on the Delete below (CI saw the
	// sandbox go 209 ms after it), which is not what this test is about.
	orphan := ms[1]
	if err := c.Get(ctx, client.ObjectKeyFromObject(orphan), orphan); err != nil {
		t.Fatal(err)
	}
	before := orphan.DeepCopy()
	metav1.SetMetaDataAnnotation(&orphan.ObjectMeta, clusterv1.PausedAnnotation, "")
	if err := c.Patch(ctx, orphan, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "the orphan's controller sees it paused", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(orphan), orphan); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(orphan.Status.Conditions, clusterv1.PausedCondition) {
			return fmt.Errorf("not Paused yet")
		}
		return nil
	})
	before = orphan.DeepCopy()
	controllerutil.RemoveFinalizer(orphan, clusterv1.MachineFinalizer)
	if err := c.Patch(ctx, orphan, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	pid, err := f.Provider.AgentPID(orphan.UID)
	if err != nil {
		t.Fatalf("the orphan's agent: %v", err)
	}

	testenv.Eventually(t, time.Minute, "the orphan's sandbox removed", func() error {
		uids, err := f.Provider.UIDs()
		if err != nil {
			return err
		}
		for _, uid := range uids {
			if uid == orphan.UID {
				return fmt.Errorf("still there")
			}
		}
		return nil
	})
	if took := time.Since(gone); took < grace {
		t.Errorf("the orphan went after %s, before the grace period of %s", took, grace)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the orphan's agent (pid %d) still runs", pid)
	}
	uids, err := f.Provider.UIDs()
	if err != nil || len(uids) != 1 || uids[0] != ms[0].UID {
		t.Errorf("sandboxes left: %v (%v), want only the kept machine's %s", uids, err, ms[0].UID)
	}
	if _, err := f.Provider.AgentPID(ms[0].UID); err != nil {
		t.Errorf("the kept machine's agent: %v", err)
	}
	// Clean up the kept machine through its controller.
	if err := c.Delete(ctx, ms[0]); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "the kept machine deleted", func() error {
		err := c.Get(ctx, client.ObjectKeyFromObject(ms[0]), &clusterv1.Machine{})
		if err == nil {
			return fmt.Errorf("still there")
		}
		return client.IgnoreNotFound(err)
	})
}

// A control-plane endpoint whose Cluster is gone is removed after the grace
// period; the endpoint of a Cluster that exists stays.
func TestOrphanEndpointIsRemovedAfterGrace(t *testing.T) {
	f := suite.NewFixture(t)
	ctx := context.Background()
	cluster := &clusterv1.Cluster{}
	if err := suite.Mgmt.Client.Get(ctx, client.ObjectKey{Namespace: f.NS, Name: f.Cluster}, cluster); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.NewCA("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	kept := &provider.EndpointRequest{UID: cluster.UID, Namespace: f.NS, Name: f.Cluster, CAData: ca.CertPEM()}
	orphan := &provider.EndpointRequest{UID: uuid.NewUUID(), Namespace: f.NS, Name: "gone", CAData: ca.CertPEM()}
	for _, req := range []*provider.EndpointRequest{kept, orphan} {
		if _, _, err := f.Provider.EnsureEndpoint(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = f.Provider.DeleteEndpoint(ctx, kept.UID) })
	registry, err := provider.NewRegistry(f.Provider)
	if err != nil {
		t.Fatal(err)
	}
	grace := 2 * time.Second
	started := time.Now()
	localenv.StartManager(t, suite.Mgmt.Config, f.NS, func(ctx context.Context, mgr ctrl.Manager) error {
		return SetupWithManager(mgr, Options{Providers: registry, Period: 200 * time.Millisecond, Grace: grace})
	})
	testenv.Eventually(t, time.Minute, "only the kept endpoint left", func() error {
		uids, err := f.Provider.EndpointUIDs()
		if err != nil {
			return err
		}
		if len(uids) != 1 || uids[0] != kept.UID {
			return fmt.Errorf("endpoints %v", uids)
		}
		return nil
	})
	if took := time.Since(started); took < grace {
		t.Errorf("the orphan endpoint went after %s, before the grace period of %s", took, grace)
	}
}

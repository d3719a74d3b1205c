package machine

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// A machine handed to another management plane (what marina move does,
// here within one API server): paused, the machine is left alone even when
// deleted; its copy, a new object with a new UID and the instance-key
// annotation holding the first UID, finds the running sandbox and agent
// instead of making a new machine.
func TestMovedMachineFindsItsSandbox(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.startController(Options{})
	m := f.create(f.machine("moved", ""))
	first := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
	pid, err := f.provider.AgentPID(first.UID)
	if err != nil {
		t.Fatal(err)
	}

	pause := []byte(`{"metadata":{"annotations":{"` + clusterv1.PausedAnnotation + `":""}}}`)
	if err := mgmt.Client.Patch(ctx, first.DeepCopy(), client.RawPatch(types.MergePatchType, pause)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the machine to be paused", func() (bool, error) {
		got, err := f.get(m)
		return err == nil && meta.IsStatusConditionTrue(got.Status.Conditions, clusterv1.PausedCondition), err
	})
	if err := mgmt.Client.Delete(ctx, first); err != nil {
		t.Fatal(err)
	}
	// A paused machine being deleted keeps its finalizer and its sandbox.
	touch(t, first)
	eventually(t, 10*time.Second, "the deleted paused machine to be looked at", func() (bool, error) {
		got, err := f.get(m)
		return err == nil && got.Annotations["test/touched"] != "" && got.Status.ObservedGeneration == got.Generation, err
	})
	if got, err := f.get(m); err != nil || len(got.Finalizers) == 0 {
		t.Fatalf("the paused machine lost its finalizer (err %v)", err)
	}
	if pid2, err := f.provider.AgentPID(first.UID); err != nil || pid2 != pid {
		t.Fatalf("the paused machine's agent went: pid %d -> %d (%v)", pid, pid2, err)
	}
	strip := []byte(`{"metadata":{"finalizers":null}}`)
	if err := mgmt.Client.Patch(ctx, first.DeepCopy(), client.RawPatch(types.MergePatchType, strip)); err != nil {
		t.Fatal(err)
	}
	f.waitGone(m, 30*time.Second)

	moved := f.machine("moved", "")
	moved.Annotations = map[string]string{clusterv1.InstanceKeyAnnotation: string(first.UID)}
	moved.Spec.ProviderID = first.Spec.ProviderID
	f.create(moved)
	got := f.waitPhase(moved, clusterv1.MachinePhaseRunning, provisionTimeout)
	if got.UID == first.UID {
		t.Fatal("the copy has the first machine's UID")
	}
	if got.Status.ProviderID != first.Status.ProviderID {
		t.Errorf("providerID %q, want the first machine's %q", got.Status.ProviderID, first.Status.ProviderID)
	}
	if pid2, err := f.provider.AgentPID(first.UID); err != nil || pid2 != pid {
		t.Errorf("agent replaced: pid %d -> %d (%v)", pid, pid2, err)
	}
	if n := f.sandboxCount(); n != 1 {
		t.Errorf("%d sandboxes, want the first machine's alone", n)
	}

	// Deleting the copy deletes the machine it found.
	if err := mgmt.Client.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	f.waitGone(moved, provisionTimeout)
	if n := f.sandboxCount(); n != 0 {
		t.Errorf("%d sandboxes left after the copy was deleted", n)
	}
}

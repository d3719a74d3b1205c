package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
)

// Issue 23: deletions that end. On examples/minimal:
//   - a pod under two PodDisruptionBudgets, whose eviction the API server
//     refuses with a 500 on every try, holds worker-0's drain only until
//     its nodeDrainTimeout (20 s): the machine goes within 60 s;
//   - the workload cluster stopped (its control-plane machine's processes
//     killed), worker-1 deleted with nodeDeletionTimeout 30 s goes all the
//     same, with an event saying its Node could not be removed.
func TestUpDeletesMachinesWhoseDrainOrClusterNeverAnswers(t *testing.T) {
	t.Parallel()
	u, root, c := startUpWithClient(t)
	ctx := context.Background()
	u.applyExample(t, "minimal")
	key := types.NamespacedName{Namespace: "default", Name: "minimal"}
	testenv.Eventually(t, 4*time.Minute, "cluster minimal Ready with its 3 machines Running", func() error {
		cluster := &clusterv1.Cluster{}
		if err := c.Get(ctx, key, cluster); err != nil {
			return err
		}
		return machinesRunning(ctx, c, 3)
	})
	workload := workloadClient(t, ctx, c, key)
	machine := func(name string) *clusterv1.Machine {
		m := &clusterv1.Machine{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: name}, m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	setTimeout := func(name, field, value string) {
		patch := []byte(fmt.Sprintf(`{"spec":{%q:%q}}`, field, value))
		if err := c.Patch(ctx, machine(name), client.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Fatalf("setting %s of %s: %v", field, name, err)
		}
	}
	eventOf := func(m *clusterv1.Machine, reason, part string) error {
		var events eventsv1.EventList
		if err := c.List(ctx, &events, client.InNamespace("default")); err != nil {
			return err
		}
		var seen []string
		for _, e := range events.Items {
			if e.Regarding.UID == m.UID {
				if e.Reason == reason && strings.Contains(e.Note, part) {
					t.Logf("event %s: %s", e.Reason, e.Note)
					return nil
				}
				seen = append(seen, e.Reason+": "+e.Note)
			}
		}
		return fmt.Errorf("no %s event mentioning %q among %q", reason, part, seen)
	}
	gone := func(m *clusterv1.Machine) error {
		got := &clusterv1.Machine{}
		err := c.Get(ctx, client.ObjectKeyFromObject(m), got)
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		default:
			return fmt.Errorf("%s still there: phase %s, conditions %v", m.Name, got.Status.Phase, got.Status.Conditions)
		}
	}

	t.Run("a drain whose eviction fails every pass ends at nodeDrainTimeout", func(t *testing.T) {
		w := machine("minimal-worker-0")
		setTimeout(w.Name, "nodeDrainTimeout", "10s")
		labels := map[string]string{"app": "twice"}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "twice", Namespace: "default", Labels: labels},
			Spec:       corev1.PodSpec{NodeName: w.Status.NodeRef.Name, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/app:1"}}},
		}
		// Created again after a transient error (the endpoint reset a
		// connection once while the planes of other tests loaded the cores).
		createOnce := func(what string, create func() error) {
			testenv.Eventually(t, time.Minute, what+" created", func() error {
				if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
					return err
				}
				return nil
			})
		}
		createOnce("pod twice", func() error {
			_, err := workload.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
			return err
		})
		one := intstr.FromInt32(1)
		for _, name := range []string{"a", "b"} {
			pdb := &policyv1.PodDisruptionBudget{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
				Spec:       policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &one, Selector: &metav1.LabelSelector{MatchLabels: labels}},
			}
			createOnce("PodDisruptionBudget "+name, func() error {
				_, err := workload.PolicyV1().PodDisruptionBudgets("default").Create(ctx, pdb, metav1.CreateOptions{})
				return err
			})
		}
		testenv.Eventually(t, time.Minute, "the pod Running", func() error {
			p, err := workload.CoreV1().Pods("default").Get(ctx, "twice", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.Phase != corev1.PodRunning {
				return fmt.Errorf("phase %s", p.Status.Phase)
			}
			return nil
		})
		deleted := time.Now()
		if err := c.Delete(ctx, w); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 60*time.Second, "worker-0 gone", func() error { return gone(w) })
		t.Logf("worker-0 gone %.1fs after its deletion", time.Since(deleted).Seconds())
		testenv.Eventually(t, 30*time.Second, "a DrainTimeout event naming the failure", func() error {
			return eventOf(w, clusterv1.MachineDrainTimeoutReason, "more than one PodDisruptionBudget")
		})
	})

	t.Run("a machine of a stopped cluster goes after nodeDeletionTimeout", func(t *testing.T) {
		w := machine("minimal-worker-1")
		setTimeout(w.Name, "nodeDeletionTimeout", "15s")
		for _, cp := range controlPlaneMachines(t, ctx, c, key) {
			// Stopped on purpose: marina would start a killed machine
			// again, and the cluster must stay down for this test.
			if out, err := u.kubectl(t, "annotate", "machine", cp.Name, clusterv1.StoppedOnPurposeAnnotation+"=true"); err != nil {
				t.Fatalf("annotating %s stopped-on-purpose: %v\n%s", cp.Name, err, out)
			}
			for _, pid := range processesUnder(filepath.Join(root, string(cp.UID))) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		testenv.Eventually(t, 30*time.Second, "the workload API server down", func() error {
			if _, err := workload.Discovery().ServerVersion(); err == nil {
				return fmt.Errorf("it still answers")
			}
			return nil
		})
		deleted := time.Now()
		if err := c.Delete(ctx, w); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 90*time.Second, "worker-1 gone", func() error { return gone(w) })
		t.Logf("worker-1 gone %.1fs after its deletion", time.Since(deleted).Seconds())
		// The controller counts from metadata.deletionTimestamp, which has
		// whole seconds: up to one second earlier than deleted.
		if took := time.Since(deleted); took < 15*time.Second-time.Second {
			t.Errorf("worker-1 went %s after its deletion, before its nodeDeletionTimeout", took)
		}
		testenv.Eventually(t, 30*time.Second, "a NodeNotDeleted event", func() error {
			return eventOf(w, clusterv1.MachineNodeNotDeletedReason, "could not be removed")
		})
		if n := len(processesUnder(filepath.Join(root, string(w.UID)))); n != 0 {
			t.Errorf("%d processes of worker-1 still run", n)
		}
	})
}

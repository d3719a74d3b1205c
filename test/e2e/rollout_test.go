package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/controller/machineset"
	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/internal/testenv"
)

// Issue: rollouts never take out healthy capacity. The ten workers of
// examples/health roll to a new template with minReadySeconds 20,
// maxSurge 2 and maxUnavailable 0, on marina up with real processes, while
// a watcher counts the available machines (Ready for 20s, not being
// deleted) at every change of a worker: never fewer than 10, never more
// than 12 workers.
func TestUpRollsWorkersWithoutLosingAvailability(t *testing.T) {
	t.Parallel()
	u, _, c := startUpWithClient(t)
	ctx := context.Background()
	u.applyExample(t, "health")
	key := types.NamespacedName{Namespace: "default", Name: "health-workers"}
	md := &clusterv1.MachineDeployment{}
	patch := func(change func(*clusterv1.MachineDeployment)) {
		t.Helper()
		if err := c.Get(ctx, key, md); err != nil {
			t.Fatal(err)
		}
		before := md.DeepCopy()
		change(md)
		if err := c.Patch(ctx, md, client.MergeFrom(before)); err != nil {
			t.Fatalf("patching %s: %v", key.Name, err)
		}
	}
	settled := func(tier string) func() error {
		return func() error {
			if err := c.Get(ctx, key, md); err != nil {
				return err
			}
			st := md.Status
			if st.ObservedGeneration != md.Generation || st.Replicas != 10 || st.UpdatedReplicas != 10 || st.AvailableReplicas != 10 {
				return fmt.Errorf("status %+v", st)
			}
			var list clusterv1.MachineList
			if err := c.List(ctx, &list, client.InNamespace("default"), client.MatchingLabels{"example.marina.dev/pool": "health-workers"}); err != nil {
				return err
			}
			for _, m := range list.Items {
				if m.Spec.Labels["tier"] != tier {
					return fmt.Errorf("machine %s has tier %q", m.Name, m.Spec.Labels["tier"])
				}
			}
			return nil
		}
	}
	surge, unavailable := intstr.FromInt32(2), intstr.FromInt32(0)
	patch(func(md *clusterv1.MachineDeployment) {
		md.Spec.MinReadySeconds = 20
		md.Spec.Strategy = &clusterv1.MachineDeploymentStrategy{Type: clusterv1.RollingUpdateStrategy,
			RollingUpdate: &clusterv1.MachineRollingUpdate{MaxSurge: &surge, MaxUnavailable: &unavailable}}
	})
	testenv.Eventually(t, 6*time.Minute, "10 workers available", settled(""))

	w := watchWorkers(t, u.stateDir, 20)
	start := time.Now()
	patch(func(md *clusterv1.MachineDeployment) { md.Spec.Template.Spec.Labels = map[string]string{"tier": "v2"} })
	testenv.Eventually(t, 10*time.Minute, "10 workers of the new template available", settled("v2"))
	minAvailable, maxTotal, events, err := w.result()
	t.Logf("rollout of 10 in %s: %d worker changes seen, available never below %d, at most %d workers",
		time.Since(start).Round(time.Second), events, minAvailable, maxTotal)
	if err != nil || minAvailable < 10 || maxTotal > 12 {
		t.Errorf("available fell to %d (want >= 10), %d workers (want <= 12), watch error %v", minAvailable, maxTotal, err)
	}
}

// workerWatcher counts, at every change of a worker of examples/health,
// the workers that exist and those available: Ready for minReadySeconds at
// that moment and not being deleted. Availability only grows between
// changes, so the least seen at changes is the least there was.
type workerWatcher struct {
	mu                     sync.Mutex
	machines               map[string]*clusterv1.Machine
	minReadySeconds        int32
	minAvailable, maxTotal int
	events                 int
	err                    error
}

func watchWorkers(t *testing.T, stateDir string, minReadySeconds int32) *workerWatcher {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(stateDir, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sel := client.MatchingLabels{"example.marina.dev/pool": "health-workers"}
	list := &clusterv1.MachineList{}
	if err := wc.List(ctx, list, client.InNamespace("default"), sel); err != nil {
		cancel()
		t.Fatal(err)
	}
	wi, err := wc.Watch(ctx, &clusterv1.MachineList{}, client.InNamespace("default"), sel,
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	w := &workerWatcher{machines: map[string]*clusterv1.Machine{}, minReadySeconds: minReadySeconds, minAvailable: 1 << 30}
	for i := range list.Items {
		w.machines[list.Items[i].Name] = &list.Items[i]
	}
	w.record()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer wi.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-wi.ResultChan():
				if !ok {
					w.mu.Lock()
					w.err = fmt.Errorf("the watch ended early")
					w.mu.Unlock()
					return
				}
				m, isMachine := ev.Object.(*clusterv1.Machine)
				if !isMachine {
					continue
				}
				w.mu.Lock()
				if ev.Type == watch.Deleted {
					delete(w.machines, m.Name)
				} else {
					w.machines[m.Name] = m
				}
				w.mu.Unlock()
				w.record()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

func (w *workerWatcher) record() {
	w.mu.Lock()
	defer w.mu.Unlock()
	all := make([]*clusterv1.Machine, 0, len(w.machines))
	for _, m := range w.machines {
		all = append(all, m)
	}
	w.minAvailable = min(w.minAvailable, int(machineset.Count(all, w.minReadySeconds, time.Now()).Available))
	w.maxTotal = max(w.maxTotal, len(all))
	w.events++
}

func (w *workerWatcher) result() (minAvailable, maxTotal, events int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.minAvailable, w.maxTotal, w.events, w.err
}

package machineset

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
)

const machineTimeout = 90 * time.Second

// `kubectl scale` through the scale subresource takes a set from 3 to 0 to
// 5 real local machines; on the way down, the machine annotated
// cluster.marina.dev/delete-machine (what cluster-autoscaler does to the
// node it removes) is the one that goes.
func TestScaleSubresourceAndAnnotatedMachineGoesFirst(t *testing.T) {
	f := suite.NewFixture(t)
	start(f, Options{}, true)
	ctx := context.Background()
	ms := newSet(f, "workers", 3)
	ms.Spec.DeletePolicy = clusterv1.NewestDeletePolicy
	create(t, ms)
	waitOwned(t, ms, 3, 3, machineTimeout)

	testenv.Eventually(t, 30*time.Second, "the scale subresource to report 3 replicas and the selector", func() error {
		s := &autoscalingv1.Scale{}
		if err := mgmt.Client.SubResource("scale").Get(ctx, ms, s); err != nil {
			return err
		}
		if s.Spec.Replicas != 3 || s.Status.Replicas != 3 || s.Status.Selector != "pool=workers" {
			return fmt.Errorf("scale %+v", s)
		}
		return nil
	})

	// The oldest machine is annotated; the policy alone would take the newest.
	var victim *clusterv1.Machine
	for _, m := range machinesIn(t, f.NS) {
		if victim == nil || m.CreationTimestamp.Before(&victim.CreationTimestamp) || (m.CreationTimestamp.Equal(&victim.CreationTimestamp) && m.Name < victim.Name) {
			victim = m.DeepCopy()
		}
	}
	before := victim.DeepCopy()
	victim.Annotations = map[string]string{clusterv1.DeleteMachineAnnotation: "yes"}
	if err := mgmt.Client.Patch(ctx, victim, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	_, _, names := owned(t, ms)
	scale(t, ms, 2)
	waitOwned(t, ms, 2, 2, machineTimeout)
	_, _, left := owned(t, ms)
	if left[victim.Name] {
		t.Errorf("annotated machine %s survived the scale-down; left %v", victim.Name, left)
	}
	for n := range left {
		if !names[n] {
			t.Errorf("machine %s is new: scale-down replaced machines", n)
		}
	}

	scale(t, ms, 0)
	waitOwned(t, ms, 0, 0, machineTimeout)
	scale(t, ms, 5)
	waitOwned(t, ms, 5, 5, machineTimeout)
	testenv.Eventually(t, 30*time.Second, "status to say 5 ready and available, and Ready", func() error {
		got := getSet(t, ms)
		if got.Status.Replicas != 5 || got.Status.ReadyReplicas != 5 || got.Status.AvailableReplicas != 5 ||
			got.Status.ObservedGeneration != got.Generation || !strings.HasPrefix(condition(got.Status.Conditions, clusterv1.ReadyCondition), "True") {
			return fmt.Errorf("status %+v", got.Status)
		}
		return nil
	})
}

// An orphan machine that matches the selector is adopted instead of a new
// one being made; a machine relabelled out of the selector is released and
// replaced. A paused Cluster, a template its selector does not match and bad
// autoscaler annotations are reported, and create or delete nothing.
// (No machine controller runs: these machines are never provisioned.)
func TestAdoptionReleaseAndRefusals(t *testing.T) {
	f := suite.NewFixture(t)
	ctx := context.Background()
	ms := newSet(f, "pool-a", 2)
	orphan := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: "orphan", Namespace: f.NS, Labels: map[string]string{"pool": "pool-a"}},
		Spec:       *ms.Spec.Template.Spec.DeepCopy(),
	}
	create(t, orphan)
	create(t, ms)
	start(f, Options{}, false)
	waitOwned(t, ms, 2, -1, 30*time.Second)
	if _, _, names := owned(t, ms); !names["orphan"] {
		t.Fatalf("orphan not adopted: %v", names)
	}

	// Released when its labels stop matching, then replaced.
	o := &clusterv1.Machine{}
	if err := mgmt.Client.Get(ctx, client.ObjectKeyFromObject(orphan), o); err != nil {
		t.Fatal(err)
	}
	before := o.DeepCopy()
	o.Labels["pool"] = "elsewhere"
	if err := mgmt.Client.Patch(ctx, o, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	waitOwned(t, ms, 2, -1, 30*time.Second)
	testenv.Eventually(t, 30*time.Second, "the relabelled machine to lose its owner", func() error {
		if err := mgmt.Client.Get(ctx, client.ObjectKeyFromObject(orphan), o); err != nil {
			return err
		}
		if ref := metav1.GetControllerOf(o); ref != nil {
			return fmt.Errorf("still controlled by %s", ref.Name)
		}
		return nil
	})

	// A paused cluster: scaling up creates nothing, and says why.
	cluster := &clusterv1.Cluster{}
	if err := mgmt.Client.Get(ctx, client.ObjectKey{Namespace: f.NS, Name: f.Cluster}, cluster); err != nil {
		t.Fatal(err)
	}
	pause := func(p bool) {
		t.Helper()
		before := cluster.DeepCopy()
		cluster.Spec.Paused = p
		if err := mgmt.Client.Patch(ctx, cluster, client.MergeFrom(before)); err != nil {
			t.Fatal(err)
		}
	}
	pause(true)
	scale(t, ms, 4)
	testenv.Eventually(t, 30*time.Second, "Ready to say the cluster is paused", func() error {
		got := getSet(t, ms)
		if c := condition(got.Status.Conditions, clusterv1.ReadyCondition); !strings.HasPrefix(c, "False/"+clusterv1.ClusterPausedReason) || got.Status.ObservedGeneration != got.Generation {
			return fmt.Errorf("Ready %s", c)
		}
		return nil
	})
	if all, _, _ := owned(t, ms); all != 2 {
		t.Errorf("%d machines while the cluster is paused, want still 2", all)
	}
	pause(false)
	waitOwned(t, ms, 4, -1, 30*time.Second)

	// A template its selector does not match creates nothing.
	bad := newSet(f, "pool-b", 2)
	bad.Spec.Template.ObjectMeta.Labels = map[string]string{"pool": "pool-c"}
	create(t, bad)
	testenv.Eventually(t, 30*time.Second, "Ready to report the selector mismatch", func() error {
		c := condition(getSet(t, bad).Status.Conditions, clusterv1.ReadyCondition)
		if !strings.HasPrefix(c, "False/"+clusterv1.SelectorMismatchReason) || !strings.Contains(c, "spec.template.metadata.labels") {
			return fmt.Errorf("Ready %s", c)
		}
		return nil
	})
	if all, _, _ := owned(t, bad); all != 0 {
		t.Errorf("a set with a mismatched template made %d machines", all)
	}

	// A second set whose selector matches the first's machines says so, and
	// takes none of them.
	twin := newSet(f, "pool-a", 1)
	twin.Name = "twin"
	twin.Spec.Selector = metav1.LabelSelector{MatchLabels: map[string]string{"pool": "pool-a"}}
	create(t, twin)
	testenv.Eventually(t, 30*time.Second, "the overlap to be reported", func() error {
		c := condition(getSet(t, twin).Status.Conditions, clusterv1.SelectorExclusiveCondition)
		if !strings.HasPrefix(c, "False/"+clusterv1.SelectorOverlapReason) || !strings.Contains(c, "pool-a") {
			return fmt.Errorf("SelectorExclusive %s", c)
		}
		return nil
	})
	waitOwned(t, twin, 1, -1, 30*time.Second)
	waitOwned(t, ms, 4, -1, 30*time.Second)

	// Bad autoscaler annotations are reported by name; replicas stay.
	got := getSet(t, ms)
	before2 := got.DeepCopy()
	got.Annotations = map[string]string{clusterv1.AutoscalerMinSizeAnnotation: "5", clusterv1.AutoscalerMaxSizeAnnotation: "2"}
	if err := mgmt.Client.Patch(ctx, got, client.MergeFrom(before2)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "NodeGroupSizeValid to name the min annotation", func() error {
		c := condition(getSet(t, ms).Status.Conditions, clusterv1.NodeGroupSizeValidCondition)
		if !strings.HasPrefix(c, "False/"+clusterv1.InvalidNodeGroupSizeReason) || !strings.Contains(c, clusterv1.AutoscalerMinSizeAnnotation) {
			return fmt.Errorf("NodeGroupSizeValid %s", c)
		}
		return nil
	})
	if all, _, _ := owned(t, ms); all != 4 || *getSet(t, ms).Spec.Replicas != 4 {
		t.Errorf("bad annotations changed the set: %d machines", all)
	}
}

// A controller killed right after each machine creation or deletion, and
// started again, ends with exactly spec.replicas machines: no duplicate, no
// leak.
func TestControllerKilledAfterEachWriteConverges(t *testing.T) {
	f := suite.NewFixture(t)
	ms := newSet(f, "crashy", 5)
	create(t, ms)
	// Each manager lives until its first crash; the next one takes over.
	runUntilStable := func(step string, want int) {
		t.Helper()
		for range 20 {
			crashed := make(chan struct{})
			var once bool
			stop := start(f, Options{crashAt: func(s string) bool {
				if s != step || once {
					return false
				}
				once = true
				close(crashed)
				return true
			}}, false)
			settled := false
			testenv.Eventually(t, 30*time.Second, "a crash or a settled set", func() error {
				select {
				case <-crashed:
					return nil
				default:
				}
				if all, _, _ := owned(t, ms); all == want {
					settled = true
					return nil
				}
				return fmt.Errorf("neither crashed nor settled")
			})
			stop()
			if settled {
				return
			}
		}
		t.Fatalf("still crashing after 20 restarts")
	}
	runUntilStable("after-create", 5)
	if machines := machinesIn(t, f.NS); len(machines) != 5 {
		t.Fatalf("%d machines in the namespace after crashes, want 5", len(machines))
	}
	scale(t, ms, 1)
	runUntilStable("after-delete", 1)
	if machines := machinesIn(t, f.NS); len(machines) != 1 {
		t.Fatalf("%d machines in the namespace after crashes, want 1", len(machines))
	}
}

// A set of 20 is made in batches without overshooting, and once it has
// read its machines live, it reads them from the cache: 20 machine changes
// cost no list from the API server (a fleet of a thousand machines made
// each pass list them all).
func TestSettledSetReadsItsCache(t *testing.T) {
	f := suite.NewFixture(t)
	r, _ := startReconciler(f, Options{StatusInterval: -1}, false)
	ms := newSet(f, "cached", 20)
	create(t, ms)
	waitOwned(t, ms, 20, -1, machineTimeout)
	testenv.Eventually(t, 30*time.Second, "status to count 20 machines", func() error {
		if got := getSet(t, ms); got.Status.Replicas != 20 {
			return fmt.Errorf("status %+v", got.Status)
		}
		return nil
	})
	lists := r.liveLists.Load()

	// No machine controller runs: the test marks the machines Ready, and
	// the set's ready count follows from the cache.
	ctx := context.Background()
	for _, m := range machinesIn(t, f.NS) {
		before := m.DeepCopy()
		m.Status.Conditions = []metav1.Condition{{Type: clusterv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: "Test", LastTransitionTime: metav1.Now()}}
		if err := mgmt.Client.Status().Patch(ctx, &m, client.MergeFrom(before)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 30*time.Second, "status to count 20 Ready machines", func() error {
		if got := getSet(t, ms); got.Status.ReadyReplicas != 20 {
			return fmt.Errorf("status %+v", got.Status)
		}
		return nil
	})
	if got := r.liveLists.Load(); got != lists {
		t.Errorf("%d live lists after the set settled, want none", got-lists)
	}
	if n := len(machinesIn(t, f.NS)); n != 20 {
		t.Errorf("%d machines, want 20", n)
	}
}

// laggingCache hides from lists the machines created in the last lag: a
// cache behind the API server, as under load.
type laggingCache struct {
	client.Client
	lag time.Duration
}

func (c laggingCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := c.Client.List(ctx, list, opts...); err != nil {
		return err
	}
	if ml, ok := list.(*clusterv1.MachineList); ok {
		ml.Items = slices.DeleteFunc(ml.Items, func(m clusterv1.Machine) bool { return time.Since(m.CreationTimestamp.Time) < c.lag })
	}
	return nil
}

// A cache that lags behind the set's own creations never makes it create
// more: 60 machines, not one more, while every machine change queues the
// set again.
func TestLaggingCacheMakesNoExtraMachine(t *testing.T) {
	f := suite.NewFixture(t)
	start(f, Options{StatusInterval: -1, cacheLag: func(c client.Client) client.Client { return laggingCache{c, 3 * time.Second} }}, false)
	ms := newSet(f, "lagging", 60)
	create(t, ms)
	waitOwned(t, ms, 60, -1, machineTimeout)
	// Touch every machine while the cache still hides some: each touch
	// queues the set.
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range machinesIn(t, f.NS) {
			before := m.DeepCopy()
			m.Annotations = map[string]string{"touched": time.Now().Format(time.RFC3339Nano)}
			_ = mgmt.Client.Patch(ctx, &m, client.MergeFrom(before))
		}
	}
	if n := len(machinesIn(t, f.NS)); n != 60 {
		t.Errorf("%d machines, want 60", n)
	}
}

// ambiguousCreates is an API server that commits the first creates it is
// sent and answers them with a timeout, behind a cache that shows new
// machines only after lag: the create looks failed, and the cache does not
// say otherwise.
type ambiguousCreates struct {
	laggingCache
	timeouts *atomic.Int32 // creates still to answer with a timeout
	made     *atomic.Int32 // creates committed
}

func (c ambiguousCreates) Create(ctx context.Context, o client.Object, opts ...client.CreateOption) error {
	if err := c.Client.Create(ctx, o, opts...); err != nil {
		return err
	}
	c.made.Add(1)
	if c.timeouts.Add(-1) >= 0 {
		return apierrors.NewTimeoutError("the create may or may not have been committed", 1)
	}
	return nil
}

// A create that the API server committed but answered with a timeout is
// counted on the next pass (read live), not made again: a set of 3 makes
// exactly 3 machines though its cache lags.
func TestCreateThatTimedOutIsNotMadeTwice(t *testing.T) {
	f := suite.NewFixture(t)
	var timeouts, made atomic.Int32
	timeouts.Store(1)
	start(f, Options{StatusInterval: -1, cacheLag: func(c client.Client) client.Client {
		return ambiguousCreates{laggingCache{c, 5 * time.Second}, &timeouts, &made}
	}}, false)
	ms := newSet(f, "ambiguous", 3)
	create(t, ms)
	waitOwned(t, ms, 3, -1, machineTimeout)
	// Until past the cache's lag, when a set that made too many would have
	// made them, no more than 3 were ever created (the counter follows the
	// API server by the time a create takes to return).
	for deadline := time.Now().Add(6 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if n := made.Load(); n > 3 {
			t.Fatalf("%d machines created for a set of 3", n)
		}
	}
	if n := made.Load(); n != 3 {
		t.Errorf("%d machines created for a set of 3", n)
	}
	if all, _, _ := owned(t, ms); all != 3 {
		t.Errorf("%d machines, want 3", all)
	}
}

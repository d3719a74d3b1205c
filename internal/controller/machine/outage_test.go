package machine

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// Commit 2283722: the workload cluster answered marina's lookup (its
// client is cached and answered its last probe) while its API server is
// down behind its balancer, which resets every connection: the Node's
// cordon fails with "connection reset". With spec.nodeDeletionTimeout the
// machine is deleted once it has passed; without it, the deletion keeps
// retrying and the machine stays.
func TestNodeDeletionTimeoutBoundsAClusterThatFailsTheDrain(t *testing.T) {
	f := newFixture(t)
	lb := f.behindBalancer()
	// Probed once an hour: the cluster stays cached as answering, as it
	// does for up to a probe interval in production.
	f.startController(Options{clusterHealthInterval: time.Hour})
	ctx := context.Background()

	bounded := f.machine("bounded", "")
	bounded.Spec.NodeDeletionTimeout = &metav1.Duration{Duration: 15 * time.Second}
	// A pre-terminate hook holds the machine after the decision, so that
	// its conditions can be read before it goes.
	hook := clusterv1.PreTerminateHookPrefix + "test"
	bounded.Annotations = map[string]string{hook: ""}
	unbounded := f.machine("unbounded", "")
	var running []*clusterv1.Machine
	for _, m := range []*clusterv1.Machine{bounded, unbounded} {
		f.create(m)
	}
	for _, m := range []*clusterv1.Machine{bounded, unbounded} {
		running = append(running, f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout))
	}

	lb.cut()
	deleted := time.Now()
	for _, m := range running {
		if err := mgmt.Client.Delete(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 90*time.Second, "the bounded machine to go on without its Node", func() (bool, error) {
		got, err := f.get(bounded)
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineDrainedCondition)
		return c != nil && c.Reason == clusterv1.MachineNodeNotDeletedReason &&
				strings.Contains(c.Message, "fails to drain or find the node") && strings.Contains(c.Message, "spec.nodeDeletionTimeout (15s) has passed"),
			fmt.Errorf("conditions %v", got.Status.Conditions)
	})
	if took := time.Since(deleted); took < bounded.Spec.NodeDeletionTimeout.Duration-time.Second {
		t.Errorf("the bounded machine went on after %s, before its nodeDeletionTimeout", took)
	}
	// A merge patch: the controller writes the machine meanwhile.
	live := mustGet(t, f, bounded)
	release := client.MergeFrom(live.DeepCopy())
	delete(live.Annotations, hook)
	if err := mgmt.Client.Patch(ctx, live, release); err != nil {
		t.Fatal(err)
	}
	f.waitGone(bounded, 45*time.Second)

	// The unbounded one is still there, retrying, and says why.
	eventually(t, 30*time.Second, "the unbounded machine to keep retrying", func() (bool, error) {
		got, err := f.get(unbounded)
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineNodeReadyCondition)
		d := meta.FindStatusCondition(got.Status.Conditions, clusterv1.MachineDrainedCondition)
		return got.DeletionTimestamp != nil && (c == nil || c.Reason != clusterv1.MachineNodeNotDeletedReason) &&
			(d == nil || d.Reason != clusterv1.MachineNodeNotDeletedReason), fmt.Errorf("conditions %v", got.Status.Conditions)
	})
	if n := f.agents(running[1].UID); n != 1 {
		t.Errorf("%d agents run for the machine still waiting for its drain, want 1", n)
	}

	// Once the API server is back, it is drained and deleted (touched, so
	// that it need not wait out the controller's backoff).
	lb.restore()
	live = mustGet(t, f, unbounded)
	live.Annotations = map[string]string{"test/touched": "yes"}
	if err := mgmt.Client.Update(ctx, live); err != nil {
		t.Fatal(err)
	}
	f.waitGone(unbounded, 2*time.Minute)
}

// balancer stands for a workload cluster's load balancer (a loopback TCP
// relay, the edge the test controls): it forwards to the API server until
// cut, then resets every connection, open or new, as a balancer with no
// healthy backend does.
type balancer struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  map[net.Conn]struct{}
}

// behindBalancer puts a balancer in front of the fixture cluster's API
// server and points the cluster's kubeconfig Secret at it.
func (f *fixture) behindBalancer() *balancer {
	f.t.Helper()
	u, err := url.Parse(workload.Config.Host)
	if err != nil {
		f.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.t.Fatal(err)
	}
	b := &balancer{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}}
	go b.serve()
	f.t.Cleanup(func() { _ = ln.Close(); b.cut() })

	f.pointKubeconfigAt(ln.Addr().String())
	return b
}

func (b *balancer) serve() {
	for {
		in, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		down := b.down
		if !down {
			b.conns[in] = struct{}{}
		}
		b.mu.Unlock()
		if down {
			reset(in)
			continue
		}
		go b.relay(in)
	}
}

func (b *balancer) relay(in net.Conn) {
	out, err := net.Dial("tcp", b.target)
	if err != nil {
		reset(in)
		return
	}
	b.mu.Lock()
	b.conns[out] = struct{}{}
	b.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src) // ends when either side goes, or on a cut
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	reset(in)
	reset(out)
	b.mu.Lock()
	delete(b.conns, in)
	delete(b.conns, out)
	b.mu.Unlock()
}

// cut resets every open connection and every new one.
func (b *balancer) cut() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.down = true
	for c := range b.conns {
		reset(c)
	}
}

// restore forwards new connections again.
func (b *balancer) restore() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.down = false
}

// reset closes c with a TCP RST rather than a FIN.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

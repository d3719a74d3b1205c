package machine

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"marina.dev/marina/internal/remote"
)

// The workers of a cluster whose control plane just answered all ask for
// its bootstrap RBAC at once: one ensures, the others are told to come
// back (errEnsuring) rather than wait; a failed ensure is tried again, and
// forget makes the next caller ensure again.
func TestIdentityCacheEnsuresOncePerCluster(t *testing.T) {
	ctx := context.Background()
	var c identityCache
	a := &remote.Cluster{Config: &rest.Config{Host: "https://127.0.0.1:1"}}
	b := &remote.Cluster{Config: &rest.Config{Host: "https://127.0.0.1:2"}}
	var calls atomic.Int32
	count := func(context.Context, kubernetes.Interface) error {
		calls.Add(1)
		// An ensure takes a while (three creates on a remote cluster):
		// give the other callers the CPU meanwhile.
		for range 100 {
			runtime.Gosched()
		}
		return nil
	}

	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 50 {
		wg.Go(func() {
			<-start
			if err := c.ensure(ctx, a, count); err != nil && !errors.Is(err, errEnsuring) {
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Fatalf("50 concurrent callers of one cluster ensured %d times, want 1", n)
	}
	if err := c.ensure(ctx, a, count); err != nil {
		t.Fatalf("a caller after the ensure: %v, want nil", err)
	}

	failing := func(context.Context, kubernetes.Interface) error { return errors.New("refused") }
	if err := c.ensure(ctx, b, failing); err == nil {
		t.Fatal("a failed ensure reported success")
	}
	if err := c.ensure(ctx, b, count); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("after a failure the next caller ensured %d times in all, want 2", n)
	}

	c.forget(a)
	if err := c.ensure(ctx, a, count); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("after forget the next caller ensured %d times in all, want 3", n)
	}
}

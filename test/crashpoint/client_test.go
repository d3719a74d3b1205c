package crashpoint

import (
	"context"
	"errors"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// errKilled is what a write of a stopped manager returns: the process is
// gone, nothing it would still write lands.
var errKilled = errors.New("the manager was stopped at a crash point")

// killSwitch counts the manager's writes to the scenario's namespace and
// stops it at the limit-th: the write lands first (after) or never
// (before). Every later write fails, as a dead process writes nothing.
type killSwitch struct {
	ns     string
	limit  int // 0: never
	before bool
	stop   func()

	mu     sync.Mutex
	writes int
	killed bool
}

// admit counts one write of obj; it reports whether the write may be
// made and whether the manager is to be stopped once it is.
func (k *killSwitch) admit(ns string) (ok, killAfter bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.killed {
		return false, false
	}
	if ns != k.ns {
		return true, false
	}
	k.writes++
	if k.limit == 0 || k.writes < k.limit {
		return true, false
	}
	k.killed = true
	if k.before {
		go k.stop()
		return false, false
	}
	return true, true
}

// do runs one write under the switch.
func (k *killSwitch) do(ns string, write func() error) error {
	ok, killAfter := k.admit(ns)
	if !ok {
		return errKilled
	}
	err := write()
	if killAfter {
		go k.stop()
	}
	return err
}

func (k *killSwitch) count() (writes int, killed bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.writes, k.killed
}

// crashClient is the controllers' client under a kill switch.
type crashClient struct {
	client.Client
	k *killSwitch
}

func (c *crashClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	return c.k.do(obj.GetNamespace(), func() error { return c.Client.Create(ctx, obj, opts...) })
}

func (c *crashClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	return c.k.do(obj.GetNamespace(), func() error { return c.Client.Update(ctx, obj, opts...) })
}

func (c *crashClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	return c.k.do(obj.GetNamespace(), func() error { return c.Client.Patch(ctx, obj, patch, opts...) })
}

func (c *crashClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	return c.k.do(obj.GetNamespace(), func() error { return c.Client.Delete(ctx, obj, opts...) })
}

func (c *crashClient) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	return c.k.do(obj.GetNamespace(), func() error { return c.Client.DeleteAllOf(ctx, obj, opts...) })
}

func (c *crashClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	return c.k.do(applyNamespace(obj), func() error { return c.Client.Apply(ctx, obj, opts...) })
}

func (c *crashClient) Status() client.SubResourceWriter {
	return &crashSubResource{SubResourceWriter: c.Client.Status(), k: c.k}
}

func (c *crashClient) SubResource(name string) client.SubResourceClient {
	return &crashSubResourceClient{SubResourceClient: c.Client.SubResource(name), k: c.k}
}

type crashSubResource struct {
	client.SubResourceWriter
	k *killSwitch
}

func (s *crashSubResource) Create(ctx context.Context, obj client.Object, sub client.Object, opts ...client.SubResourceCreateOption) error {
	return s.k.do(obj.GetNamespace(), func() error { return s.SubResourceWriter.Create(ctx, obj, sub, opts...) })
}

func (s *crashSubResource) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	return s.k.do(obj.GetNamespace(), func() error { return s.SubResourceWriter.Update(ctx, obj, opts...) })
}

func (s *crashSubResource) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	return s.k.do(obj.GetNamespace(), func() error { return s.SubResourceWriter.Patch(ctx, obj, patch, opts...) })
}

func (s *crashSubResource) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	return s.k.do(applyNamespace(obj), func() error { return s.SubResourceWriter.Apply(ctx, obj, opts...) })
}

type crashSubResourceClient struct {
	client.SubResourceClient
	k *killSwitch
}

func (s *crashSubResourceClient) Create(ctx context.Context, obj client.Object, sub client.Object, opts ...client.SubResourceCreateOption) error {
	return s.k.do(obj.GetNamespace(), func() error { return s.SubResourceClient.Create(ctx, obj, sub, opts...) })
}

func (s *crashSubResourceClient) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	return s.k.do(obj.GetNamespace(), func() error { return s.SubResourceClient.Update(ctx, obj, opts...) })
}

func (s *crashSubResourceClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	return s.k.do(obj.GetNamespace(), func() error { return s.SubResourceClient.Patch(ctx, obj, patch, opts...) })
}

func (s *crashSubResourceClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	return s.k.do(applyNamespace(obj), func() error { return s.SubResourceClient.Apply(ctx, obj, opts...) })
}

// applyNamespace is the namespace of a server-side apply's object.
func applyNamespace(obj runtime.ApplyConfiguration) string {
	if o, ok := obj.(interface{ GetNamespace() *string }); ok && o.GetNamespace() != nil {
		return *o.GetNamespace()
	}
	return ""
}

package bench

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// fieldWatch counts, for every change to a Machine that a watch sees,
// the fields the change touched: where a machine's writes go (issue 37).
// A write that changed nothing makes no watch event: the API server's
// count of machine writes less the events seen is the no-op writes.
type fieldWatch struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	changes int
	fields  map[string]float64
}

// watchMachineFields watches every namespace's Machines from now on.
func watchMachineFields(b *testing.B, cfg *rest.Config) *fieldWatch {
	dc, err := dynamic.NewForConfig(cfg)
	must(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	machines := dc.Resource(clusterv1.GroupVersion.WithResource("machines"))
	list, err := machines.List(ctx, metav1.ListOptions{})
	must(b, err)
	// A plain watch ends when the API server closes it (it did after a
	// few seconds in a fleet run); this one goes on from where it ended.
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.GetResourceVersion(), &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return machines.Watch(ctx, opts)
		},
	})
	must(b, err)
	f := &fieldWatch{cancel: cancel, done: make(chan struct{}), fields: map[string]float64{}}
	go func() {
		defer close(f.done)
		defer w.Stop()
		last := map[string]map[string]any{}
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if !ok {
					return
				}
				u, isObj := ev.Object.(*unstructured.Unstructured)
				if !isObj {
					continue
				}
				key := u.GetNamespace() + "/" + u.GetName()
				switch ev.Type {
				case watch.Modified:
					f.record(changedFields(last[key], u.Object))
					last[key] = u.Object
				case watch.Added:
					last[key] = u.Object
				case watch.Deleted:
					delete(last, key)
				}
			}
		}
	}()
	return f
}

func (f *fieldWatch) record(fields []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.changes++
	for _, k := range fields {
		f.fields[k]++
	}
}

// stop ends the watch and returns the changes seen and the count of
// changes that touched each field.
func (f *fieldWatch) stop() (int, map[string]float64) {
	f.cancel()
	<-f.done
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changes, f.fields
}

// changedFields names what differs between two versions of an object: a
// label, annotation or condition by its key or type, any other field of
// metadata, spec or status by its name (a condition's by the fields of
// it that changed, or whole when it came or went). The resource version, managed
// fields and generation change with every write and tell nothing.
func changedFields(old, cur map[string]any) []string {
	var out []string
	for _, part := range []string{"metadata", "spec", "status"} {
		o, _ := old[part].(map[string]any)
		c, _ := cur[part].(map[string]any)
		for _, k := range unionKeys(o, c) {
			switch {
			case part == "metadata" && (k == "resourceVersion" || k == "managedFields" || k == "generation"):
			case part == "metadata" && (k == "labels" || k == "annotations"):
				om, _ := o[k].(map[string]any)
				cm, _ := c[k].(map[string]any)
				for _, kk := range unionKeys(om, cm) {
					if !reflect.DeepEqual(om[kk], cm[kk]) {
						out = append(out, fmt.Sprintf("%s.%s[%s]", part, k, kk))
					}
				}
			case part == "status" && k == "conditions":
				oc, cc := conditionsByType(o[k]), conditionsByType(c[k])
				for _, t := range unionKeys(oc, cc) {
					om, _ := oc[t].(map[string]any)
					cm, _ := cc[t].(map[string]any)
					switch {
					case om == nil || cm == nil:
						out = append(out, "status.conditions["+t+"]")
					default:
						for _, f := range unionKeys(om, cm) {
							if !reflect.DeepEqual(om[f], cm[f]) {
								out = append(out, "status.conditions["+t+"]."+f)
							}
						}
					}
				}
			case !reflect.DeepEqual(o[k], c[k]):
				out = append(out, part+"."+k)
			}
		}
	}
	return out
}

func conditionsByType(v any) map[string]any {
	list, _ := v.([]any)
	out := make(map[string]any, len(list))
	for _, c := range list {
		if m, ok := c.(map[string]any); ok {
			t, _ := m["type"].(string)
			out[t] = m
		}
	}
	return out
}

func unionKeys(a, b map[string]any) []string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	return keys
}

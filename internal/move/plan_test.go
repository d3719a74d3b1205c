package move

import (
	"errors"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/provider"
)

// obj builds a listed object: kind, name, and its UID "uid-<name>"; owners
// are names of objects it is owned by.
func obj(kind, name string, owners ...string) *unstructured.Unstructured {
	o := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{}}}
	switch kind {
	case "Secret", "ConfigMap":
		o.SetAPIVersion("v1")
		delete(o.Object, "spec")
	default:
		o.SetAPIVersion(clusterv1.GroupVersion.String())
	}
	o.SetKind(kind)
	o.SetName(name)
	if kind != "MachineClass" {
		o.SetNamespace("ns")
	}
	o.SetUID(types.UID("uid-" + name))
	var refs []metav1.OwnerReference
	for _, owner := range owners {
		refs = append(refs, metav1.OwnerReference{Kind: "Owner", Name: owner, UID: types.UID("uid-" + owner)})
	}
	o.SetOwnerReferences(refs)
	return o
}

func with(o *unstructured.Unstructured, f func(o *unstructured.Unstructured)) *unstructured.Unstructured {
	f(o)
	return o
}

func setField(o *unstructured.Unstructured, v any, path ...string) {
	if err := unstructured.SetNestedField(o.Object, v, path...); err != nil {
		panic(err)
	}
}

var rack = schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Rack"}

// refsOf is a provider's References: the ConfigMaps its spec's fields name.
func refsOf(fields ...string) func(map[string]any) []provider.ObjectRef {
	return func(spec map[string]any) []provider.ObjectRef {
		var out []provider.ObjectRef
		for _, f := range fields {
			if name, _, _ := unstructured.NestedString(spec, f, "name"); name != "" {
				out = append(out, provider.ObjectRef{Kind: "ConfigMap", Name: name})
			}
		}
		return out
	}
}

func TestBuildPlan(t *testing.T) {
	cluster := func() *unstructured.Unstructured { return obj("Cluster", "c1") }
	tests := []struct {
		name string
		objs []*unstructured.Unstructured
		// want is the plan, in order: "Kind name", with " (copy)" for an
		// object copied and left on the source.
		want      []string
		wantErr   string
		providers Providers
	}{{
		name: "owners first, whatever the listing order",
		objs: []*unstructured.Unstructured{
			obj("Machine", "m1", "ms1"), obj("MachineSet", "ms1", "md1"), obj("Secret", "c1-ca", "c1"),
			obj("MachineHealthCheck", "hc"), obj("MachineDeployment", "md1"), cluster(),
		},
		want: []string{"Cluster c1", "Secret c1-ca", "MachineDeployment md1", "MachineSet ms1", "Machine m1", "MachineHealthCheck hc"},
	}, {
		name: "a Secret owned through another goes too; an unrelated one stays",
		objs: []*unstructured.Unstructured{
			obj("Secret", "deep", "c1-etcd"), obj("Secret", "c1-etcd", "c1"), obj("Secret", "unrelated"), cluster(),
		},
		want: []string{"Cluster c1", "Secret c1-etcd", "Secret deep"},
	}, {
		name: "what is only named is copied and left; unnamed classes are left out",
		objs: []*unstructured.Unstructured{
			with(cluster(), func(o *unstructured.Unstructured) {
				setField(o, "users-ca", "spec", "controlPlane", "caSecretRef", "name")
				setField(o, "cp-class", "spec", "controlPlane", "classRef", "name")
			}),
			with(obj("MachineDeployment", "md1"), func(o *unstructured.Unstructured) {
				setField(o, "workers", "spec", "template", "spec", "classRef", "name")
				setField(o, "kubelet-v1", "spec", "template", "spec", "kubeletConfigRef", "name")
			}),
			obj("MachineClass", "workers"), obj("MachineClass", "cp-class"), obj("MachineClass", "unused"),
			obj("Secret", "users-ca"), obj("ConfigMap", "kubelet-v1"), obj("ConfigMap", "kubelet-v2"),
		},
		want: []string{"MachineClass cp-class (copy)", "MachineClass workers (copy)", "ConfigMap ns/kubelet-v1 (copy)", "Secret ns/users-ca (copy)", "Cluster c1", "MachineDeployment md1"},
	}, {
		name:    "a cluster being deleted is refused",
		objs:    []*unstructured.Unstructured{with(cluster(), func(o *unstructured.Unstructured) { now := metav1.Now(); o.SetDeletionTimestamp(&now) })},
		wantErr: "Cluster ns/c1 is being deleted",
	}, {
		name: "a cluster being upgraded is refused",
		objs: []*unstructured.Unstructured{with(cluster(), func(o *unstructured.Unstructured) {
			setField(o, []any{map[string]any{"type": clusterv1.ClusterUpgradeProgressingCondition, "status": "True"}}, "status", "conditions")
		})},
		wantErr: "is being upgraded",
	}, {
		name: "a cluster the move paused and began deleting goes on",
		objs: []*unstructured.Unstructured{with(cluster(), func(o *unstructured.Unstructured) {
			now := metav1.Now()
			o.SetDeletionTimestamp(&now)
			o.SetAnnotations(map[string]string{clusterv1.PausedAnnotation: PausedValue})
		})},
		want: []string{"Cluster c1"},
	}, {
		name:    "owner references in a cycle",
		objs:    []*unstructured.Unstructured{obj("MachineSet", "a", "b"), obj("MachineSet", "b", "a")},
		wantErr: "cycle among MachineSet ns/a, MachineSet ns/b",
	}, {
		name: "a provider's references move with the machines, from their class and their own spec",
		objs: []*unstructured.Unstructured{
			cluster(),
			with(obj("Machine", "m1"), func(o *unstructured.Unstructured) {
				setField(o, "hosts-class", "spec", "classRef", "name")
				setField(o, map[string]any{"templatesRef": map[string]any{"name": "templates"}}, "spec", "providerSpec", "spec")
			}),
			with(obj("MachineClass", "hosts-class"), func(o *unstructured.Unstructured) {
				setField(o, map[string]any{"apiVersion": "example.com/v1", "kind": "Rack", "spec": map[string]any{"hostsRef": map[string]any{"name": "hosts"}}}, "spec", "providerSpec")
			}),
			obj("ConfigMap", "hosts"), obj("ConfigMap", "templates"), obj("ConfigMap", "unrelated"),
		},
		providers: Providers{rack: {References: refsOf("hostsRef", "templatesRef")}},
		want:      []string{"MachineClass hosts-class (copy)", "ConfigMap ns/hosts (copy)", "ConfigMap ns/templates (copy)", "Cluster c1", "Machine m1"},
	}, {
		name: "machines a provider cannot move are refused, each named, wherever they are made",
		objs: []*unstructured.Unstructured{
			with(cluster(), func(o *unstructured.Unstructured) {
				setField(o, map[string]any{"apiVersion": "example.com/v1", "kind": "Rack"}, "spec", "controlPlane", "providerSpec")
			}),
			with(obj("MachineDeployment", "md1"), func(o *unstructured.Unstructured) {
				setField(o, "rack-class", "spec", "template", "spec", "classRef", "name")
			}),
			with(obj("MachineClass", "rack-class"), func(o *unstructured.Unstructured) {
				setField(o, map[string]any{"apiVersion": "example.com/v1", "kind": "Rack"}, "spec", "providerSpec")
			}),
			obj("Machine", "elsewhere"),
		},
		providers: Providers{rack: {Refusal: "racks stay put"}},
		wantErr:   "Cluster ns/c1 (Rack), MachineDeployment ns/md1 (Rack): racks stay put",
	}, {
		name: "nothing to move",
		objs: []*unstructured.Unstructured{obj("Secret", "unrelated"), obj("MachineClass", "unused")},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := BuildPlan(tt.objs, tt.providers)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || (tt.providers != nil && !errors.Is(err, ErrCannotMove)) {
					t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, it := range plan.Items {
				s := it.Object.GetKind() + " " + it.Object.GetName()
				if !it.Delete {
					s = Key(it.Object) + " (copy)"
				}
				got = append(got, s)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("plan\n %q\nwant\n %q", got, tt.want)
			}
		})
	}
}

func TestRebuildOwners(t *testing.T) {
	ref := func(name string, controller bool) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "cluster.marina.dev/v1alpha1", Kind: "MachineSet", Name: name, UID: types.UID("src-" + name), Controller: &controller}
	}
	target := map[types.UID]types.UID{"src-ms1": "tgt-ms1", "src-c1": "tgt-c1"}
	tests := []struct {
		name                string
		refs                []metav1.OwnerReference
		wantKept, wantDrops []string // name=uid
	}{
		{name: "none"},
		{name: "one moved", refs: []metav1.OwnerReference{ref("ms1", true)}, wantKept: []string{"ms1=tgt-ms1"}},
		{name: "two, one not moved", refs: []metav1.OwnerReference{ref("c1", false), ref("gone", false)}, wantKept: []string{"c1=tgt-c1"}, wantDrops: []string{"gone=src-gone"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kept, dropped := RebuildOwners(tt.refs, target)
			names := func(refs []metav1.OwnerReference) []string {
				var out []string
				for _, r := range refs {
					out = append(out, r.Name+"="+string(r.UID))
				}
				return out
			}
			if !slices.Equal(names(kept), tt.wantKept) || !slices.Equal(names(dropped), tt.wantDrops) {
				t.Errorf("kept %v dropped %v, want %v and %v", names(kept), names(dropped), tt.wantKept, tt.wantDrops)
			}
			for i := range kept {
				if kept[i].Controller == nil || *kept[i].Controller != *tt.refs[i].Controller || kept[i].Kind != tt.refs[i].Kind {
					t.Errorf("reference %d changed beyond its UID: %+v", i, kept[i])
				}
			}
		})
	}
}

func TestTargetCopy(t *testing.T) {
	tests := []struct {
		name            string
		src             *unstructured.Unstructured
		wantInstanceKey string
	}{
		{name: "a machine keeps the UID its provider knows", src: obj("Machine", "m1", "ms1"), wantInstanceKey: "uid-m1"},
		{name: "a machine moved before keeps its first key", src: with(obj("Machine", "m1", "ms1"), func(o *unstructured.Unstructured) {
			o.SetAnnotations(map[string]string{clusterv1.InstanceKeyAnnotation: "first"})
		}), wantInstanceKey: "first"},
		{name: "a cluster keeps its endpoint's key", src: obj("Cluster", "c1"), wantInstanceKey: "uid-c1"},
		{name: "a set needs none", src: obj("MachineSet", "ms1")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := tt.src
			src.SetResourceVersion("7")
			src.SetGeneration(3)
			src.SetCreationTimestamp(metav1.Now())
			src.SetFinalizers([]string{clusterv1.MachineFinalizer})
			setField(src, int64(3), "status", "observedGeneration")
			setField(src, "local://uid-m1", "status", "providerID")
			c := TargetCopy(src, map[types.UID]types.UID{"uid-ms1": "new-ms1"})
			if c.GetUID() != "" || c.GetResourceVersion() != "" || c.GetGeneration() != 0 || c.GetCreationTimestamp() != (metav1.Time{}) {
				t.Errorf("metadata of the source's API server kept: %v", c.Object["metadata"])
			}
			if _, ok := c.Object["status"]; ok {
				t.Error("status kept in the object to create")
			}
			if got := c.GetAnnotations()[clusterv1.MovedFromAnnotation]; got != string(src.GetUID()) {
				t.Errorf("moved-from %q", got)
			}
			if got := c.GetAnnotations()[clusterv1.InstanceKeyAnnotation]; got != tt.wantInstanceKey {
				t.Errorf("instance key %q, want %q", got, tt.wantInstanceKey)
			}
			if refs := c.GetOwnerReferences(); len(src.GetOwnerReferences()) > 0 && (len(refs) != 1 || refs[0].UID != "new-ms1") {
				t.Errorf("owner references %v", refs)
			}
			if !slices.Equal(c.GetFinalizers(), src.GetFinalizers()) {
				t.Errorf("finalizers %v", c.GetFinalizers())
			}
			st, ok := TargetStatus(src)
			if _, has := st["observedGeneration"]; !ok || has || st["providerID"] != "local://uid-m1" {
				t.Errorf("status to write %v", st)
			}
		})
	}
}

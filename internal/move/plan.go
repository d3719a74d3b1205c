package move

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/provider"
)

// PausedValue is the value of the paused annotation marina move puts on
// the objects it pauses: it takes off only the annotations it put, and a
// person's own pause survives the move.
const PausedValue = "marina-move"

// Kinds that move, by rank: with no owner reference between two objects,
// the lower rank is created first (an object's owners always are).
var rank = map[string]int{
	"MachineClass":       0,
	"ConfigMap":          1,
	"Secret":             1,
	"Cluster":            2,
	"MachineDeployment":  3,
	"MachineSet":         4,
	"Machine":            5,
	"MachineHealthCheck": 6,
}

// marinaKinds are the namespaced kinds every object of which moves and
// is deleted from the source; their controllers honour the paused
// annotation.
var marinaKinds = []string{"Cluster", "MachineDeployment", "MachineSet", "Machine", "MachineHealthCheck"}

// IsMarinaKind reports whether kind is one of marina's namespaced kinds.
func IsMarinaKind(kind string) bool { return slices.Contains(marinaKinds, kind) }

// Item is one object of a plan.
type Item struct {
	// Object is the source's object.
	Object *unstructured.Unstructured
	// Delete is true when the move deletes it from the source: marina's
	// objects and the Secrets and ConfigMaps they own. Those they only
	// name (a user's CA, a kubelet configuration) and the cluster-scoped
	// MachineClasses are copied and left where they are: other objects
	// may use them.
	Delete bool
}

// Plan is what a move does, in order.
type Plan struct {
	// Items in creation order: every object after its owners.
	Items []Item
}

// Key names an object within a kind, the same on both planes.
func Key(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetKind() + " " + o.GetName()
	}
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

// Providers are what a move knows of each providerSpec kind (the
// provider contract's Moving); a kind not in it has no references beyond
// the `*SecretRef` fields and may move.
type Providers map[schema.GroupVersionKind]provider.Moving

// BuildPlan chooses, from everything listed in the source namespace (its
// marina objects, Secrets and ConfigMaps) and the MachineClasses, what
// moves, and orders it. It refuses a cluster that is being deleted or
// upgraded, unless the move already paused it (a run again after a crash),
// and machines whose provider cannot move them.
func BuildPlan(objs []*unstructured.Unstructured, providers Providers) (*Plan, error) {
	chosen := map[types.UID]bool{} // true: deleted from the source too
	refs := map[string]bool{}      // Kind/name named by a chosen object
	classes := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		if o.GetKind() == "MachineClass" {
			classes[o.GetName()] = o
		}
	}
	refused := map[string][]string{} // refusal -> objects
	for _, o := range objs {
		if !IsMarinaKind(o.GetKind()) {
			continue
		}
		if err := refuse(o); err != nil {
			return nil, err
		}
		chosen[o.GetUID()] = true
		collectRefs(o.Object["spec"], refs)
		spec := machineSpec(o)
		if spec == nil {
			continue
		}
		gvk, specs := providerSpecs(spec, classes)
		rule := providers[gvk]
		if rule.Refusal != "" {
			refused[rule.Refusal] = append(refused[rule.Refusal], fmt.Sprintf("%s (%s)", Key(o), gvk.Kind))
		}
		if rule.References != nil {
			for _, ps := range specs {
				for _, r := range rule.References(ps) {
					refs[r.Kind+"/"+r.Name] = true
				}
			}
		}
	}
	if len(refused) > 0 {
		var why []string
		for reason, objs := range refused {
			why = append(why, strings.Join(objs, ", ")+": "+reason)
		}
		slices.Sort(why)
		return nil, fmt.Errorf("%w: %s", ErrCannotMove, strings.Join(why, "; "))
	}
	// Secrets and ConfigMaps owned, directly or through others, by a
	// chosen object go with it; a pass per level of ownership.
	for changed := true; changed; {
		changed = false
		for _, o := range objs {
			if chosen[o.GetUID()] || IsMarinaKind(o.GetKind()) {
				continue
			}
			for _, ref := range o.GetOwnerReferences() {
				if chosen[ref.UID] {
					chosen[o.GetUID()], changed = true, true
					break
				}
			}
		}
	}
	var items []Item
	for _, o := range objs {
		switch {
		case chosen[o.GetUID()]:
			items = append(items, Item{Object: o, Delete: true})
		case o.GetKind() != "MachineClass" && o.GetNamespace() != "" && refs[o.GetKind()+"/"+o.GetName()],
			o.GetKind() == "MachineClass" && refs["MachineClass/"+o.GetName()]:
			items = append(items, Item{Object: o})
		}
	}
	ordered, err := order(items)
	if err != nil {
		return nil, err
	}
	return &Plan{Items: ordered}, nil
}

// refuse says why o's cluster cannot move now.
func refuse(o *unstructured.Unstructured) error {
	if o.GetAnnotations()[clusterv1.PausedAnnotation] == PausedValue {
		return nil // paused by a move that is finishing
	}
	if o.GetDeletionTimestamp() != nil {
		return fmt.Errorf("%s is being deleted: wait until it is gone, then move", Key(o))
	}
	if o.GetKind() != "Cluster" {
		return nil
	}
	conds, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == clusterv1.ClusterUpgradeProgressingCondition && m["status"] == string(metav1.ConditionTrue) {
			return fmt.Errorf("%s is being upgraded (%s): wait until the upgrade ends (marina describe cluster %s), then move",
				Key(o), clusterv1.ClusterUpgradeProgressingCondition, o.GetName())
		}
	}
	return nil
}

// ErrCannotMove is wrapped by a refusal to move machines whose provider
// cannot change management plane.
var ErrCannotMove = errors.New("these machines cannot move to another management plane")

// machineSpec is the part of o that says how its machines are made: a
// machine's spec, a set's or deployment's template, the control plane.
func machineSpec(o *unstructured.Unstructured) map[string]any {
	var path []string
	switch o.GetKind() {
	case "Machine":
		path = []string{"spec"}
	case "MachineSet", "MachineDeployment":
		path = []string{"spec", "template", "spec"}
	case "Cluster":
		path = []string{"spec", "controlPlane"}
	default:
		return nil
	}
	spec, _, _ := unstructured.NestedMap(o.Object, path...)
	return spec
}

// providerSpecs resolves a machine spec's provider kind (its own
// providerSpec's, else its class's) and returns the provider's own specs
// that apply: the class's and the machine's overrides.
func providerSpecs(spec map[string]any, classes map[string]*unstructured.Unstructured) (schema.GroupVersionKind, []map[string]any) {
	var gvk schema.GroupVersionKind
	var specs []map[string]any
	add := func(ps map[string]any) {
		if ps == nil {
			return
		}
		apiVersion, _ := ps["apiVersion"].(string)
		kind, _ := ps["kind"].(string)
		if kind != "" && gvk.Kind == "" {
			gvk = schema.FromAPIVersionAndKind(apiVersion, kind)
		}
		if own, _ := ps["spec"].(map[string]any); own != nil {
			specs = append(specs, own)
		}
	}
	own, _, _ := unstructured.NestedMap(spec, "providerSpec")
	add(own)
	if name, _, _ := unstructured.NestedString(spec, "classRef", "name"); name != "" && classes[name] != nil {
		class, _, _ := unstructured.NestedMap(classes[name].Object, "spec", "providerSpec")
		add(class)
	}
	return gvk, specs
}

// collectRefs finds the objects a spec names: classRef (a MachineClass),
// kubeletConfigRef (a ConfigMap), caSecretRef and secretRef (Secrets),
// wherever they are (a machine, a template, the control plane).
func collectRefs(v any, refs map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, sub := range v {
			name, _, _ := unstructured.NestedString(v, k, "name")
			switch {
			case name == "":
			case k == "classRef":
				refs["MachineClass/"+name] = true
			case k == "kubeletConfigRef":
				refs["ConfigMap/"+name] = true
			case strings.HasSuffix(k, "ecretRef"):
				refs["Secret/"+name] = true
			}
			collectRefs(sub, refs)
		}
	case []any:
		for _, sub := range v {
			collectRefs(sub, refs)
		}
	}
}

// order sorts items so that each comes after its owners among them (ties:
// by rank, then key), or says which owner references form a cycle.
func order(items []Item) ([]Item, error) {
	slices.SortFunc(items, func(a, b Item) int {
		return cmp.Or(cmp.Compare(rank[a.Object.GetKind()], rank[b.Object.GetKind()]), cmp.Compare(Key(a.Object), Key(b.Object)))
	})
	in := map[types.UID]bool{}
	for _, it := range items {
		in[it.Object.GetUID()] = true
	}
	done := map[types.UID]bool{}
	var out []Item
	for len(out) < len(items) {
		progressed := false
		for _, it := range items {
			uid := it.Object.GetUID()
			if done[uid] || !ownersDone(it.Object, in, done) {
				continue
			}
			done[uid], progressed = true, true
			out = append(out, it)
			break // start again from the lowest rank
		}
		if !progressed {
			var stuck []string
			for _, it := range items {
				if !done[it.Object.GetUID()] {
					stuck = append(stuck, Key(it.Object))
				}
			}
			return nil, fmt.Errorf("owner references form a cycle among %s", strings.Join(stuck, ", "))
		}
	}
	return out, nil
}

func ownersDone(o *unstructured.Unstructured, in, done map[types.UID]bool) bool {
	for _, ref := range o.GetOwnerReferences() {
		if in[ref.UID] && !done[ref.UID] {
			return false
		}
	}
	return true
}

// RebuildOwners maps owner references to the target's UIDs (target: source
// UID to target UID). A reference to an owner that does not move is
// dropped and returned: kept, it would name no object on the target, and
// the garbage collector deletes what only such owners hold.
func RebuildOwners(refs []metav1.OwnerReference, target map[types.UID]types.UID) (kept, dropped []metav1.OwnerReference) {
	for _, ref := range refs {
		uid, ok := target[ref.UID]
		if !ok {
			dropped = append(dropped, ref)
			continue
		}
		ref.UID = uid
		kept = append(kept, ref)
	}
	return kept, dropped
}

// TargetCopy is what is created on the target for src: its metadata
// without what the source's API server assigned, owner references
// rebuilt (see RebuildOwners), the moved-from annotation, on Clusters and
// Machines the instance key their provider knows them by, and no status
// (written next, through the status subresource).
func TargetCopy(src *unstructured.Unstructured, target map[types.UID]types.UID) *unstructured.Unstructured {
	c := src.DeepCopy()
	for _, f := range []string{"uid", "resourceVersion", "creationTimestamp", "managedFields", "generation", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"} {
		unstructured.RemoveNestedField(c.Object, "metadata", f)
	}
	delete(c.Object, "status")
	kept, _ := RebuildOwners(src.GetOwnerReferences(), target)
	c.SetOwnerReferences(kept)
	ann := c.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[clusterv1.MovedFromAnnotation] = string(src.GetUID())
	if k := src.GetKind(); k == "Cluster" || k == "Machine" {
		ann[clusterv1.InstanceKeyAnnotation] = string(clusterv1.InstanceKey(src))
	}
	c.SetAnnotations(ann)
	return c
}

// TargetStatus is the status written on src's copy: the source's, without
// observedGeneration, so that the target's controller shows it looked
// (observedGeneration = generation) only once it did.
func TargetStatus(src *unstructured.Unstructured) (map[string]any, bool) {
	st, ok, _ := unstructured.NestedMap(src.Object, "status")
	if !ok {
		return nil, false
	}
	delete(st, "observedGeneration")
	return st, true
}

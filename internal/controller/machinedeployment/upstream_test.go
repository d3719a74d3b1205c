package machinedeployment

import (
	"context"
	"fmt"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
)

// The rules of cluster-autoscaler's clusterapi provider
// (kubernetes/autoscaler, cluster-autoscaler/cloudprovider/clusterapi), as
// its published source applies them, rewritten here over unstructured
// objects read from the API server (not vendored, not marina's helpers).
// Each function names the upstream file and function it follows. CAPI_GROUP
// is cluster.marina.dev; the keys upstream hard-codes whatever CAPI_GROUP
// are spelled out as upstream spells them.
const (
	capiGroup = clusterv1.GroupName
	// clusterapi_utils.go: machineDeploymentRevisionAnnotation and
	// machineDeploymentNameLabel, constants outside CAPI_GROUP.
	upstreamRevisionKey       = "machinedeployment.clusters.x-k8s.io/revision"
	upstreamDeploymentNameKey = "cluster.x-k8s.io/deployment-name"
	// clusterapi_utils.go: getNodeGroupMinSizeAnnotationKey,
	// getNodeGroupMaxSizeAnnotationKey, getMachineDeleteAnnotationKey,
	// getMachineAnnotationKey, getClusterNamespaceAnnotationKey.
	minSizeKey          = capiGroup + "/cluster-api-autoscaler-node-group-min-size"
	maxSizeKey          = capiGroup + "/cluster-api-autoscaler-node-group-max-size"
	deleteMachineKey    = capiGroup + "/delete-machine"
	nodeMachineKey      = capiGroup + "/machine"
	nodeClusterNSKey    = capiGroup + "/cluster-namespace"
	capacityKey         = "capacity.cluster-autoscaler.kubernetes.io/"
	upstreamDefaultPods = 110 // clusterapi_nodegroup.go: defaultMaxPods
)

// list reads every object of kind in ns as the provider's dynamic
// informers hold them.
func list(t *testing.T, ns, kind string) []unstructured.Unstructured {
	t.Helper()
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(clusterv1.GroupVersion.WithKind(kind + "List"))
	if err := mgmt.Client.List(context.Background(), l, client.InNamespace(ns)); err != nil {
		t.Fatalf("listing %s: %v", kind, err)
	}
	return l.Items
}

// clusterapi_utils.go, parseScalingBounds (with minSize and maxSize):
// missing annotations count as 0, a non-integer or negative value or max
// below min is an error.
func upstreamScalingBounds(a map[string]string) (minSize, maxSize int, err error) {
	parse := func(key string) (int, error) {
		v, ok := a[key]
		if !ok {
			return 0, nil
		}
		return strconv.Atoi(v)
	}
	if minSize, err = parse(minSizeKey); err != nil || minSize < 0 {
		return 0, 0, fmt.Errorf("invalid min annotation %q", a[minSizeKey])
	}
	if maxSize, err = parse(maxSizeKey); err != nil || maxSize < 0 || maxSize < minSize {
		return 0, 0, fmt.Errorf("invalid max annotation %q", a[maxSizeKey])
	}
	return minSize, maxSize, nil
}

// clusterapi_utils.go, getOwnerForKind.
func ownerOfKind(u *unstructured.Unstructured, kind string) *metav1.OwnerReference {
	for _, ref := range u.GetOwnerReferences() {
		if ref.Kind == kind && ref.Name != "" {
			return &ref
		}
	}
	return nil
}

// clusterapi_utils.go, clusterNameFromResource: spec.clusterName, else the
// <group>/cluster-name label.
func clusterNameOf(u *unstructured.Unstructured) string {
	if n, ok, _ := unstructured.NestedString(u.Object, "spec", "clusterName"); ok {
		return n
	}
	return u.GetLabels()[capiGroup+"/cluster-name"]
}

// upstreamNodeGroups are the node groups the provider discovers in ns for
// cluster, by ID ("MachineDeployment/ns/name"), with their bounds:
// clusterapi_controller.go, listScalableResources and listResources
// (MachineSets owned by a MachineDeployment are skipped), then
// clusterapi_nodegroup.go, newNodeGroupFromScalableResource (bounds parsed
// by newUnstructuredScalableResource in clusterapi_unstructured.go; a
// group at 0 replicas needs CanScaleFromZero; max 0 or max < min is no
// group).
func upstreamNodeGroups(t *testing.T, ns, cluster string) map[string][2]int {
	t.Helper()
	out := map[string][2]int{}
	var all []unstructured.Unstructured
	for _, kind := range []string{"MachineSet", "MachineDeployment"} {
		all = append(all, list(t, ns, kind)...)
	}
	for i := range all {
		u := &all[i]
		if clusterNameOf(u) != cluster || u.GetKind() == "MachineSet" && ownerOfKind(u, "MachineDeployment") != nil {
			continue
		}
		minSize, maxSize, err := upstreamScalingBounds(u.GetAnnotations())
		if err != nil {
			continue // newUnstructuredScalableResource fails: no node group
		}
		replicas, found, _ := unstructured.NestedInt64(u.Object, "spec", "replicas")
		if found && replicas == 0 && !upstreamCanScaleFromZero(u.GetAnnotations()) {
			continue
		}
		if maxSize-minSize < 0 || maxSize == 0 {
			continue
		}
		out[path.Join(u.GetKind(), u.GetNamespace(), u.GetName())] = [2]int{minSize, maxSize}
	}
	return out
}

// clusterapi_nodegroup.go, (*nodegroup).IsMachineDeploymentAndRollingOut,
// which clusterapi_processors.go's ScaleDownNodeUpgradeProcessor asks for
// every scale-down candidate: the deployment is rolling out while a
// MachineSet other than the one of the highest
// machinedeployment.clusters.x-k8s.io/revision has spec or status replicas.
// Sets without that annotation are skipped when finding the highest, so
// with none annotated every set with replicas counts as old. The sets are
// found as clusterapi_controller.go's listMachineSetsForMachineDeployment
// finds them; that function's body is not in the source read for this
// test, so this uses the deployment's cluster.x-k8s.io/deployment-name
// label (clusterapi_utils.go, machineDeploymentNameLabel) in its namespace.
func upstreamRollingOut(t *testing.T, md *clusterv1.MachineDeployment) bool {
	t.Helper()
	var sets []unstructured.Unstructured
	for _, ms := range list(t, md.Namespace, "MachineSet") {
		if ms.GetLabels()[upstreamDeploymentNameKey] == md.Name {
			sets = append(sets, ms)
		}
	}
	if len(sets) == 0 {
		return false
	}
	var latest int64
	for _, ms := range sets {
		v, ok := ms.GetAnnotations()[upstreamRevisionKey]
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("machineset %s: %s %q is not a number: upstream fails here", ms.GetName(), upstreamRevisionKey, v)
		}
		latest = max(latest, n)
	}
	for _, ms := range sets {
		if ms.GetAnnotations()[upstreamRevisionKey] == strconv.FormatInt(latest, 10) {
			continue
		}
		for _, field := range []string{"spec", "status"} {
			if r, found, _ := unstructured.NestedInt64(ms.Object, field, "replicas"); found && r > 0 {
				return true
			}
		}
	}
	return false
}

// clusterapi_utils.go, normalizedProviderString: the part after the last /.
func normalizedProviderID(s string) string { return s[strings.LastIndex(s, "/")+1:] }

// upstreamMachineForNode finds a Node's Machine as
// clusterapi_controller.go's findMachineByProviderID does: the machine
// whose spec.providerID normalizes to the Node's (the
// machineProviderIDIndex of indexMachineByProviderID), else, for machines
// without spec.providerID, the Node's <group>/machine and
// <group>/cluster-namespace annotations. by says which path found it.
func upstreamMachineForNode(t *testing.T, node *corev1.Node, ns string) (m *unstructured.Unstructured, by string) {
	t.Helper()
	want := normalizedProviderID(node.Spec.ProviderID)
	machines := list(t, ns, "Machine")
	for i := range machines {
		if id, ok, _ := unstructured.NestedString(machines[i].Object, "spec", "providerID"); ok && id != "" && normalizedProviderID(id) == want {
			return &machines[i], "spec.providerID"
		}
	}
	key := path.Join(node.Annotations[nodeClusterNSKey], node.Annotations[nodeMachineKey])
	for i := range machines {
		if path.Join(machines[i].GetNamespace(), machines[i].GetName()) == key {
			return &machines[i], "node annotations"
		}
	}
	return nil, ""
}

// upstreamNodeGroupOfMachine is clusterapi_controller.go's
// findScalableResourceByProviderID after the machine is found: its
// MachineSet owner (findMachineOwner), then that set's MachineDeployment
// owner (findMachineSetOwner), as "Kind/ns/name".
func upstreamNodeGroupOfMachine(t *testing.T, m *unstructured.Unstructured) string {
	t.Helper()
	ref := ownerOfKind(m, "MachineSet")
	if ref == nil {
		return ""
	}
	for _, ms := range list(t, m.GetNamespace(), "MachineSet") {
		if ms.GetName() != ref.Name {
			continue
		}
		if mdRef := ownerOfKind(&ms, "MachineDeployment"); mdRef != nil {
			return path.Join("MachineDeployment", m.GetNamespace(), mdRef.Name)
		}
		return path.Join("MachineSet", m.GetNamespace(), ms.GetName())
	}
	return ""
}

// upstreamProviderIDs is clusterapi_controller.go's
// findScalableResourceProviderIDs for a MachineDeployment: its machines
// (listMachinesForScalableResource: spec.selector, same namespace and
// cluster), each as a failed-machine-, deleting-machine- or
// pending-machine- ID, its spec.providerID, or its Node's spec.providerID
// through status.nodeRef.name. Only a machine with spec.providerID is ever
// reported as deleting.
func upstreamProviderIDs(t *testing.T, md *clusterv1.MachineDeployment, nodes map[string]*corev1.Node) []string {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(&md.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range list(t, md.Namespace, "Machine") {
		if !sel.Matches(labels.Set(m.GetLabels())) || clusterNameOf(&m) != md.Spec.ClusterName {
			continue
		}
		if _, failed, _ := unstructured.NestedString(m.Object, "status", "failureMessage"); failed {
			ids = append(ids, "failed-machine-"+m.GetNamespace()+"_"+m.GetName())
			continue
		}
		if id, ok, _ := unstructured.NestedString(m.Object, "spec", "providerID"); ok && id != "" {
			if m.GetDeletionTimestamp() != nil {
				id = "deleting-machine-" + m.GetNamespace() + "_" + m.GetName()
			}
			ids = append(ids, id)
			continue
		}
		if _, ok, _ := unstructured.NestedFieldCopy(m.Object, "status", "nodeRef"); !ok {
			ids = append(ids, "pending-machine-"+m.GetNamespace()+"_"+m.GetName())
			continue
		}
		if kind, ok, _ := unstructured.NestedString(m.Object, "status", "nodeRef", "kind"); ok && kind != "Node" {
			continue
		}
		name, _, _ := unstructured.NestedString(m.Object, "status", "nodeRef", "name")
		if n := nodes[name]; n != nil {
			ids = append(ids, n.Spec.ProviderID)
		}
	}
	return ids
}

// upstreamTemplateNode is the scale-from-zero node of a node group:
// clusterapi_unstructured.go, CanScaleFromZero (cpu and memory needed),
// InstanceCapacity (cpu, memory, ephemeral-disk, gpu-type with gpu-count,
// maxPods defaulting to 110), Labels ("k=v,..." split on the first =) and
// Taints (parseTaint), as clusterapi_nodegroup.go's TemplateNodeInfo
// assembles them.
func upstreamTemplateNode(a map[string]string) (*corev1.Node, error) {
	if !upstreamCanScaleFromZero(a) {
		return nil, fmt.Errorf("cannot scale from zero: %s and %s are needed", capacityKey+"cpu", capacityKey+"memory")
	}
	capacity := corev1.ResourceList{}
	for key, name := range map[string]corev1.ResourceName{"cpu": corev1.ResourceCPU, "memory": corev1.ResourceMemory, "ephemeral-disk": corev1.ResourceEphemeralStorage} {
		if v := a[capacityKey+key]; v != "" {
			q, err := resource.ParseQuantity(v)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", key, err)
			}
			if !q.IsZero() {
				capacity[name] = q
			}
		}
	}
	intKey := func(key string) (int64, error) {
		if v := a[capacityKey+key]; v != "" {
			return strconv.ParseInt(v, 10, 0)
		}
		return 0, nil
	}
	gpus, err := intKey("gpu-count")
	if err != nil {
		return nil, fmt.Errorf("gpu-count: %w", err)
	}
	if gpus != 0 && a[capacityKey+"gpu-type"] != "" {
		capacity[corev1.ResourceName(a[capacityKey+"gpu-type"])] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	pods, err := intKey("maxPods")
	if err != nil {
		return nil, fmt.Errorf("maxPods: %w", err)
	}
	if pods == 0 {
		pods = upstreamDefaultPods
	}
	capacity[corev1.ResourcePods] = *resource.NewQuantity(pods, resource.DecimalSI)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{}}}
	node.Status.Capacity = capacity
	if v, ok := a[capacityKey+"labels"]; ok {
		for _, kv := range strings.Split(v, ",") {
			if k, val, ok := strings.Cut(kv, "="); ok {
				node.Labels[k] = val
			}
		}
	}
	if v, ok := a[capacityKey+"taints"]; ok {
		for _, s := range strings.Split(v, ",") {
			kv, effect, ok := strings.Cut(s, ":")
			if !ok || strings.Contains(effect, ":") {
				return nil, fmt.Errorf("invalid taint spec %q: upstream drops it", s)
			}
			k, val, _ := strings.Cut(kv, "=")
			node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: k, Value: val, Effect: corev1.TaintEffect(effect)})
		}
	}
	return node, nil
}

// clusterapi_unstructured.go, CanScaleFromZero: cpu and memory capacity
// annotations, neither zero (InstanceCapacity drops zero quantities).
func upstreamCanScaleFromZero(a map[string]string) bool {
	for _, key := range []string{"cpu", "memory"} {
		q, err := resource.ParseQuantity(a[capacityKey+key])
		if err != nil || q.IsZero() {
			return false
		}
	}
	return true
}

// upstreamDeleteNode removes a node as clusterapi_nodegroup.go's
// (*nodegroup).DeleteNodes does: refuse below the min size, mark the
// node's machine (clusterapi_unstructured.go, MarkMachineForDeletion: an
// Update of the Machine with <group>/delete-machine set to the time), then
// lower the node group's replicas by one through the scale subresource
// (SetSize).
func upstreamDeleteNode(t *testing.T, md *clusterv1.MachineDeployment, node *corev1.Node) {
	t.Helper()
	cur := get(t, md.DeepCopy())
	minSize, _, err := upstreamScalingBounds(cur.Annotations)
	if err != nil || int(*cur.Spec.Replicas) <= minSize {
		t.Fatalf("node group at its min size %d (replicas %d, %v): upstream deletes nothing", minSize, *cur.Spec.Replicas, err)
	}
	m, _ := upstreamMachineForNode(t, node, md.Namespace)
	if m == nil {
		t.Fatalf("no machine found for node %s", node.Name)
	}
	a := m.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[deleteMachineKey] = "2026-12-05 00:00:00 +0000 UTC"
	m.SetAnnotations(a)
	if err := mgmt.Client.Update(context.Background(), m); err != nil {
		t.Fatalf("marking machine %s for deletion: %v", m.GetName(), err)
	}
	scaleTo(t, cur, *cur.Spec.Replicas-1)
}

// nodesByName reads the workload cluster's Nodes.
func nodesByName(t *testing.T) map[string]*corev1.Node {
	t.Helper()
	l := &corev1.NodeList{}
	if err := workload.Client.List(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	out := map[string]*corev1.Node{}
	for i := range l.Items {
		out[l.Items[i].Name] = &l.Items[i]
	}
	return out
}

// TestUpstreamAutoscalerContract runs the clusterapi provider's rules
// above against a MachineDeployment and its sets, machines and Nodes as
// marina's controllers make them, through a rollout: node-group discovery
// and sizes, the scale-from-zero node, Node to Machine to node group, the
// group's instances, rolling-out detection before, during and after the
// rollout, and the removal of a node the autoscaler picks in the middle of
// the rollout.
func TestUpstreamAutoscalerContract(t *testing.T) {
	f := suite.NewFixture(t)
	start(f)
	class := &clusterv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Name: f.NS + "-ca"},
		Spec: clusterv1.MachineClassSpec{
			ProviderSpec: runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":4,"memory":"16Gi","pods":64,"gpus":2}}`)},
			NodeTemplate: clusterv1.NodeTemplate{
				Labels: map[string]string{"node.marina.dev/class": "ca"},
				Taints: []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}},
				Capacity: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16Gi"),
					corev1.ResourcePods: resource.MustParse("64"), "nvidia.com/gpu": resource.MustParse("2"),
				},
			},
		},
	}
	create(t, class)
	t.Cleanup(func() { _ = mgmt.Client.Delete(context.Background(), class) })
	md := newDeployment(f, "ca", 2, 1, 0)
	md.Annotations = map[string]string{minSizeKey: "1", maxSizeKey: "5"}
	md.Spec.Template.Spec.ProviderSpec = nil
	md.Spec.Template.Spec.ClassRef = &clusterv1.MachineClassReference{Name: class.Name}
	create(t, md)
	md = waitSettled(t, md, 2, "v1", rollTimeout)
	id := path.Join("MachineDeployment", md.Namespace, md.Name)

	// Discovery: the deployment is the one node group, with its bounds; its
	// MachineSet is not one.
	if got := upstreamNodeGroups(t, f.NS, f.Cluster); len(got) != 1 || got[id] != [2]int{1, 5} {
		t.Errorf("node groups %v, want only %s with min 1 max 5", got, id)
	}

	// Scale from zero: the node the autoscaler would simulate.
	testenv.Eventually(t, 30*time.Second, "the scale-from-zero node", func() error {
		node, err := upstreamTemplateNode(unstructuredOf(t, md).annotations())
		if err != nil {
			return err
		}
		c := node.Status.Capacity
		for name, want := range map[corev1.ResourceName]string{corev1.ResourceCPU: "4", corev1.ResourceMemory: "16Gi", corev1.ResourcePods: "64", "nvidia.com/gpu": "2"} {
			if q, ok := c[name]; !ok || q.Cmp(resource.MustParse(want)) != 0 {
				return fmt.Errorf("capacity %s = %v, want %s", name, c[name], want)
			}
		}
		if node.Labels["node.marina.dev/class"] != "ca" || node.Labels["tier"] != "v1" {
			return fmt.Errorf("labels %v", node.Labels)
		}
		if len(node.Spec.Taints) != 1 || node.Spec.Taints[0] != (corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}) {
			return fmt.Errorf("taints %v", node.Spec.Taints)
		}
		return nil
	})

	// Node to Machine to node group, and the group's instances.
	checkNodes := func(want int) map[string]*corev1.Node {
		t.Helper()
		var nodes map[string]*corev1.Node
		testenv.Eventually(t, 30*time.Second, "every Node to lead to its Machine and the node group", func() error {
			nodes = nodesByName(t)
			var live []string
			for _, m := range machinesIn(t, f.NS) {
				if m.Status.NodeRef == nil || !m.DeletionTimestamp.IsZero() {
					continue
				}
				node := nodes[m.Status.NodeRef.Name]
				if node == nil {
					return fmt.Errorf("machine %s: no Node %s", m.Name, m.Status.NodeRef.Name)
				}
				found, by := upstreamMachineForNode(t, node, f.NS)
				if found == nil || found.GetName() != m.Name {
					return fmt.Errorf("node %s (providerID %q, annotations %v) leads to no machine or the wrong one", node.Name, node.Spec.ProviderID, node.Annotations)
				}
				if by != "spec.providerID" {
					// Found all the same through the Node's annotations, but
					// upstream then cannot tell a machine being deleted.
					return fmt.Errorf("node %s: machine %s found by %s: spec.providerID %q, status.providerID %q",
						node.Name, m.Name, by, m.Spec.ProviderID, m.Status.ProviderID)
				}
				if g := upstreamNodeGroupOfMachine(t, found); g != id {
					return fmt.Errorf("node %s: node group %q, want %s", node.Name, g, id)
				}
				t.Logf("node %s -> machine %s (by %s) -> %s", node.Name, m.Name, by, id)
				live = append(live, node.Spec.ProviderID)
			}
			if len(live) != want {
				return fmt.Errorf("%d machines with Nodes, want %d", len(live), want)
			}
			ids := upstreamProviderIDs(t, get(t, md.DeepCopy()), nodes)
			for _, p := range live {
				if !slicesContains(ids, p) {
					return fmt.Errorf("instances %v lack %s", ids, p)
				}
			}
			return nil
		})
		return nodes
	}
	checkNodes(2)

	// Settled: not rolling out, so scale-down may pick its nodes.
	if upstreamRollingOut(t, md) {
		t.Errorf("a settled deployment is taken for one rolling out (sets' annotations: %v): the autoscaler would never scale it down", setAnnotations(t, md))
	}

	// A rollout that waits: the new machine gets Ready, but minReadySeconds
	// keeps it from being available, so old machines stay.
	update(t, md, func(md *clusterv1.MachineDeployment) {
		md.Spec.MinReadySeconds = 3600
		md.Spec.Template.Spec.Labels["tier"] = "v2"
	})
	var fresh clusterv1.Machine
	testenv.Eventually(t, rollTimeout, "a Ready machine of the new template", func() error {
		for _, m := range machinesIn(t, f.NS) {
			if m.Spec.Labels["tier"] == "v2" && m.Status.NodeRef != nil && m.DeletionTimestamp.IsZero() {
				fresh = m
				return nil
			}
		}
		return fmt.Errorf("none yet")
	})
	if !upstreamRollingOut(t, md) {
		t.Errorf("a deployment in the middle of a rollout is not taken for one rolling out (sets' annotations: %v)", setAnnotations(t, md))
	}
	nodes := checkNodes(3)

	// The autoscaler removes the new node (say it was unregistered too
	// long): that machine goes, not an old one.
	old := map[string]bool{}
	for _, m := range machinesIn(t, f.NS) {
		if m.Spec.Labels["tier"] == "v1" {
			old[m.Name] = true
		}
	}
	upstreamDeleteNode(t, md, nodes[fresh.Status.NodeRef.Name])
	testenv.Eventually(t, rollTimeout, "the marked machine of the new set to be the one removed", func() error {
		freshGone := true
		var oldGoing []string
		kept := map[string]bool{}
		for _, m := range machinesIn(t, f.NS) {
			switch {
			case m.Name == fresh.Name:
				freshGone = !m.DeletionTimestamp.IsZero()
				if freshGone {
					// While it drains, upstream counts it as leaving, not
					// as a running node (if this pass catches it then).
					// The group's listing comes after this pass's: a machine
					// missing from it must be gone by now, not still there.
					ids := upstreamProviderIDs(t, get(t, md.DeepCopy()), nodesByName(t))
					if want := "deleting-machine-" + m.Namespace + "_" + m.Name; !slicesContains(ids, want) && machineExists(t, m.Namespace, m.Name) {
						t.Errorf("machine %s is being deleted, but the group's instances %v lack %s", m.Name, ids, want)
					}
				}
			case !m.DeletionTimestamp.IsZero():
				oldGoing = append(oldGoing, m.Name)
			default:
				kept[m.Name] = true
			}
		}
		for name := range old {
			if !kept[name] && !slicesContains(oldGoing, name) {
				oldGoing = append(oldGoing, name)
			}
		}
		if len(oldGoing) > 0 && !freshGone {
			t.Fatalf("machines %v are removed while the marked %s stays", oldGoing, fresh.Name)
		}
		if !freshGone {
			return fmt.Errorf("machine %s still there", fresh.Name)
		}
		return nil
	})

	// The rollout completes: no longer rolling out.
	update(t, md, func(md *clusterv1.MachineDeployment) { md.Spec.MinReadySeconds = 0 })
	waitSettled(t, md, 1, "v2", rollTimeout)
	// The old set's status may report its last machine for one more pass
	// after the deployment's already counts it gone; it must follow.
	testenv.Eventually(t, 30*time.Second, "a completed rollout no longer taken for one rolling out", func() error {
		if upstreamRollingOut(t, md) {
			return fmt.Errorf("taken for one rolling out (sets' annotations: %v)", setAnnotations(t, md))
		}
		return nil
	})
	checkNodes(1)
}

// machineExists says whether the machine ns/name is still stored.
func machineExists(t *testing.T, ns, name string) bool {
	t.Helper()
	for _, m := range list(t, ns, "Machine") {
		if m.GetName() == name {
			return true
		}
	}
	return false
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func setAnnotations(t *testing.T, md *clusterv1.MachineDeployment) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, ms := range setsOf(t, md) {
		out[ms.Name] = ms.Annotations
	}
	return out
}

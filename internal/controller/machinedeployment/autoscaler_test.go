package machinedeployment

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
)

// The contract of cluster-autoscaler's clusterapi provider, run unmodified
// with CAPI_GROUP=cluster.marina.dev, checked the way that provider reads
// the objects (unstructured fields, annotation strings, owner references,
// the scale subresource), not through marina's Go helpers:
//
//   - a node group is a MachineDeployment (or a MachineSet without one)
//     carrying both <group>/cluster-api-autoscaler-node-group-{min,max}-size;
//   - scale from zero reads capacity.cluster-autoscaler.kubernetes.io/*
//     from the node group;
//   - MachineSets of a deployment are found by the controller owner
//     reference of kind MachineDeployment, and carry the hard-coded
//     cluster.x-k8s.io/deployment-name label;
//   - a node group's machines are those matching spec.selector with
//     spec.clusterName; a machine's set is its owner reference of kind
//     MachineSet; a machine is tied to its Node by spec.providerID (before
//     the machine controller copied it there, by status.nodeRef.name), and
//     a Node to its machine by the <group>/machine and
//     <group>/cluster-namespace annotations too;
//   - scaling reads and writes the scale subresource; removing a given node
//     annotates its Machine with <group>/delete-machine, then lowers replicas.
func TestAutoscalerContract(t *testing.T) {
	f := suite.NewFixture(t)
	start(f)
	ctx := context.Background()
	const group = "cluster.marina.dev"

	class := &clusterv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Name: f.NS + "-gpu"},
		Spec: clusterv1.MachineClassSpec{
			ProviderSpec: runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":4,"memory":"16Gi","pods":64,"gpus":2}}`)},
			NodeTemplate: clusterv1.NodeTemplate{
				Labels: map[string]string{"node.marina.dev/class": "gpu"},
				Taints: []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}},
				Capacity: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16Gi"),
					corev1.ResourceEphemeralStorage: resource.MustParse("50Gi"), corev1.ResourcePods: resource.MustParse("64"),
					"nvidia.com/gpu": resource.MustParse("2"),
				},
			},
		},
	}
	create(t, class)
	t.Cleanup(func() { _ = mgmt.Client.Delete(context.Background(), class) })
	md := newDeployment(f, "gpu", 1, 1, 0)
	md.Annotations = map[string]string{
		group + "/cluster-api-autoscaler-node-group-min-size": "0",
		group + "/cluster-api-autoscaler-node-group-max-size": "5",
	}
	md.Spec.Template.Spec.ProviderSpec = nil
	md.Spec.Template.Spec.ClassRef = &clusterv1.MachineClassReference{Name: class.Name}
	create(t, md)
	md = waitSettled(t, md, 1, "v1", rollTimeout)

	// The node group and its size bounds, exactly as the provider parses them.
	u := unstructuredOf(t, md)
	for key, want := range map[string]int{
		group + "/cluster-api-autoscaler-node-group-min-size": 0,
		group + "/cluster-api-autoscaler-node-group-max-size": 5,
	} {
		if n, err := strconv.Atoi(u.annotations()[key]); err != nil || n != want {
			t.Errorf("annotation %s = %q, want %d", key, u.annotations()[key], want)
		}
	}
	if c := condition(md.Status.Conditions, clusterv1.NodeGroupSizeValidCondition); !strings.HasPrefix(c, "True") {
		t.Errorf("NodeGroupSizeValid %s", c)
	}
	if u.str("spec", "clusterName") != f.Cluster {
		t.Errorf("spec.clusterName %q", u.str("spec", "clusterName"))
	}

	// Scale from zero: capacity annotations on the node group.
	testenv.Eventually(t, 30*time.Second, "the capacity annotations", func() error {
		a := unstructuredOf(t, md).annotations()
		for key, want := range map[string]string{"cpu": "4", "memory": "16Gi", "ephemeral-disk": "50Gi"} {
			q, err := resource.ParseQuantity(a["capacity.cluster-autoscaler.kubernetes.io/"+key])
			if err != nil || q.Cmp(resource.MustParse(want)) != 0 {
				return fmt.Errorf("%s: %q (%v), want %s", key, a["capacity.cluster-autoscaler.kubernetes.io/"+key], err, want)
			}
		}
		for key, want := range map[string]int{"maxPods": 64, "gpu-count": 2} {
			if n, err := strconv.Atoi(a["capacity.cluster-autoscaler.kubernetes.io/"+key]); err != nil || n != want {
				return fmt.Errorf("%s: %q, want %d", key, a["capacity.cluster-autoscaler.kubernetes.io/"+key], want)
			}
		}
		if got := a["capacity.cluster-autoscaler.kubernetes.io/gpu-type"]; got != "nvidia.com/gpu" {
			return fmt.Errorf("gpu-type %q", got)
		}
		gotLabels := map[string]string{}
		for _, kv := range strings.Split(a["capacity.cluster-autoscaler.kubernetes.io/labels"], ",") {
			k, v, _ := strings.Cut(kv, "=")
			gotLabels[k] = v
		}
		if want := map[string]string{"node.marina.dev/class": "gpu", "tier": "v1"}; !maps.Equal(gotLabels, want) {
			return fmt.Errorf("labels %v, want %v", gotLabels, want)
		}
		taints := strings.Split(a["capacity.cluster-autoscaler.kubernetes.io/taints"], ",")
		if !slices.Equal(taints, []string{"nvidia.com/gpu=present:NoSchedule"}) {
			return fmt.Errorf("taints %v", taints)
		}
		return nil
	})

	// The deployment's set: owner reference and hard-coded label.
	sets := setsOf(t, md)
	if len(sets) != 1 {
		t.Fatalf("%d sets", len(sets))
	}
	ms := sets[0]
	if ref := metav1.GetControllerOf(&ms); ref == nil || ref.Kind != "MachineDeployment" || ref.Name != md.Name {
		t.Errorf("set owner %v", ref)
	}
	if ms.Labels["cluster.x-k8s.io/deployment-name"] != md.Name {
		t.Errorf("set labels %v lack cluster.x-k8s.io/deployment-name=%s", ms.Labels, md.Name)
	}

	// The scale subresource: replicas and a selector that finds the machines.
	scale := &autoscalingv1.Scale{}
	if err := mgmt.Client.SubResource("scale").Get(ctx, md, scale); err != nil {
		t.Fatal(err)
	}
	sel, err := labels.Parse(scale.Status.Selector)
	if err != nil || scale.Spec.Replicas != 1 || scale.Status.Replicas != 1 {
		t.Fatalf("scale %+v (selector error %v)", scale, err)
	}

	// Machines, and Node to Machine and back.
	scaleTo(t, md, 2)
	var machines []clusterv1.Machine
	testenv.Eventually(t, rollTimeout, "two machines with Nodes", func() error {
		machines = machinesIn(t, f.NS)
		if len(machines) != 2 {
			return fmt.Errorf("%d machines", len(machines))
		}
		for _, m := range machines {
			if m.Status.NodeRef == nil {
				return fmt.Errorf("machine %s has no nodeRef", m.Name)
			}
		}
		return nil
	})
	for _, m := range machines {
		if !sel.Matches(labels.Set(m.Labels)) || m.Spec.ClusterName != f.Cluster {
			t.Errorf("machine %s (labels %v) is not found by the node group's selector %s", m.Name, m.Labels, sel)
		}
		if ref := metav1.GetControllerOf(&m); ref == nil || ref.Kind != "MachineSet" || ref.Name != ms.Name {
			t.Errorf("machine %s owner %v", m.Name, ref)
		}
		mu := unstructuredOf(t, &m)
		node := &corev1.Node{}
		if err := workload.Client.Get(ctx, client.ObjectKey{Name: mu.str("status", "nodeRef", "name")}, node); err != nil {
			t.Fatalf("machine %s: its status.nodeRef.name names no Node: %v", m.Name, err)
		}
		if node.Spec.ProviderID == "" || node.Spec.ProviderID != m.Status.ProviderID {
			t.Errorf("node %s providerID %q, machine %q", node.Name, node.Spec.ProviderID, m.Status.ProviderID)
		}
		testenv.Eventually(t, 30*time.Second, "spec.providerID", func() error {
			if got := unstructuredOf(t, &m).str("spec", "providerID"); got != node.Spec.ProviderID {
				return fmt.Errorf("machine %s spec.providerID %q, node's %q", m.Name, got, node.Spec.ProviderID)
			}
			return nil
		})
		testenv.Eventually(t, 30*time.Second, "node annotations", func() error {
			if err := workload.Client.Get(ctx, client.ObjectKeyFromObject(node), node); err != nil {
				return err
			}
			a := node.Annotations
			if a[group+"/machine"] != m.Name || a[group+"/cluster-namespace"] != f.NS || a[group+"/cluster-name"] != f.Cluster {
				return fmt.Errorf("node %s annotations %v", node.Name, a)
			}
			return nil
		})
		if !hasLabel(node, "node.marina.dev/class", "gpu") {
			t.Errorf("node %s lacks the class label the capacity annotation promised", node.Name)
		}
	}

	// Removing a chosen node: annotate its machine, then lower replicas.
	victim := machines[1]
	update(t, &victim, func(m *clusterv1.Machine) {
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[group+"/delete-machine"] = time.Now().UTC().Format(time.RFC3339)
	})
	scaleTo(t, md, 1)
	testenv.Eventually(t, rollTimeout, "the annotated machine to be the one removed", func() error {
		left := machinesIn(t, f.NS)
		if len(left) != 1 {
			return fmt.Errorf("%d machines", len(left))
		}
		if left[0].Name != machines[0].Name {
			return fmt.Errorf("machine %s was removed instead of the annotated %s", machines[0].Name, victim.Name)
		}
		return nil
	})

	// A bad annotation is reported, naming it; nothing is scaled for it.
	update(t, md, func(md *clusterv1.MachineDeployment) {
		md.Annotations[group+"/cluster-api-autoscaler-node-group-max-size"] = "-3"
	})
	testenv.Eventually(t, 30*time.Second, "the bad max size to be reported", func() error {
		got := get(t, md.DeepCopy())
		c := condition(got.Status.Conditions, clusterv1.NodeGroupSizeValidCondition)
		if !strings.HasPrefix(c, "False/"+clusterv1.InvalidNodeGroupSizeReason) || !strings.Contains(c, group+"/cluster-api-autoscaler-node-group-max-size") {
			return fmt.Errorf("NodeGroupSizeValid %s", c)
		}
		if *got.Spec.Replicas != 1 || len(machinesIn(t, f.NS)) != 1 {
			return fmt.Errorf("replicas changed")
		}
		return nil
	})
}

func hasLabel(n *corev1.Node, k, v string) bool { return n.Labels[k] == v }

// unstructuredView reads an object the way the autoscaler does: as JSON
// fields.
type unstructuredView map[string]any

func unstructuredOf(t *testing.T, o client.Object) unstructuredView {
	t.Helper()
	fresh := o.DeepCopyObject().(client.Object)
	if err := mgmt.Client.Get(context.Background(), client.ObjectKeyFromObject(o), fresh); err != nil {
		t.Fatal(err)
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(fresh)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (u unstructuredView) str(path ...string) string {
	var cur any = map[string]any(u)
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return ""
		}
		cur = m[p]
	}
	s, _ := cur.(string)
	return s
}

func (u unstructuredView) annotations() map[string]string {
	out := map[string]string{}
	md, _ := u["metadata"].(map[string]any)
	a, _ := md["annotations"].(map[string]any)
	for k, v := range a {
		out[k], _ = v.(string)
	}
	return out
}

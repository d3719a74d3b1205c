package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"runtime"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
)

// fieldManager names the agent in managedFields.
const fieldManager = "marina-node-agent"

// Labels the agent puts on its Node besides the machine's.
const (
	hostnameLabel     = "kubernetes.io/hostname"
	instanceTypeLabel = "node.kubernetes.io/instance-type"
	instanceType      = "local"
)

// Reasons and messages of the Node conditions, as the kubelet words them,
// so that tools reading them see nothing unusual.
const (
	reasonReady          = "KubeletReady"
	reasonMemory         = "KubeletHasSufficientMemory"
	reasonDisk           = "KubeletHasNoDiskPressure"
	reasonPID            = "KubeletHasSufficientPID"
	messageReady         = "marina node agent is posting ready status"
	messageNoPressure    = "the node is simulated and has no pressure"
	simulatedOSImage     = "marina simulated node"
	simulatedKernel      = "simulated"
	simulatedRuntimeName = "containerd://simulated"
)

// nodeRef identifies the registered Node.
type nodeRef struct {
	Name string
	UID  types.UID
}

// register creates the Node or, if it exists (a restarted agent), makes its
// identity match the bootstrap, then posts its full status.
func (a *agent) register(ctx context.Context) (nodeRef, error) {
	nodes := a.cs.CoreV1().Nodes()
	// Registered with its status, as the kubelet does: whoever watches Nodes
	// sees a ready, versioned Node in one event, not two.
	want := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: a.boot.NodeName, Labels: a.labels(), Annotations: a.annotations()},
		Spec:       corev1.NodeSpec{ProviderID: a.boot.ProviderID, Taints: a.boot.Taints},
		Status:     a.status(nil).nodeStatus(),
	}
	created, err := nodes.Create(ctx, want, metav1.CreateOptions{FieldManager: fieldManager})
	switch {
	case err == nil:
		a.log.Info("Registered node")
		return nodeRef{Name: created.Name, UID: created.UID}, nil
	case apierrors.IsAlreadyExists(err):
		if err := a.adoptNode(ctx); err != nil {
			return nodeRef{}, err
		}
	default:
		return nodeRef{}, fmt.Errorf("registering node %s: %w", a.boot.NodeName, err)
	}
	node, err := a.postStatus(ctx)
	if err != nil {
		return nodeRef{}, err
	}
	return nodeRef{Name: node.Name, UID: node.UID}, nil
}

// adoptNode updates an existing Node of our name: its providerID, our
// labels, and our taints added to whatever taints it has (a taint put there
// by someone else, a cordon or the node lifecycle controller, stays).
func (a *agent) adoptNode(ctx context.Context) error {
	nodes := a.cs.CoreV1().Nodes()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := nodes.Get(ctx, a.boot.NodeName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading node %s: %w", a.boot.NodeName, err)
		}
		if cur.Spec.ProviderID != "" && cur.Spec.ProviderID != a.boot.ProviderID {
			// providerID is immutable once set: this is another machine's
			// Node, left behind. Whoever deleted that machine must delete it.
			return fmt.Errorf("node %s exists with providerID %s, not %s: it belongs to another machine; delete that Node for this machine to register",
				cur.Name, cur.Spec.ProviderID, a.boot.ProviderID)
		}
		upd := cur.DeepCopy()
		upd.Spec.ProviderID = a.boot.ProviderID
		if upd.Labels == nil {
			upd.Labels = map[string]string{}
		}
		maps.Copy(upd.Labels, a.labels())
		if want := a.annotations(); len(want) > 0 {
			if upd.Annotations == nil {
				upd.Annotations = map[string]string{}
			}
			maps.Copy(upd.Annotations, want)
		}
		upd.Spec.Taints = mergeTaints(upd.Spec.Taints, a.boot.Taints)
		if apiequality.Semantic.DeepEqual(cur, upd) {
			return nil
		}
		if _, err := nodes.Update(ctx, upd, metav1.UpdateOptions{FieldManager: fieldManager}); err != nil {
			return err
		}
		a.log.Info("Updated existing node to match the machine")
		return nil
	})
}

// labels are the machine's labels plus the ones every kubelet sets.
func (a *agent) labels() map[string]string {
	l := map[string]string{
		hostnameLabel:      a.boot.NodeName,
		instanceTypeLabel:  instanceType,
		"kubernetes.io/os": "linux",
		// The architecture of the host: the pods are simulated anyway.
		"kubernetes.io/arch": runtime.GOARCH,
	}
	for k, v := range a.boot.Labels {
		// An agent with a node's credential (a control-plane machine, or a
		// worker after TLS bootstrap) is held by NodeRestriction, which
		// refuses some labels a node sets on itself; the machine controller
		// adds those with admin credentials.
		if a.token != nil || nodeSettableLabel(k) {
			l[k] = v
		}
	}
	return l
}

// mergeTaints adds each wanted taint that have lacks (by key and effect).
func mergeTaints(have, want []corev1.Taint) []corev1.Taint {
	out := append([]corev1.Taint(nil), have...)
	for _, w := range want {
		found := false
		for _, h := range have {
			if h.MatchTaint(&w) {
				found = true
				break
			}
		}
		if !found {
			out = append(out, w)
		}
	}
	return out
}

// keepStatus posts the Node's status periodically, and checks on the way
// that the sandbox still exists. The node lifecycle
// controller judges liveness by the Lease; this heartbeat keeps the
// conditions' lastHeartbeatTime honest and restores Ready=True after the
// controller set it to Unknown during an outage.
func (a *agent) keepStatus(ctx context.Context) {
	every(ctx, a.t.statusUpdate, 0.2, func(ctx context.Context) {
		if a.sandboxGone() {
			return
		}
		if _, err := a.postStatus(ctx); err != nil && ctx.Err() == nil {
			a.log.Error(err, "Posting node status failed")
		}
	})
}

// postStatus patches the Node's status: capacity, addresses, node info and
// healthy conditions. A condition's lastTransitionTime moves only when its
// status changes, so it reads the current Node first (from the API
// server's cache: resourceVersion 0, as the kubelet does).
func (a *agent) postStatus(ctx context.Context) (*corev1.Node, error) {
	nodes := a.cs.CoreV1().Nodes()
	cur, err := nodes.Get(ctx, a.boot.NodeName, metav1.GetOptions{ResourceVersion: "0"})
	if err != nil {
		return nil, fmt.Errorf("reading node %s: %w", a.boot.NodeName, err)
	}
	patch := struct {
		Status statusPatch `json:"status"`
	}{a.status(cur)}
	data, err := json.Marshal(patch)
	if err != nil {
		return nil, fmt.Errorf("encoding the node status: %w", err)
	}
	node, err := nodes.Patch(ctx, a.boot.NodeName, types.StrategicMergePatchType, data, metav1.PatchOptions{FieldManager: fieldManager}, "status")
	if err != nil {
		return nil, fmt.Errorf("posting the status of node %s: %w", a.boot.NodeName, err)
	}
	return node, nil
}

// statusPatch is the part of a NodeStatus the agent owns; a strategic merge
// patch merges conditions and addresses by type and leaves the rest alone.
type statusPatch struct {
	Capacity    corev1.ResourceList    `json:"capacity"`
	Allocatable corev1.ResourceList    `json:"allocatable"`
	Conditions  []corev1.NodeCondition `json:"conditions"`
	Addresses   []corev1.NodeAddress   `json:"addresses"`
	NodeInfo    corev1.NodeSystemInfo  `json:"nodeInfo"`
}

// status is the Node status the agent reports. cur is the Node as the API
// server has it (nil before registration): a condition's lastTransitionTime
// moves only when its status changes.
func (a *agent) status(cur *corev1.Node) statusPatch {
	now := metav1.Now()
	conds := []corev1.NodeCondition{
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: reasonMemory, Message: messageNoPressure},
		{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: reasonDisk, Message: messageNoPressure},
		{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: reasonPID, Message: messageNoPressure},
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: reasonReady, Message: messageReady},
	}
	for i := range conds {
		conds[i].LastHeartbeatTime = now
		conds[i].LastTransitionTime = now
		if cur == nil {
			continue
		}
		for _, c := range cur.Status.Conditions {
			if c.Type == conds[i].Type && c.Status == conds[i].Status && !c.LastTransitionTime.IsZero() {
				conds[i].LastTransitionTime = c.LastTransitionTime
			}
		}
	}
	runtimeVersion := a.boot.ContainerRuntimeVersion
	if runtimeVersion == "" {
		runtimeVersion = simulatedRuntimeName
	}
	return statusPatch{
		Capacity:    a.capacity(),
		Allocatable: a.capacity(),
		Conditions:  conds,
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: a.boot.Address},
			{Type: corev1.NodeHostName, Address: a.boot.NodeName},
		},
		NodeInfo: corev1.NodeSystemInfo{
			BootID:                  a.bootID,
			KernelVersion:           simulatedKernel,
			OSImage:                 simulatedOSImage,
			ContainerRuntimeVersion: runtimeVersion,
			KubeletVersion:          a.kubelet.get(),
			OperatingSystem:         "linux",
			Architecture:            runtime.GOARCH,
		},
	}
}

func (p statusPatch) nodeStatus() corev1.NodeStatus {
	return corev1.NodeStatus{Capacity: p.Capacity, Allocatable: p.Allocatable, Conditions: p.Conditions, Addresses: p.Addresses, NodeInfo: p.NodeInfo}
}

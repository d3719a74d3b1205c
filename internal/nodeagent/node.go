package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"marina.dev/marina/internal/addons"
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
		// Pods that must really run (the cluster DNS) are kept off.
		addons.SimulatedLabel: "true",
	}
	for k, v := range a.boot.Labels {
		// Every agent holds a node's credential and is held by
		// NodeRestriction, which refuses some labels a node sets on
		// itself; the machine controller adds those with admin credentials.
		if nodeSettableLabel(k) {
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

// keepStatus keeps the Node's status the agent's, as the kubelet does: it
// compares them every statusUpdate and posts when they differ (the node
// lifecycle controller set Ready to Unknown during an outage, say), and
// every statusReport anyway, which keeps the conditions' lastHeartbeatTime
// honest. It checks on the way that the sandbox still exists. Posting
// every look instead cost the workload API servers a status write per
// Node every few seconds, for a thousand simulated workers.
func (a *agent) keepStatus(ctx context.Context) {
	lastPost := time.Now() // registration has just posted it
	every(ctx, a.t.statusUpdate, 0.2, func(ctx context.Context) {
		if a.sandboxGone() {
			return
		}
		cur, err := a.getNode(ctx)
		if err == nil && time.Since(lastPost) < a.t.statusReport && !statusDiffers(cur, a.status(cur)) {
			return
		}
		if err == nil {
			_, err = a.patchStatus(ctx, cur)
		}
		if err != nil {
			if ctx.Err() == nil {
				a.log.Error(err, "Posting node status failed")
			}
			return
		}
		lastPost = time.Now()
	})
}

// postStatus patches the Node's status: capacity, addresses, node info and
// healthy conditions.
func (a *agent) postStatus(ctx context.Context) (*corev1.Node, error) {
	cur, err := a.getNode(ctx)
	if err != nil {
		return nil, err
	}
	return a.patchStatus(ctx, cur)
}

// getNode reads the Node from the API server's cache (resourceVersion 0,
// as the kubelet does): a condition's lastTransitionTime moves only when
// its status changes, so the current one is needed.
func (a *agent) getNode(ctx context.Context) (*corev1.Node, error) {
	cur, err := a.cs.CoreV1().Nodes().Get(ctx, a.boot.NodeName, metav1.GetOptions{ResourceVersion: "0"})
	if err != nil {
		return nil, fmt.Errorf("reading node %s: %w", a.boot.NodeName, err)
	}
	return cur, nil
}

func (a *agent) patchStatus(ctx context.Context, cur *corev1.Node) (*corev1.Node, error) {
	patch := struct {
		Status statusPatch `json:"status"`
	}{a.status(cur)}
	data, err := json.Marshal(patch)
	if err != nil {
		return nil, fmt.Errorf("encoding the node status: %w", err)
	}
	node, err := a.cs.CoreV1().Nodes().Patch(ctx, a.boot.NodeName, types.StrategicMergePatchType, data, metav1.PatchOptions{FieldManager: fieldManager}, "status")
	if err != nil {
		return nil, fmt.Errorf("posting the status of node %s: %w", a.boot.NodeName, err)
	}
	return node, nil
}

// statusDiffers reports whether the Node's status lacks something of want,
// heartbeat times aside: what a post would change.
func statusDiffers(cur *corev1.Node, want statusPatch) bool {
	st := cur.Status
	if !apiequality.Semantic.DeepEqual(st.Capacity, want.Capacity) || !apiequality.Semantic.DeepEqual(st.Allocatable, want.Allocatable) || st.NodeInfo != want.NodeInfo {
		return true
	}
	for _, w := range want.Conditions {
		found := false
		for _, c := range st.Conditions {
			if c.Type == w.Type {
				found = c.Status == w.Status && c.Reason == w.Reason && c.Message == w.Message
				break
			}
		}
		if !found {
			return true
		}
	}
	for _, w := range want.Addresses {
		if !slices.Contains(st.Addresses, w) {
			return true
		}
	}
	return false
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

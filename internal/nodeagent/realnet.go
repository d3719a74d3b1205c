package nodeagent

import (
	"context"
	"encoding/json"
	"net/netip"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"marina.dev/marina/internal/nodenet"
)

// networkResync is how often the real node's routes and pod network are
// compared with the Nodes even when no Node changed (a route deleted by
// hand comes back).
const networkResync = 30 * time.Second

// keepNetwork keeps a real node's pod network in step with the cluster's
// Nodes until ctx ends: its own pod CIDR becomes the CNI configuration,
// the others' become routes in its namespace (as kind's kindnet does), and
// the machine's annotations are put on its Node once the kubelet has
// registered it.
func (a *agent) keepNetwork(ctx context.Context, cs kubernetes.Interface) {
	factory := informers.NewSharedInformerFactory(cs, 0)
	nodes := factory.Core().V1().Nodes().Informer()
	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(_, _ any) { notify() },
		DeleteFunc: func(any) { notify() },
	}); err != nil {
		a.log.Error(err, "Watching the cluster's Nodes failed")
		return
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	network, err := netip.ParsePrefix(a.boot.Real.Network)
	if err != nil {
		a.log.Error(err, "The machine's network is not a CIDR", "network", a.boot.Real.Network)
		return
	}
	ns := filepath.Base(a.boot.Real.NetNS)
	annotated := false
	tick := time.NewTicker(networkResync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick.C:
		}
		var own netip.Prefix
		var peers []nodenet.Peer
		for _, obj := range nodes.GetStore().List() {
			n := obj.(*corev1.Node)
			cidr, err := netip.ParsePrefix(n.Spec.PodCIDR)
			if err != nil {
				continue
			}
			if n.Name == a.boot.NodeName {
				own = cidr
				if !annotated {
					annotated = a.annotateNode(ctx, cs, n) == nil
				}
				continue
			}
			for _, addr := range n.Status.Addresses {
				if addr.Type != corev1.NodeInternalIP {
					continue
				}
				if ip, err := netip.ParseAddr(addr.Address); err == nil {
					peers = append(peers, nodenet.Peer{PodCIDR: cidr, Via: ip})
				}
			}
		}
		if own.IsValid() {
			if err := a.real.writeCNI(own.String()); err != nil {
				a.log.Error(err, "Writing the pod network's configuration failed")
			}
		}
		have, err := nodenet.PodRoutes(ctx, ns)
		if err != nil {
			a.log.Error(err, "Reading the machine's routes failed")
			continue
		}
		plan := nodenet.Routes(network, own, peers, have)
		if len(plan.Add)+len(plan.Remove) == 0 {
			continue
		}
		if err := nodenet.Apply(ctx, ns, plan); err != nil {
			a.log.Error(err, "Routing to the other Nodes' pods failed")
			continue
		}
		a.log.Info("Routes to other Nodes' pods changed", "added", len(plan.Add), "removed", len(plan.Remove))
	}
}

// annotateNode puts the machine's annotations (its Machine's name, the
// kubelet configuration it runs) on its Node, which the kubelet
// registered without them.
func (a *agent) annotateNode(ctx context.Context, cs kubernetes.Interface, n *corev1.Node) error {
	want := a.annotations()
	missing := map[string]string{}
	for k, v := range want {
		if n.Annotations[k] != v {
			missing[k] = v
		}
	}
	if len(missing) == 0 {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": missing}})
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager}); err != nil {
		a.log.Error(err, "Annotating the node failed")
		return err
	}
	return nil
}

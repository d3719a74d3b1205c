package machine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/addons"
	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/bootstraptoken"
	"marina.dev/marina/internal/image"
	"marina.dev/marina/internal/nodecsr"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/provider"
)

// identityCache remembers the workload clusters where the TLS bootstrap
// RBAC is in place, so that it is ensured once per cluster and process
// rather than once per machine.
type identityCache struct {
	mu    sync.Mutex
	hosts map[string]*hostEnsure // keyed by API server URL
}

// hostEnsure is one cluster's entry. Its lock is held while ensuring: the
// hundred workers of a cluster whose control plane just answered all ask at
// once, and one ensures while the others come back later (without it a
// fleet benchmark counted 186 conflicting creates on one cluster). None
// waits on the lock: a slow cluster would hold every worker of the
// controller that way, and machines of other clusters with them.
type hostEnsure struct {
	mu   sync.Mutex
	done atomic.Bool
}

// errEnsuring: another worker is ensuring the cluster's setup right now.
var errEnsuring = errors.New("another worker is setting the workload cluster up")

// bootstrapFor produces what the machine needs to join its cluster: for a
// control-plane machine, the control plane's document (it needs no running
// API server: the first one makes it); for the others, a token of the
// running cluster. A nil Bootstrap means not yet; condition t (Provisioned
// for a new machine, InstanceRunning for a stopped one) says why.
func (r *Reconciler) bootstrapFor(ctx context.Context, m *clusterv1.Machine, t string) (*provider.Bootstrap, ctrl.Result, error) {
	if hasRole(m.Spec.Roles, clusterv1.ControlPlaneRole) && r.opts.ControlPlaneBootstrap != nil {
		doc, err := r.opts.ControlPlaneBootstrap(ctx, m)
		if errors.Is(err, reconcile.TerminalError(nil)) {
			setCondition(m, t, metav1.ConditionFalse, clusterv1.MachineBootstrapRefusedReason,
				"the control plane refuses this machine its configuration: "+strings.TrimPrefix(err.Error(), "terminal error: "))
			setReady(m)
			return nil, ctrl.Result{}, fmt.Errorf("control-plane bootstrap: %w", err)
		}
		if err != nil {
			setCondition(m, t, metav1.ConditionFalse, clusterv1.MachineWaitingForControlPlaneReason,
				fmt.Sprintf("waiting for the control plane's configuration (retrying): %v", err))
			setReady(m)
			return nil, ctrl.Result{}, fmt.Errorf("control-plane bootstrap: %w", err)
		}
		return &provider.Bootstrap{ControlPlane: doc}, ctrl.Result{}, nil
	}
	cl, res, err := r.cluster(ctx, m, t)
	if cl == nil {
		return nil, res, err
	}
	boot, err := r.bootstrapToken(ctx, m, cl)
	if errors.Is(err, errEnsuring) {
		return nil, ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if err != nil {
		return nil, ctrl.Result{}, err
	}
	return &boot, ctrl.Result{}, nil
}

// bootstrapToken hands a worker a short-lived bootstrap token of its
// cluster, for TLS bootstrap: the agent trades it for its own node
// certificate, and never holds more than a node may do. It is the same for
// every cluster, whoever runs its control plane: marina approves the
// request (answerCertificateRequests) and the cluster's
// kube-controller-manager signs it, as any conformant cluster's does;
// marina adds the bindings that let bootstrap tokens ask.
func (r *Reconciler) bootstrapToken(ctx context.Context, m *clusterv1.Machine, cl *remote.Cluster) (provider.Bootstrap, error) {
	dns, err := r.clusterDNS(ctx, m)
	if err != nil {
		return provider.Bootstrap{}, err
	}
	if err := r.bootstrapRBAC.ensure(ctx, cl, func(ctx context.Context, cs kubernetes.Interface) error {
		if err := bootstraptoken.EnsureRBAC(ctx, cs); err != nil {
			return err
		}
		if dns == nil {
			return nil
		}
		return addons.EnsureDNS(ctx, cs, *dns)
	}); err != nil {
		return provider.Bootstrap{}, fmt.Errorf("allowing TLS bootstrap and installing the addons in the workload cluster: %w", err)
	}
	token, err := bootstraptoken.Ensure(ctx, cl.Clientset, clusterv1.InstanceKey(m), bootstraptoken.DefaultTTL, time.Now())
	if err != nil {
		r.bootstrapRBAC.forget(cl)
		return provider.Bootstrap{}, err
	}
	b := provider.Bootstrap{Server: cl.Config.Host, CAData: cl.Config.CAData, Token: token}
	if dns != nil {
		b.ClusterDNS, b.ClusterDomain = dns.ServiceIP.String(), dns.Domain
	}
	return b, nil
}

// clusterDNS is the DNS marina gives the machine's cluster, as kubeadm
// does, or nil for a cluster whose control plane someone else runs (its
// DNS is theirs) or that has no Cluster object.
func (r *Reconciler) clusterDNS(ctx context.Context, m *clusterv1.Machine) (*addons.DNS, error) {
	cluster := &clusterv1.Cluster{}
	if err := r.client.Get(ctx, clusterKey(m), cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil // only its kubeconfig Secret: not a cluster marina runs
		}
		return nil, fmt.Errorf("reading cluster %s: %w", m.Spec.ClusterName, err)
	}
	if cluster.Annotations[clusterv1.ExternalControlPlaneAnnotation] == "true" {
		return nil, nil
	}
	n := cluster.Spec.ClusterNetwork
	services, domain := bootstrap.DefaultServiceCIDR, bootstrap.DefaultDNSDomain
	if len(n.Services) > 0 {
		services = string(n.Services[0])
	}
	if n.DNSDomain != "" {
		domain = n.DNSDomain
	}
	prefix, err := netip.ParsePrefix(services)
	if err != nil {
		return nil, fmt.Errorf("cluster %s's service network %q: %w", m.Spec.ClusterName, services, err)
	}
	ip, err := addons.DNSServiceIP(prefix)
	if err != nil {
		return nil, fmt.Errorf("cluster %s: %w", m.Spec.ClusterName, err)
	}
	return &addons.DNS{ServiceIP: ip, Domain: domain, Image: image.CoreDNSImage}, nil
}

// answerCertificateRequests approves the request for a node client
// certificate the machine's agent made with its bootstrap token, when it
// asks for the machine's own Node (the Node registers under the Machine's
// name), and denies any other made with that token (issue 24: one node,
// one identity; kube-controller-manager would approve any name).
func (r *Reconciler) answerCertificateRequests(ctx context.Context, m *clusterv1.Machine, cl *remote.Cluster) error {
	csrs, err := cl.KubeletCSRsOf(ctx, bootstraptoken.Username(clusterv1.InstanceKey(m)))
	if err != nil || !slices.ContainsFunc(csrs, func(c certificatesv1.CertificateSigningRequest) bool { return !nodecsr.Decided(&c) }) {
		return err
	}
	takenBy, err := nodeNameTakenBy(ctx, cl, m)
	if err != nil {
		return err
	}
	for i := range csrs {
		csr := &csrs[i]
		if nodecsr.Decided(csr) {
			continue
		}
		v := nodecsr.Judge(csr, m.Name, takenBy)
		err := nodecsr.Apply(ctx, cl.Clientset, csr, v)
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			continue // answered or changed since the cache saw it: its event brings the machine back
		}
		if err != nil {
			return fmt.Errorf("answering the node's certificate request: %w", err)
		}
		if v.Approve {
			ctrl.LoggerFrom(ctx).V(1).Info("Approved the node's certificate request", "request", csr.Name)
			continue
		}
		r.recorder.Eventf(m, nil, corev1.EventTypeWarning, v.Reason, "ApproveNodeCertificate",
			"denied certificate request %s made with this machine's bootstrap token: %s", csr.Name, v.Message)
	}
	return nil
}

// nodeNameTakenBy is the providerID of a Node that bears the machine's
// name and is not the machine's; "" when there is none.
func nodeNameTakenBy(ctx context.Context, cl *remote.Cluster, m *clusterv1.Machine) (string, error) {
	node := &corev1.Node{}
	err := cl.Nodes.Get(ctx, client.ObjectKey{Name: m.Name}, node)
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading Node %s: %w", m.Name, err)
	}
	if node.Spec.ProviderID == m.Status.ProviderID {
		return "", nil
	}
	if node.Spec.ProviderID == "" {
		return "(none)", nil
	}
	return node.Spec.ProviderID, nil
}

// controlPlaneVersions are the versions the Node's agent says its
// components run; nil when it has not said (yet) or said nonsense.
func controlPlaneVersions(node *corev1.Node) *clusterv1.ComponentVersions {
	raw, ok := node.Annotations[clusterv1.ControlPlaneVersionsAnnotation]
	if !ok {
		return nil
	}
	var v clusterv1.ComponentVersions
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return nil
	}
	return &v
}

func (c *identityCache) ensure(ctx context.Context, cl *remote.Cluster, ensure func(context.Context, kubernetes.Interface) error) error {
	h := c.host(cl)
	if h.done.Load() {
		return nil
	}
	if !h.mu.TryLock() {
		return errEnsuring
	}
	defer h.mu.Unlock()
	if h.done.Load() {
		return nil
	}
	if err := ensure(ctx, cl.Clientset); err != nil {
		return fmt.Errorf("in the workload cluster: %w", err)
	}
	h.done.Store(true)
	return nil
}

func (c *identityCache) forget(cl *remote.Cluster) { c.host(cl).done.Store(false) }

func (c *identityCache) host(cl *remote.Cluster) *hostEnsure {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hosts == nil {
		c.hosts = map[string]*hostEnsure{}
	}
	h, ok := c.hosts[cl.Config.Host]
	if !ok {
		h = &hostEnsure{}
		c.hosts[cl.Config.Host] = h
	}
	return h
}

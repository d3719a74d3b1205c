package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/controller/controlplane"
	"marina.dev/marina/provider"
)

// provider finds the provider of the control-plane machines, from
// spec.controlPlane's providerSpec or class. Without one in this process,
// the cluster waits, and says so.
func (r *Reconciler) provider(ctx context.Context, cluster *clusterv1.Cluster) (provider.Provider, bool, error) {
	spec := cluster.Spec.ControlPlane
	var raw []byte
	if spec.ProviderSpec != nil {
		raw = spec.ProviderSpec.Raw
	}
	gvk := gvkOf(raw)
	if gvk.Kind == "" && spec.ClassRef != nil {
		mc := &clusterv1.MachineClass{}
		if err := r.client.Get(ctx, types.NamespacedName{Name: spec.ClassRef.Name}, mc); err != nil {
			if client.IgnoreNotFound(err) != nil {
				return nil, false, fmt.Errorf("reading MachineClass %s: %w", spec.ClassRef.Name, err)
			}
			setCondition(cluster, clusterv1.ClusterControlPlaneReadyCondition, metav1.ConditionFalse, clusterv1.MachineClassNotFoundReason,
				fmt.Sprintf("MachineClass %q of spec.controlPlane.classRef does not exist: create it", spec.ClassRef.Name))
			return nil, false, nil
		}
		gvk = gvkOf(mc.Spec.ProviderSpec.Raw)
	}
	prov := r.opts.Providers.For(gvk)
	if prov == nil {
		setCondition(cluster, clusterv1.ClusterControlPlaneReadyCondition, metav1.ConditionFalse, clusterv1.MachineProviderNotFoundReason,
			fmt.Sprintf("no provider runs here for the control plane's providerSpec kind %q (apiVersion %q); providers running here own %v",
				gvk.Kind, gvk.GroupVersion().String(), r.opts.Providers.Kinds()))
		return nil, false, nil
	}
	return prov, true, nil
}

func gvkOf(raw []byte) schema.GroupVersionKind {
	var tm metav1.TypeMeta
	if len(raw) == 0 || json.Unmarshal(raw, &tm) != nil {
		return schema.GroupVersionKind{}
	}
	return tm.GroupVersionKind()
}

// versionAvailable refuses a control-plane version the provider cannot run,
// listing those it can (the webhook refuses it at admission already; this
// covers a management plane running without it).
func (r *Reconciler) versionAvailable(cluster *clusterv1.Cluster, prov provider.Provider) (bool, error) {
	lister, ok := prov.(provider.VersionLister)
	if !ok {
		return true, nil
	}
	versions, err := lister.KubernetesVersions()
	if err != nil {
		return false, fmt.Errorf("listing the versions provider %s can run: %w", prov.Name(), err)
	}
	want := string(cluster.Spec.ControlPlane.Version)
	if versions == nil || slices.Contains(versions, want) {
		return true, nil
	}
	setCondition(cluster, clusterv1.ClusterControlPlaneReadyCondition, metav1.ConditionFalse, clusterv1.ClusterVersionUnavailableReason,
		fmt.Sprintf("provider %s cannot run Kubernetes %s; it can run %s: change spec.controlPlane.version (or build %s with make setup)",
			prov.Name(), want, strings.Join(versions, ", "), want))
	return false, nil
}

// endpoint makes sure the cluster has its control-plane endpoint: one the
// user set, or one the provider makes, recorded in
// spec.controlPlaneEndpoint before any machine exists (every API server
// certificate names it). An endpoint the user set is made by the provider
// when it can listen there (the local provider, at an address of this
// machine); otherwise it is the user's own balancer.
func (r *Reconciler) endpoint(ctx context.Context, cluster *clusterv1.Cluster, prov provider.Provider, set *clusterpki.Set) (bool, error) {
	ep := cluster.Spec.ControlPlaneEndpoint
	if ep.Host != "" && cluster.Annotations[clusterv1.ManagedEndpointAnnotation] == "true" {
		return true, nil // made; endpointBackends keeps it current
	}
	eps, ok := prov.(provider.EndpointProvider)
	if !ok {
		if ep.Host != "" {
			return true, nil // the user's
		}
		setCondition(cluster, clusterv1.ClusterControlPlaneReadyCondition, metav1.ConditionFalse, clusterv1.ClusterEndpointUnavailableReason,
			fmt.Sprintf("provider %s cannot make a control-plane endpoint: set spec.controlPlaneEndpoint to a load balancer in front of the control-plane machines", prov.Name()))
		return false, nil
	}
	req := endpointRequest(cluster, set, nil)
	req.Host, req.Port = ep.Host, ep.Port
	host, port, err := eps.EnsureEndpoint(ctx, req)
	if provider.IsEndpointElsewhere(err) {
		return true, nil // the user's
	}
	if provider.IsEndpointNotAllowed(err) {
		// Nothing to retry: the operator's setting has to change (marina
		// restarts with it), or the Cluster made again with another
		// endpoint (which cannot change once set).
		setCondition(cluster, clusterv1.ClusterControlPlaneReadyCondition, metav1.ConditionFalse, clusterv1.ClusterEndpointNotAllowedReason,
			err.Error()+"; or delete this Cluster and create it with another spec.controlPlaneEndpoint")
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("making the control-plane endpoint with provider %s: %w", prov.Name(), err)
	}
	patch := client.MergeFrom(cluster.DeepCopy())
	cluster.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: host, Port: port}
	if cluster.Annotations == nil {
		cluster.Annotations = map[string]string{}
	}
	cluster.Annotations[clusterv1.ManagedEndpointAnnotation] = "true"
	if err := r.client.Patch(ctx, cluster, patch); err != nil {
		return false, fmt.Errorf("recording the control-plane endpoint: %w", err)
	}
	return true, nil
}

// endpointBackends points a managed endpoint at the API servers of the
// control-plane machines that are not being deleted.
func (r *Reconciler) endpointBackends(ctx context.Context, cluster *clusterv1.Cluster, prov provider.Provider, set *clusterpki.Set, machines []clusterv1.Machine) error {
	eps, ok := prov.(provider.EndpointProvider)
	if !ok || cluster.Annotations[clusterv1.ManagedEndpointAnnotation] != "true" {
		return nil
	}
	var backends, drained []string
	for i := range machines {
		m := &machines[i]
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		for _, a := range m.Status.Addresses {
			if a.Type != clusterv1.MachineInternalIP {
				continue
			}
			hostPort := net.JoinHostPort(a.Address, strconv.Itoa(bootstrap.DefaultAPIServerPort))
			backends = append(backends, hostPort)
			if controlplane.Drained(m) {
				// An upgrade step restarts it soon, gracefully (M13).
				drained = append(drained, hostPort)
			}
		}
	}
	if len(drained) == len(backends) {
		drained = nil // better a server about to restart than none
	}
	req := endpointRequest(cluster, set, backends)
	req.Draining = drained
	if _, _, err := eps.EnsureEndpoint(ctx, req); err != nil {
		return fmt.Errorf("updating the control-plane endpoint's backends: %w", err)
	}
	return nil
}

// endpointRequest: the balancer checks /readyz, which API servers serve to
// anyone (system:public-info-viewer), so it needs the CA and no client key.
func endpointRequest(cluster *clusterv1.Cluster, set *clusterpki.Set, backends []string) *provider.EndpointRequest {
	return &provider.EndpointRequest{
		UID: clusterv1.InstanceKey(cluster), Namespace: cluster.Namespace, Name: cluster.Name,
		Backends: backends, CAData: set.CA.CertPEM(),
	}
}

// kubeconfig keeps the admin kubeconfig Secret pointing at the endpoint.
func (r *Reconciler) kubeconfig(ctx context.Context, cluster *clusterv1.Cluster, set *clusterpki.Set) error {
	ep := cluster.Spec.ControlPlaneEndpoint
	server := "https://" + net.JoinHostPort(ep.Host, strconv.Itoa(int(ep.Port)))
	if err := clusterpki.EnsureAdminKubeconfig(ctx, r.client, cluster, set.CA, server, r.now()); err != nil {
		return fmt.Errorf("admin kubeconfig: %w", err)
	}
	return nil
}

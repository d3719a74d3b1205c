// Package addons installs the addons marina gives every workload cluster
// whose control plane it runs, as kubeadm does after init: today the
// cluster DNS, CoreDNS (issue 32). kube-proxy is not one: it runs beside
// each real kubelet (docs/architecture.md says why).
package addons

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// The CoreDNS objects' names, kubeadm's: clients and tools look for them.
const (
	Namespace      = metav1.NamespaceSystem
	DNSName        = "coredns"
	DNSServiceName = "kube-dns"
	dnsClusterRole = "system:coredns"
)

// SimulatedLabel marks the Nodes of marina's simulated kubelet, which run
// no container: the DNS pods are kept off them, so that they run where
// they can answer.
const SimulatedLabel = "node.marina.dev/simulated"

// DNS is a cluster's DNS as its kubelets and CoreDNS see it.
type DNS struct {
	// ServiceIP is the kube-dns Service's cluster IP, the kubelets'
	// clusterDNS.
	ServiceIP netip.Addr
	// Domain is the cluster's DNS domain, e.g. cluster.local.
	Domain string
	// Image is CoreDNS's image.
	Image string
}

// DNSServiceIP is the cluster DNS address of a service network: its tenth
// address, as kubeadm picks it (10.96.0.10 in 10.96.0.0/12).
func DNSServiceIP(services netip.Prefix) (netip.Addr, error) {
	a := services.Masked().Addr()
	for range 10 {
		a = a.Next()
	}
	if !services.Contains(a) {
		return netip.Addr{}, fmt.Errorf("the service network %s is too small for the cluster DNS address (its tenth)", services)
	}
	return a, nil
}

// Corefile is CoreDNS's configuration: kubeadm's, less forward and loop,
// as no upstream resolver is reachable from marina's machines (a name
// outside the cluster's domain gets SERVFAIL).
func Corefile(domain string) string {
	return strings.ReplaceAll(`.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes DOMAIN in-addr.arpa ip6.arpa {
       pods insecure
       ttl 30
    }
    prometheus :9153
    cache 30 {
       disable success DOMAIN
       disable denial DOMAIN
    }
    reload
    loadbalance
}
`, "DOMAIN", domain)
}

// EnsureDNS creates what is missing of CoreDNS in the cluster, and sets
// the Deployment's image to d's when it runs another (an upgrade of
// marina brings its CoreDNS). The rest is created once and left to the
// cluster's administrator afterwards: an edited Corefile stays (CoreDNS
// reloads it).
func EnsureDNS(ctx context.Context, cs kubernetes.Interface, d DNS) error {
	if !d.ServiceIP.IsValid() || d.Domain == "" || d.Image == "" {
		return errors.New("the cluster DNS needs a service IP, a domain and an image")
	}
	sa := &corev1.ServiceAccount{ObjectMeta: meta(DNSName)}
	if _, err := cs.CoreV1().ServiceAccounts(Namespace).Create(ctx, sa, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("creating service account %s/%s: %w", Namespace, DNSName, err)
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: dnsClusterRole},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		},
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("creating cluster role %s: %w", dnsClusterRole, err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: dnsClusterRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: dnsClusterRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: DNSName, Namespace: Namespace}},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("creating cluster role binding %s: %w", dnsClusterRole, err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: meta(DNSName), Data: map[string]string{"Corefile": Corefile(d.Domain)}}
	if _, err := cs.CoreV1().ConfigMaps(Namespace).Create(ctx, cm, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("creating config map %s/%s: %w", Namespace, DNSName, err)
	}
	if err := ensureDeployment(ctx, cs, dnsDeployment(d)); err != nil {
		return err
	}
	// Looked for first: a create of a Service that exists fails on its
	// taken cluster IP before its name.
	services := cs.CoreV1().Services(Namespace)
	if _, err := services.Get(ctx, DNSServiceName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		if err != nil {
			return fmt.Errorf("reading service %s/%s: %w", Namespace, DNSServiceName, err)
		}
		return nil
	}
	if _, err := services.Create(ctx, dnsService(d), metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("creating service %s/%s: %w", Namespace, DNSServiceName, err)
	}
	return nil
}

// ensureDeployment creates want, or sets the image of the one there.
func ensureDeployment(ctx context.Context, cs kubernetes.Interface, want *appsv1.Deployment) error {
	c := cs.AppsV1().Deployments(Namespace)
	_, err := c.Create(ctx, want, metav1.CreateOptions{})
	if ignoreExists(err) != nil {
		return fmt.Errorf("creating deployment %s/%s: %w", Namespace, want.Name, err)
	}
	if err == nil {
		return nil
	}
	have, err := c.Get(ctx, want.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading deployment %s/%s: %w", Namespace, want.Name, err)
	}
	image := want.Spec.Template.Spec.Containers[0].Image
	changed := false
	for i := range have.Spec.Template.Spec.Containers {
		if ct := &have.Spec.Template.Spec.Containers[i]; ct.Name == DNSName && ct.Image != image {
			ct.Image, changed = image, true
		}
	}
	if !changed {
		return nil
	}
	if _, err := c.Update(ctx, have, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting the image of deployment %s/%s to %s: %w", Namespace, want.Name, image, err)
	}
	return nil
}

func meta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: Namespace}
}

func ignoreExists(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// dnsLabels select CoreDNS's pods, kubeadm's labels.
var dnsLabels = map[string]string{"k8s-app": DNSServiceName}

// dnsDeployment is kubeadm's CoreDNS Deployment, with marina's image, kept
// off simulated Nodes, and binding port 53 as a user that is not root by
// the safe sysctl net.ipv4.ip_unprivileged_port_start.
func dnsDeployment(d DNS) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: DNSName, Namespace: Namespace, Labels: dnsLabels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: dnsLabels},
			Strategy: appsv1.DeploymentStrategy{
				Type:          appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr.To(intstr.FromInt32(1))},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: dnsLabels},
				Spec: corev1.PodSpec{
					ServiceAccountName: DNSName,
					PriorityClassName:  "system-cluster-critical",
					DNSPolicy:          corev1.DNSDefault,
					Tolerations: []corev1.Toleration{
						{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists},
						{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule},
					},
					Affinity: &corev1.Affinity{
						NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
							NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
								{Key: SimulatedLabel, Operator: corev1.NodeSelectorOpDoesNotExist},
							}}},
						}},
						PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
							Weight: 100,
							PodAffinityTerm: corev1.PodAffinityTerm{
								TopologyKey:   corev1.LabelHostname,
								LabelSelector: &metav1.LabelSelector{MatchLabels: dnsLabels},
							},
						}}},
					},
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot: ptr.To(true),
						Sysctls:      []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: "53"}},
					},
					Containers: []corev1.Container{{
						Name:  DNSName,
						Image: d.Image,
						Args:  []string{"-conf", "/etc/coredns/Corefile"},
						Ports: []corev1.ContainerPort{
							{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
							{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
							{Name: "metrics", ContainerPort: 9153, Protocol: corev1.ProtocolTCP},
						},
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("70Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("170Mi")},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "config-volume", MountPath: "/etc/coredns", ReadOnly: true}},
						LivenessProbe: &corev1.Probe{
							ProbeHandler:        corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(8080)}},
							InitialDelaySeconds: 60, TimeoutSeconds: 5, SuccessThreshold: 1, FailureThreshold: 5,
						},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8181)}},
						},
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
							ReadOnlyRootFilesystem:   ptr.To(true),
						},
					}},
					Volumes: []corev1.Volume{{Name: "config-volume", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
						LocalObjectReference: corev1.LocalObjectReference{Name: DNSName},
						Items:                []corev1.KeyToPath{{Key: "Corefile", Path: "Corefile"}},
					}}}},
				},
			},
		},
	}
}

// dnsService is kubeadm's kube-dns Service at the cluster DNS address.
func dnsService(d DNS) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: DNSServiceName, Namespace: Namespace, Labels: map[string]string{
			"k8s-app": DNSServiceName, "kubernetes.io/name": "CoreDNS", "kubernetes.io/cluster-service": "true",
		}},
		Spec: corev1.ServiceSpec{
			ClusterIP: d.ServiceIP.String(),
			Selector:  dnsLabels,
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(53), Protocol: corev1.ProtocolUDP},
				{Name: "dns-tcp", Port: 53, TargetPort: intstr.FromInt32(53), Protocol: corev1.ProtocolTCP},
				{Name: "metrics", Port: 9153, TargetPort: intstr.FromInt32(9153), Protocol: corev1.ProtocolTCP},
			},
		},
	}
}

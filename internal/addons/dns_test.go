package addons

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"marina.dev/marina/internal/testenv"
)

func TestDNSServiceIP(t *testing.T) {
	for network, want := range map[string]string{
		"10.96.0.0/12":     "10.96.0.10",
		"10.100.7.0/24":    "10.100.7.10",
		"fd00:10:96::/108": "fd00:10:96::a",
		"10.0.0.0/29":      "", // eight addresses: no tenth
	} {
		got, err := DNSServiceIP(netip.MustParsePrefix(network))
		if want == "" {
			if err == nil {
				t.Errorf("DNSServiceIP(%s) = %s, want an error", network, got)
			}
			continue
		}
		if err != nil || got.String() != want {
			t.Errorf("DNSServiceIP(%s) = %s, %v; want %s", network, got, err, want)
		}
	}
}

// EnsureDNS on a real API server makes kubeadm's objects at the cluster
// DNS address; again it changes nothing, keeps an edited Corefile and
// moves the Deployment to a new image (an upgraded marina's CoreDNS).
func TestEnsureDNSInstallsCoreDNSOnceAndUpgradesItsImage(t *testing.T) {
	env, err := testenv.StartWorkload()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	cs := kubernetes.NewForConfigOrDie(env.Config)
	ctx := context.Background()
	d := DNS{ServiceIP: netip.MustParseAddr("10.0.0.10"), Domain: "tenant.example", Image: "registry.k8s.io/coredns/coredns:v1.14.6"}

	if err := EnsureDNS(ctx, cs, d); err != nil {
		t.Fatal(err)
	}
	svc, err := cs.CoreV1().Services(Namespace).Get(ctx, DNSServiceName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != "10.0.0.10" || svc.Spec.Selector["k8s-app"] != "kube-dns" {
		t.Errorf("service %s: cluster IP %s, selector %v; want 10.0.0.10 and k8s-app=kube-dns", DNSServiceName, svc.Spec.ClusterIP, svc.Spec.Selector)
	}
	cm, err := cs.CoreV1().ConfigMaps(Namespace).Get(ctx, DNSName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(cm.Data["Corefile"], "kubernetes tenant.example in-addr.arpa") {
		t.Errorf("the Corefile serves no tenant.example:\n%s", cm.Data["Corefile"])
	}
	dep, err := cs.AppsV1().Deployments(Namespace).Get(ctx, DNSName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := dep.Spec.Template.Spec.Containers[0].Image; got != d.Image {
		t.Errorf("deployment image %s, want %s", got, d.Image)
	}
	if dep.Spec.Template.Spec.ServiceAccountName != DNSName {
		t.Errorf("deployment runs as %q, want service account %s", dep.Spec.Template.Spec.ServiceAccountName, DNSName)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Get(ctx, dnsClusterRole, metav1.GetOptions{}); err != nil {
		t.Errorf("cluster role binding %s: %v", dnsClusterRole, err)
	}

	cm.Data["Corefile"] += "# the administrator's\n"
	if _, err := cs.CoreV1().ConfigMaps(Namespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	generation := dep.Generation
	if err := EnsureDNS(ctx, cs, d); err != nil {
		t.Fatalf("a second EnsureDNS: %v", err)
	}
	dep, err = cs.AppsV1().Deployments(Namespace).Get(ctx, DNSName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if dep.Generation != generation {
		t.Errorf("a second EnsureDNS changed the deployment (generation %d -> %d)", generation, dep.Generation)
	}

	d.Image = "registry.k8s.io/coredns/coredns:v1.14.7"
	if err := EnsureDNS(ctx, cs, d); err != nil {
		t.Fatal(err)
	}
	dep, err = cs.AppsV1().Deployments(Namespace).Get(ctx, DNSName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := dep.Spec.Template.Spec.Containers[0].Image; got != d.Image {
		t.Errorf("after a new image, deployment image %s, want %s", got, d.Image)
	}
	cm, err = cs.CoreV1().ConfigMaps(Namespace).Get(ctx, DNSName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(cm.Data["Corefile"], "# the administrator's\n") {
		t.Errorf("the administrator's Corefile was overwritten:\n%s", cm.Data["Corefile"])
	}

	if err := EnsureDNS(ctx, cs, DNS{Domain: "x", Image: "y"}); err == nil {
		t.Error("EnsureDNS without a service IP: no error")
	}
}

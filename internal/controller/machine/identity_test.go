package machine

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	csrutil "k8s.io/client-go/util/certificate/csr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/bootstraptoken"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/internal/nodecsr"
)

// Issue 24, finding 2: a worker of a cluster someone else runs (the
// fixture's, flagged cluster.marina.dev/external-control-plane) joins with
// a node certificate of its own, got by TLS bootstrap, not with a token of
// a ServiceAccount shared by every worker: no such ServiceAccount or
// ClusterRole is made in the workload cluster.
func TestExternalClusterWorkerJoinsWithItsOwnNodeIdentity(t *testing.T) {
	f := newFixture(t)
	f.startController(Options{})
	m := f.create(f.machine("own-identity", ""))
	got := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)

	certPEM, err := os.ReadFile(filepath.Join(f.sandboxes, string(got.UID), sandbox.NodeCertFile))
	if err != nil {
		t.Fatalf("the worker holds no node certificate: %v", err)
	}
	block, _ := pem.Decode(certPEM)
	if block == nil {
		t.Fatal("the node certificate is not PEM")
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if want := "system:node:" + got.Status.NodeRef.Name; leaf.Subject.CommonName != want || len(leaf.Subject.Organization) != 1 || leaf.Subject.Organization[0] != "system:nodes" {
		t.Errorf("the worker's certificate is for %q in %v, want %s in system:nodes", leaf.Subject.CommonName, leaf.Subject.Organization, want)
	}

	ctx := context.Background()
	if err := workload.Client.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "marina-node-agent"}, &corev1.ServiceAccount{}); !apierrors.IsNotFound(err) {
		t.Errorf("the shared ServiceAccount kube-system/marina-node-agent: err = %v, want NotFound", err)
	}
	if err := workload.Client.Get(ctx, client.ObjectKey{Name: "marina:node-agent"}, &rbacv1.ClusterRole{}); !apierrors.IsNotFound(err) {
		t.Errorf("the shared ClusterRole marina:node-agent: err = %v, want NotFound", err)
	}
}

// Issue 24: a bootstrap token gets its own machine's node certificate and
// nothing else. kube-controller-manager approves any node name a token
// asks for (kubeadm's binding, which an earlier marina made too); marina
// removes that binding and approves a request only for the Node its
// Machine registers as. Whoever read a machine's token asks, with it, for
// another node's certificate, and for an administrator's: both are denied,
// and no certificate is issued.
func TestABootstrapTokenGetsOnlyItsMachinesNodeCertificate(t *testing.T) {
	ctx := t.Context()
	f := newFixture(t)
	legacy := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "marina:node-autoapprove-bootstrap"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:certificates.k8s.io:certificatesigningrequests:nodeclient"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:bootstrappers"}},
	}
	if err := workload.Client.Create(ctx, legacy); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	workloadCS := kubernetes.NewForConfigOrDie(workload.Config)
	f.startController(Options{})
	m := f.create(f.machine("token-holder", ""))
	got := f.waitPhase(m, clusterv1.MachinePhaseRunning, provisionTimeout)
	if err := workload.Client.Get(ctx, client.ObjectKeyFromObject(legacy), &rbacv1.ClusterRoleBinding{}); !apierrors.IsNotFound(err) {
		t.Errorf("the automatic approval of bootstrap tokens' certificates (%s): err = %v, want NotFound", legacy.Name, err)
	}

	// A Machine named after a Node someone else runs (a control-plane node
	// of a cluster marina only adds workers to) does not get its identity.
	taken := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.ns + "-taken"}, Spec: corev1.NodeSpec{ProviderID: "elsewhere://taken"}}
	if err := workload.Client.Create(ctx, taken); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = workload.Client.Delete(context.Background(), taken) })
	impostor := f.create(f.machine("taken", ""))
	eventually(t, 60*time.Second, "the impostor's certificate request denied", func() (bool, error) {
		if err := mgmt.Client.Get(ctx, client.ObjectKeyFromObject(impostor), impostor); err != nil {
			return false, err
		}
		list, err := workloadCS.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, csr := range list.Items {
			if csr.Spec.Username != bootstraptoken.Username(clusterv1.InstanceKey(impostor)) {
				continue
			}
			for _, c := range csr.Status.Conditions {
				if c.Type == certificatesv1.CertificateApproved {
					t.Fatalf("the certificate of Node %s, which is not its, was approved for Machine %s", taken.Name, impostor.Name)
				}
				if c.Type == certificatesv1.CertificateDenied && c.Reason == nodecsr.NodeTakenReason {
					return true, nil
				}
			}
		}
		return false, nil
	})

	// The token, as read from the machine's sandbox in its minutes.
	token, err := bootstraptoken.Ensure(ctx, workloadCS, clusterv1.InstanceKey(got), bootstraptoken.DefaultTTL, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	attacker := kubernetes.NewForConfigOrDie(&rest.Config{Host: workload.Config.Host, BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{CAData: workload.Config.CAData}})
	for _, tc := range []struct{ cn, org string }{
		{"system:node:victim-" + f.ns, "system:nodes"},
		{"admin", "system:masters"},
	} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
			Subject: pkix.Name{CommonName: tc.cn, Organization: []string{tc.org}}}, key)
		if err != nil {
			t.Fatal(err)
		}
		name, _, err := csrutil.RequestCertificateWithContext(ctx, attacker, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), "",
			certificatesv1.KubeAPIServerClientKubeletSignerName, nil, []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}, key)
		if err != nil {
			t.Fatalf("asking for %s's certificate with the token: %v", tc.cn, err)
		}
		eventually(t, 30*time.Second, "the request for "+tc.cn+"'s certificate answered", func() (bool, error) {
			csr, err := workloadCS.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range csr.Status.Conditions {
				if c.Type == certificatesv1.CertificateApproved {
					t.Fatalf("the request for %s's certificate made with %s's token was approved (%s: %s)", tc.cn, got.Name, c.Reason, c.Message)
				}
				if c.Type == certificatesv1.CertificateDenied {
					if c.Reason != nodecsr.WrongNodeReason {
						t.Errorf("denied for %s (%s), want %s", c.Reason, c.Message, nodecsr.WrongNodeReason)
					}
					if len(csr.Status.Certificate) != 0 {
						t.Error("a denied request holds a certificate")
					}
					return true, nil
				}
			}
			return false, nil
		})
	}
}

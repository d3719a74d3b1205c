package machine

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/nodeagent/sandbox"
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

package local

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"marina.dev/marina/internal/bootstraptoken"
	"marina.dev/marina/internal/nodeagent"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/internal/pki"
	"marina.dev/marina/tools"
)

// A worker renews its node certificate as a kubelet rotates its client
// certificate: a CSR made as the node, with the certificate it holds,
// which the cluster's kube-controller-manager approves (kubeadm's
// selfnodeclient binding, which marina makes) and signs.
func TestWorkerRenewsItsNodeCertificateAsTheNode(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a control plane")
	}
	binDir := controlPlaneBinaries(t)
	ctx := t.Context()
	set := newClusterPKI(t)
	p := newControlPlaneProvider(t, binDir)
	req := controlPlaneRequest(t, "cp-0", set, tools.Pinned().NewestKube(), nil)
	inst, err := p.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	dumpOnFailure(t, p.sandboxDir(req.UID))
	addr := inst.Addresses[0].Address
	admin := adminClientFor(t, set, addr)
	eventually(t, 60*time.Second, "the API server is ready", func() error { return ready(ctx, admin) })
	if err := bootstraptoken.EnsureRBAC(ctx, admin); err != nil {
		t.Fatal(err)
	}

	// A worker's sandbox, holding the certificate TLS bootstrap gave it.
	dir := t.TempDir()
	first, err := set.CA.IssueFor(pki.CertSpec{CommonName: "system:node:w-0", Organizations: []string{"system:nodes"}, Usage: pki.ClientAuth}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	key, err := first.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, sandbox.NodeKeyFile), key, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, sandbox.NodeCertFile), first.CertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	b := &sandbox.Bootstrap{NodeName: "w-0", Server: "https://" + addr + ":6443", CAPEM: string(set.CA.CertPEM())}
	// kube-controller-manager may still be starting.
	eventually(t, 2*time.Minute, "the node certificate renewed as the node", func() error {
		actx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		return nodeagent.RenewNodeCertificate(actx, dir, b)
	})
	renewed, err := nodeCertificate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if renewed.SerialNumber.Cmp(first.Cert.SerialNumber) == 0 {
		t.Fatal("the certificate in the sandbox is still the first")
	}
	if renewed.Subject.CommonName != "system:node:w-0" {
		t.Errorf("renewed certificate for %q, want system:node:w-0", renewed.Subject.CommonName)
	}
	pool := x509.NewCertPool()
	pool.AddCert(set.CA.Cert)
	if _, err := renewed.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the renewed certificate is not the cluster CA's: %v", err)
	}
}

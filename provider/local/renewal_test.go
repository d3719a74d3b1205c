package local

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/nodeagent/components"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/tools"
)

// Issue 22 (finding 7): a control-plane machine renews its certificates
// before they end, by time, and its components run on the new ones: with
// spec.controlPlane.certificateValidity at its least (1m), the API server
// presents a new certificate before the first one ends, answers on it,
// and kube-controller-manager, whose client certificate is in its
// kubeconfig, was started again.
func TestControlPlaneCertificatesAreRenewedBeforeTheyEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a control plane")
	}
	binDir := controlPlaneBinaries(t)
	ctx := t.Context()
	set := newClusterPKI(t)
	p := newControlPlaneProvider(t, binDir)
	req := controlPlaneRequest(t, "cp-0", set, tools.Pinned().NewestKube(), nil, func(c *bootstrap.Config) { c.CertValidity = time.Minute })
	inst, err := p.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	dir := p.sandboxDir(req.UID)
	dumpOnFailure(t, dir)
	addr := inst.Addresses[0].Address
	admin := adminClientFor(t, set, addr)
	eventually(t, 60*time.Second, "the API server is ready", func() error { return ready(ctx, admin) })

	first, err := servingCertificate(set, addr)
	if err != nil {
		t.Fatal(err)
	}
	if life := first.NotAfter.Sub(first.NotBefore); life > 70*time.Second {
		t.Fatalf("the API server's certificate lives %s, want the cluster's 1m (and a few seconds' backdating)", life)
	}
	cm, err := components.ReadStatus(dir, bootstrap.ControllerManager)
	if err != nil {
		t.Fatal(err)
	}
	// The node's own client certificate (its agent's, for its Node and
	// Lease) lives as long, and is renewed with the others.
	firstNode, err := nodeCertificate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if life := firstNode.NotAfter.Sub(firstNode.NotBefore); life > 70*time.Second {
		t.Fatalf("the node's client certificate lives %s, want the cluster's 1m", life)
	}

	var renewed *x509.Certificate
	eventually(t, 90*time.Second, "a renewed certificate served, the API server ready on it, kube-controller-manager started again", func() error {
		c, err := servingCertificate(set, addr)
		if err != nil {
			return err
		}
		if c.SerialNumber.Cmp(first.SerialNumber) == 0 {
			return fmt.Errorf("still the first certificate, which ends at %s", first.NotAfter.Format(time.TimeOnly))
		}
		if err := ready(ctx, admin); err != nil {
			return err
		}
		st, err := components.ReadStatus(dir, bootstrap.ControllerManager)
		if err != nil {
			return err
		}
		if st.State != components.Running || st.PID == cm.PID {
			return fmt.Errorf("kube-controller-manager %s, pid %d (was %d)", st.State, st.PID, cm.PID)
		}
		renewed = c
		return nil
	})
	node, err := nodeCertificate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !node.NotBefore.Before(firstNode.NotAfter) || !node.NotAfter.After(firstNode.NotAfter) {
		t.Errorf("the node's client certificate was not renewed before it ended: valid %s to %s, the first ended at %s",
			node.NotBefore.Format(time.TimeOnly), node.NotAfter.Format(time.TimeOnly), firstNode.NotAfter.Format(time.TimeOnly))
	}
	// The agent reaches its API server on the new one: its Lease is
	// renewed after the first certificate ended.
	eventually(t, 90*time.Second, "the node's Lease renewed after its first certificate ended", func() error {
		lease, err := admin.CoordinationV1().Leases("kube-node-lease").Get(ctx, "cp-0", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if lease.Spec.RenewTime == nil || !lease.Spec.RenewTime.After(firstNode.NotAfter.Add(5*time.Second)) {
			return fmt.Errorf("lease renewed at %v, the first certificate ended at %s", lease.Spec.RenewTime, firstNode.NotAfter.Format(time.TimeOnly))
		}
		return nil
	})
	if !renewed.NotBefore.Before(first.NotAfter) || !renewed.NotAfter.After(first.NotAfter) {
		t.Errorf("renewed certificate valid %s to %s; the first ended at %s: want it made before the first ended, and ending later",
			renewed.NotBefore.Format(time.TimeOnly), renewed.NotAfter.Format(time.TimeOnly), first.NotAfter.Format(time.TimeOnly))
	}
}

// servingCertificate is the certificate the API server at addr presents,
// verified against the cluster CA.
func servingCertificate(set *clusterpki.Set, addr string) (*x509.Certificate, error) {
	pool := x509.NewCertPool()
	pool.AddCert(set.CA.Cert)
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: &tls.Config{RootCAs: pool, ServerName: addr, MinVersion: tls.VersionTLS12}}
	conn, err := d.Dial("tcp", net.JoinHostPort(addr, strconv.Itoa(bootstrap.DefaultAPIServerPort)))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.(*tls.Conn).ConnectionState().PeerCertificates[0], nil
}

// nodeCertificate is the node's client certificate in the sandbox dir.
func nodeCertificate(dir string) (*x509.Certificate, error) {
	data, err := os.ReadFile(filepath.Join(dir, sandbox.NodeCertFile))
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("%s holds no PEM", sandbox.NodeCertFile)
	}
	return x509.ParseCertificate(block.Bytes)
}

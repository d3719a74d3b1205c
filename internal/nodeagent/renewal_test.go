package nodeagent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/internal/pki"
	"marina.dev/marina/internal/testenv"
)

// Issue 22 (finding 7): when a machine renews its certificates. Machines
// made together renew apart (jitter), and none renews a certificate the CA
// would cut at the same end: near the CA's end that would restart every
// machine's components together, ever more often.
func TestRenewalDue(t *testing.T) {
	now := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	twoYears := &x509.Certificate{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(2 * 365 * 24 * time.Hour)}
	oneMinute := &x509.Certificate{NotBefore: now.Add(-6 * time.Second), NotAfter: now.Add(time.Minute)}
	caEnd := now.Add(10 * 365 * 24 * time.Hour)
	for _, tc := range []struct {
		name      string
		cert      *x509.Certificate
		caEnd     time.Time
		jitter    float64
		wantDue   time.Time
		wantWorth bool
	}{
		{"two years, no jitter: 30 days before the end", twoYears, caEnd, 0, twoYears.NotAfter.Add(-30 * 24 * time.Hour), true},
		{"two years, most jitter: up to 10 days later", twoYears, caEnd, 0.999999, twoYears.NotAfter.Add(-20 * 24 * time.Hour), true},
		{"one minute: a third of its life before the end", oneMinute, caEnd, 0, oneMinute.NotAfter.Add(-22 * time.Second), true},
		{"cut by the CA: not renewed", twoYears, twoYears.NotAfter, 0, twoYears.NotAfter.Add(-30 * 24 * time.Hour), false},
		{"the CA ends a few seconds later: not renewed", oneMinute, oneMinute.NotAfter.Add(10 * time.Second), 0, oneMinute.NotAfter.Add(-22 * time.Second), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			due, worth := renewalDue(tc.cert, tc.caEnd, tc.jitter)
			if d := due.Sub(tc.wantDue); d < -time.Second || d > time.Second {
				t.Errorf("due %s, want %s", due, tc.wantDue)
			}
			if worth != tc.wantWorth {
				t.Errorf("worth renewing %t, want %t", worth, tc.wantWorth)
			}
			if !due.Before(tc.cert.NotAfter) {
				t.Errorf("due %s, not before the certificate ends at %s", due, tc.cert.NotAfter)
			}
		})
	}
}

// A worker's node certificate (got by TLS bootstrap) is renewed before it
// ends, by time, as a kubelet rotates its client certificate; its client
// reads the files, so it uses the new one. The request to the cluster's
// signer is the edge here: renew stands in for it (kube-controller-manager
// signing a node's request for its own name), issuing from a test CA.
func TestWorkerRenewsItsNodeCertificateBeforeItEnds(t *testing.T) {
	ca, err := pki.NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	issue := func() ([]byte, []byte, error) {
		pair, err := ca.IssueFor(pki.CertSpec{CommonName: "system:node:w-0", Organizations: []string{"system:nodes"}, Usage: pki.ClientAuth}, time.Now(), 30*time.Second)
		if err != nil {
			return nil, nil, err
		}
		key, err := pair.KeyPEM()
		return pair.CertPEM(), key, err
	}
	certPEM, keyPEM, err := issue()
	if err != nil {
		t.Fatal(err)
	}
	if err := writeNodeCredential(dir, certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	first, err := readCertificate(filepath.Join(dir, sandbox.NodeCertFile))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		keepNodeCertificate(ctx, dir, &sandbox.Bootstrap{CAPEM: string(ca.CertPEM())}, func(context.Context) ([]byte, []byte, error) { return issue() })
	}()
	defer func() { cancel(); <-done }()

	testenv.Eventually(t, time.Until(first.NotAfter), "the node certificate renewed before the first ends", func() error {
		c, err := readCertificate(filepath.Join(dir, sandbox.NodeCertFile))
		if err != nil {
			return err
		}
		if c.SerialNumber.Cmp(first.SerialNumber) == 0 {
			return fmt.Errorf("still the first certificate, which ends at %s", first.NotAfter.Format(time.TimeOnly))
		}
		if _, err := tls.LoadX509KeyPair(filepath.Join(dir, sandbox.NodeCertFile), filepath.Join(dir, sandbox.NodeKeyFile)); err != nil {
			return err
		}
		if !c.NotAfter.After(first.NotAfter) {
			return fmt.Errorf("renewed certificate ends at %s, the first at %s", c.NotAfter, first.NotAfter)
		}
		return nil
	})
}

package pki

import (
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"marina.dev/marina/internal/files"
)

func TestIssuedCertificateVerifiesAgainstItsCA(t *testing.T) {
	ca, err := NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(CertSpec{CommonName: "apiserver", IPs: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}, Usage: ServerAuth})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	if _, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "localhost", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("serving certificate does not verify for localhost: %v", err)
	}
	if _, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("a serving-only certificate verified for client authentication")
	}
	other, _ := NewCA("other")
	otherPool := x509.NewCertPool()
	otherPool.AddCert(other.Cert)
	if _, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: otherPool}); err == nil {
		t.Error("certificate verified against a foreign CA")
	}
	if leaf.Cert.NotAfter.After(ca.Cert.NotAfter) {
		t.Error("leaf outlives its CA")
	}
}

func TestClientCertificateCarriesUserAndGroups(t *testing.T) {
	ca, _ := NewCA("ca")
	c, err := ca.Issue(CertSpec{CommonName: "admin", Organizations: []string{"system:masters"}, Usage: ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	if c.Cert.Subject.CommonName != "admin" || len(c.Cert.Subject.Organization) != 1 || c.Cert.Subject.Organization[0] != "system:masters" {
		t.Errorf("subject = %v, want CN=admin O=system:masters", c.Cert.Subject)
	}
}

func TestWriteLoadRoundTripWithPrivateModes(t *testing.T) {
	dir := t.TempDir()
	ca, _ := NewCA("ca")
	if err := ca.Write(dir, "ca"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ca.crt", "ca.key"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f, st.Mode().Perm())
		}
	}
	got, err := Load(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	if !got.Cert.Equal(ca.Cert) {
		t.Error("loaded certificate differs from the written one")
	}
}

func TestLoadRejectsCorruptAndMismatchedFiles(t *testing.T) {
	dir := t.TempDir()
	a, _ := NewCA("a")
	b, _ := NewCA("b")
	if err := a.Write(dir, "x"); err != nil {
		t.Fatal(err)
	}
	bKey, _ := b.KeyPEM()
	if err := files.WriteAtomic(filepath.Join(dir, "x.key"), bKey, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir, "x"); err == nil {
		t.Error("a key that does not match its certificate was accepted")
	}
	if err := files.WriteAtomic(filepath.Join(dir, "x.crt"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir, "x"); err == nil {
		t.Error("a corrupt certificate was accepted")
	}
}

func TestNeedsRenewal(t *testing.T) {
	ca, _ := NewCA("ca")
	leaf, _ := ca.Issue(CertSpec{CommonName: "x", Usage: ClientAuth})
	if NeedsRenewal(leaf.Cert, time.Now()) {
		t.Error("a fresh certificate needs renewal")
	}
	if !NeedsRenewal(leaf.Cert, leaf.Cert.NotAfter.Add(-time.Hour)) {
		t.Error("a certificate an hour from expiry does not need renewal")
	}
}

func TestIssueAtTakesValidityFromTheGivenTime(t *testing.T) {
	ca, _ := NewCA("ca")
	now := time.Now().Add(48 * time.Hour).Truncate(time.Second)
	leaf, err := ca.IssueAt(CertSpec{CommonName: "x", Usage: ClientAuth}, now)
	if err != nil {
		t.Fatal(err)
	}
	if want := now.Add(-time.Hour); !leaf.Cert.NotBefore.Equal(want) {
		t.Errorf("NotBefore = %s, want %s", leaf.Cert.NotBefore, want)
	}
	if want := now.Add(LeafValidity); !leaf.Cert.NotAfter.Equal(want) {
		t.Errorf("NotAfter = %s, want %s", leaf.Cert.NotAfter, want)
	}
}

// Issue 22 (finding 7): a certificate is renewed before it ends, 30 days
// before for the long-lived ones, within the last third of its life for
// short ones (a machine's certificates under a short
// certificateValidity), and never from the moment it is made.
func TestRenewalComesBeforeTheEndAndNotAtTheStart(t *testing.T) {
	ca, err := NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, validity := range []time.Duration{90 * time.Second, time.Hour, 24 * time.Hour, LeafValidity} {
		leaf, err := ca.IssueFor(CertSpec{CommonName: "x", Usage: ServerAuth}, now, validity)
		if err != nil {
			t.Fatal(err)
		}
		if got := leaf.Cert.NotAfter.Sub(now); got > validity || got < validity-time.Second {
			t.Errorf("validity %s: the certificate ends %s after now", validity, got)
		}
		if NeedsRenewal(leaf.Cert, now) {
			t.Errorf("validity %s: renewal asked for at issue", validity)
		}
		margin := RenewalMargin(leaf.Cert)
		if margin <= 0 || margin > 30*24*time.Hour || margin >= validity/2 {
			t.Errorf("validity %s: renewed %s before the end", validity, margin)
		}
		if !NeedsRenewal(leaf.Cert, leaf.Cert.NotAfter.Add(-margin+time.Second)) {
			t.Errorf("validity %s: no renewal %s before the end", validity, margin-time.Second)
		}
	}
}

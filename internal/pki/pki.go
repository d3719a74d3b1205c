package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"marina.dev/marina/internal/files"
)

// Validity periods. A management plane on a laptop lives for years; the CA
// outlives the leaf certificates, which are reissued when they near expiry.
const (
	CAValidity   = 10 * 365 * 24 * time.Hour
	LeafValidity = 2 * 365 * 24 * time.Hour
	// renewBefore is how long before expiry a leaf certificate is reissued.
	renewBefore = 30 * 24 * time.Hour
)

// KeyPair is a certificate and its private key.
type KeyPair struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// CertPEM returns the certificate in PEM form.
func (k *KeyPair) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: k.Cert.Raw})
}

// KeyPEM returns the private key in PEM form. Handle it as a secret.
func (k *KeyPair) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k.Key)
	if err != nil {
		return nil, fmt.Errorf("encoding private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// Usage says what a leaf certificate is for.
type Usage int

// Leaf certificate usages.
const (
	ServerAuth Usage = 1 << iota
	ClientAuth
)

// CertSpec describes a leaf certificate.
type CertSpec struct {
	// CommonName is the user name when the certificate authenticates a client.
	CommonName string
	// Organizations are the groups when the certificate authenticates a client.
	Organizations []string
	DNSNames      []string
	IPs           []net.IP
	Usage         Usage
}

// NewCA generates a self-signed certificate authority.
func NewCA(commonName string) (*KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	return sign(tmpl, tmpl, key, key)
}

// Issue signs a new leaf certificate with the CA, valid from now.
func (k *KeyPair) Issue(spec CertSpec) (*KeyPair, error) { return k.IssueAt(spec, time.Now()) }

// IssueAt signs a new leaf certificate with the CA, valid from now (less an
// hour, for clocks that lag), for callers that take the time as an argument.
func (k *KeyPair) IssueAt(spec CertSpec, now time.Time) (*KeyPair, error) {
	return k.IssueFor(spec, now, LeafValidity)
}

// IssueFor is IssueAt for a certificate valid for validity (LeafValidity
// when zero), never beyond the CA. It is backdated by an hour for clocks
// that lag, or a tenth of validity when that is shorter.
func (k *KeyPair) IssueFor(spec CertSpec, now time.Time, validity time.Duration) (*KeyPair, error) {
	if validity <= 0 {
		validity = LeafValidity
	}
	if !k.Cert.IsCA {
		return nil, errors.New("issuing certificate: signer is not a CA")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating key for %q: %w", spec.CommonName, err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: spec.CommonName, Organization: spec.Organizations},
		NotBefore:    now.Add(-min(time.Hour, validity/10)),
		NotAfter:     minTime(now.Add(validity), k.Cert.NotAfter),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		DNSNames:     spec.DNSNames,
		IPAddresses:  spec.IPs,
	}
	if spec.Usage&ServerAuth != 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if spec.Usage&ClientAuth != 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	return sign(tmpl, k.Cert, key, k.Key)
}

// NeedsRenewal reports whether a certificate expires soon and should be
// reissued: within renewBefore of its end, or within the last third of its
// life when that is shorter, so that a certificate made to live only hours
// is not renewed from the moment it is made.
func NeedsRenewal(cert *x509.Certificate, now time.Time) bool {
	return now.Add(RenewalMargin(cert)).After(cert.NotAfter)
}

// RenewalMargin is how long before its end a certificate is renewed.
func RenewalMargin(cert *x509.Certificate) time.Duration {
	return min(renewBefore, cert.NotAfter.Sub(cert.NotBefore)/3)
}

func sign(tmpl, parent *x509.Certificate, key *ecdsa.PrivateKey, signer crypto.Signer) (*KeyPair, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), signer)
	if err != nil {
		return nil, fmt.Errorf("signing certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	return &KeyPair{Cert: cert, Key: key}, nil
}

func newSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	return serial, nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// ErrKeyMismatch says a private key is not the certificate's.
var ErrKeyMismatch = errors.New("private key does not match the certificate")

// ParsePEM parses a certificate and private key from PEM.
func ParsePEM(certPEM, keyPEM []byte) (*KeyPair, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM CERTIFICATE block found")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing certificate: %w", err)
	}
	block, _ = pem.Decode(keyPEM)
	if block == nil {
		return nil, errors.New("no PEM private key block found")
	}
	var key any
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("unsupported private key type %q", block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("parsing private key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, errors.New("private key cannot sign")
	}
	if !publicKeysEqual(cert.PublicKey, signer.Public()) {
		return nil, ErrKeyMismatch
	}
	return &KeyPair{Cert: cert, Key: signer}, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}

// Load reads <dir>/<name>.crt and <dir>/<name>.key.
func Load(dir, name string) (*KeyPair, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, name+".crt"))
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, name+".key"))
	if err != nil {
		return nil, err
	}
	kp, err := ParsePEM(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s.crt/%s.key in %s: %w", name, name, dir, err)
	}
	return kp, nil
}

// Write stores the pair as <dir>/<name>.crt and <dir>/<name>.key, both with
// mode 0600, each written to a temporary file and renamed so that a crash
// never leaves half a file.
func (k *KeyPair) Write(dir, name string) error {
	keyPEM, err := k.KeyPEM()
	if err != nil {
		return err
	}
	if err := files.WriteAtomic(filepath.Join(dir, name+".key"), keyPEM, 0o600); err != nil {
		return err
	}
	return files.WriteAtomic(filepath.Join(dir, name+".crt"), k.CertPEM(), 0o600)
}

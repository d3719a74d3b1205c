package plane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/flock"
	"marina.dev/marina/internal/kubeconfig"
	"marina.dev/marina/internal/pki"
)

// stateDir is the layout of a management plane's state directory:
//
//	admin.kubeconfig           the administrator's kubeconfig (0600)
//	lock                       held by the running marina (flock), holds its PID
//	pki/                       CA, serving and client certificates, keys (0600)
//	etcd/                      etcd's data: every object lives here
//	kubeconfigs/               component kubeconfigs (0600)
//	logs/<component>.log       component output (0600)
//	registry/config.yml        the image registry's configuration (0600)
//	registry/data/             the images the real nodes pull
type stateDir string

func (d stateDir) path(elem ...string) string {
	return filepath.Join(append([]string{string(d)}, elem...)...)
}

func (d stateDir) pki() string      { return d.path("pki") }
func (d stateDir) etcdData() string { return d.path("etcd") }

// AdminKubeconfig is the path of the administrator's kubeconfig.
func (d stateDir) AdminKubeconfig() string { return d.path("admin.kubeconfig") }

func (d stateDir) kubeconfig(component string) string {
	return d.path("kubeconfigs", component+".kubeconfig")
}

func (d stateDir) log(component string) string { return d.path("logs", component+".log") }

// corrupt wraps an error about unreadable state with the fix.
func (d stateDir) corrupt(what string, err error) error {
	return fmt.Errorf("state directory %s is corrupt: %s: %w; restore it from a backup, "+
		"or move it away to start a new, empty management plane", string(d), what, err)
}

// prepare creates the directories with private modes.
func (d stateDir) prepare() error {
	for _, dir := range []string{string(d), d.pki(), d.path("kubeconfigs"), d.path("logs")} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("creating state directory %s: %w", dir, err)
		}
	}
	// etcd refuses a data directory that others can read.
	if err := os.MkdirAll(d.etcdData(), 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", d.etcdData(), err)
	}
	return nil
}

// lock takes an exclusive lock on the state directory so that two marina
// processes never run one management plane twice. The lock is released by
// the kernel when the process dies, however it dies. It waits a moment for
// the lock: Running probes it by taking it for an instant.
func (d stateDir) lock() (*os.File, error) {
	f, err := flock.Lock(d.path("lock"), time.Second)
	if errors.Is(err, flock.ErrHeld) {
		holder, _ := os.ReadFile(d.path("lock"))
		return nil, fmt.Errorf("state directory %s is in use by another marina (pid %s): "+
			"stop it first, or choose another directory with --state-dir", string(d), strings.TrimSpace(string(holder)))
	}
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// Running reports whether a marina up runs on the state directory dir: it
// holds the directory's lock.
func Running(dir string) (bool, error) {
	return flock.Held(stateDir(dir).path("lock"))
}

// AdminKubeconfig is the administrator's kubeconfig of the management plane
// whose state directory is dir.
func AdminKubeconfig(dir string) string { return stateDir(dir).AdminKubeconfig() }

// certs are the management plane's certificates.
type certs struct {
	ca *pki.KeyPair
}

// leaf describes one certificate the plane needs, written as pki/<name>.{crt,key}.
type leaf struct {
	name string
	spec pki.CertSpec
}

var loopback = []net.IP{net.ParseIP("127.0.0.1")}

// leaves are issued from the plane's CA. Client certificates carry the user
// (CN) and groups (O) the API server authorizes with RBAC. The bootstrap
// policy lets system:kube-controller-manager make one service account per
// controller and request its tokens, and nothing more: its controllers run
// as those accounts (--use-service-account-credentials), each with its own
// system:controller:<name> role.
var leaves = []leaf{
	{"etcd", pki.CertSpec{CommonName: "etcd", DNSNames: []string{"localhost"}, IPs: loopback, Usage: pki.ServerAuth | pki.ClientAuth}},
	{"apiserver", pki.CertSpec{CommonName: "kube-apiserver", DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}, IPs: loopback, Usage: pki.ServerAuth}},
	{"apiserver-etcd-client", pki.CertSpec{CommonName: "kube-apiserver-etcd-client", Usage: pki.ClientAuth}},
	{"admin", pki.CertSpec{CommonName: "marina-admin", Organizations: []string{"system:masters"}, Usage: pki.ClientAuth}},
	{"controller-manager", pki.CertSpec{CommonName: "system:kube-controller-manager", Usage: pki.ClientAuth}},
	// marina's admission webhook, served in-process on loopback; the API
	// server trusts it through the plane's CA.
	{"webhook", pki.CertSpec{CommonName: "marina-webhook", DNSNames: []string{"localhost"}, IPs: loopback, Usage: pki.ServerAuth}},
}

// ensurePKI loads the CA, generating it on first start, and (re)issues every
// leaf certificate that is missing or near expiry. A CA that exists but cannot
// be read is corruption, never a reason to silently make a new one: every
// client of the plane trusts the old CA.
func (d stateDir) ensurePKI(now time.Time) (*certs, error) {
	ca, err := pki.Load(d.pki(), "ca")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, statErr := os.Stat(filepath.Join(d.pki(), "ca.crt")); statErr == nil {
			return nil, d.corrupt("pki/ca.key is missing", err)
		}
		if ca, err = pki.NewCA("marina-management-plane"); err != nil {
			return nil, err
		}
		if err := ca.Write(d.pki(), "ca"); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, d.corrupt("pki/ca", err)
	}
	for _, l := range leaves {
		kp, err := pki.Load(d.pki(), l.name)
		if err == nil && !pki.NeedsRenewal(kp.Cert, now) && kp.Cert.CheckSignatureFrom(ca.Cert) == nil {
			continue
		}
		if kp, err = ca.Issue(l.spec); err != nil {
			return nil, err
		}
		if err := kp.Write(d.pki(), l.name); err != nil {
			return nil, err
		}
	}
	if err := d.ensureServiceAccountKey(); err != nil {
		return nil, err
	}
	return &certs{ca: ca}, nil
}

// ensureServiceAccountKey creates the key pair that signs service account
// tokens; it is kept across restarts so issued tokens stay valid.
func (d stateDir) ensureServiceAccountKey() error {
	keyPath := filepath.Join(d.pki(), "sa.key")
	pubPath := filepath.Join(d.pki(), "sa.pub")
	data, err := os.ReadFile(keyPath)
	switch {
	case err == nil:
		// The key exists: never replace it, or every issued token dies.
		block, _ := pem.Decode(data)
		if block == nil {
			return d.corrupt("pki/sa.key", errors.New("no PEM block"))
		}
		key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return d.corrupt("pki/sa.key", err)
		}
		if _, err := os.Stat(pubPath); err == nil {
			return nil
		}
		signer, ok := key.(interface{ Public() crypto.PublicKey })
		if !ok {
			return d.corrupt("pki/sa.key", errors.New("not a signing key"))
		}
		return writePublicKey(pubPath, signer.Public())
	case !errors.Is(err, fs.ErrNotExist):
		return d.corrupt("pki/sa.key", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating service account key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("encoding service account key: %w", err)
	}
	if err := files.WriteAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	return writePublicKey(pubPath, key.Public())
}

func writePublicKey(path string, pub crypto.PublicKey) error {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return fmt.Errorf("encoding service account public key: %w", err)
	}
	return files.WriteAtomic(path, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600)
}

// writeKubeconfig writes a kubeconfig (0600) that reaches server as the
// client certificate pki/<certName>, with the certificate data embedded so
// the file works on its own.
func (d stateDir) writeKubeconfig(path, server string, ca *pki.KeyPair, certName string) error {
	client, err := pki.Load(d.pki(), certName)
	if err != nil {
		return d.corrupt("pki/"+certName, err)
	}
	data, err := kubeconfig.Encode("marina", "marina", server, ca.CertPEM(), client)
	if err != nil {
		return err
	}
	return files.WriteAtomic(path, data, 0o600)
}

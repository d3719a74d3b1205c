package plane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"marina.dev/marina/internal/pki"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/tools"
)

func testOptions(t *testing.T, stateDir, kubeVersion string) Options {
	t.Helper()
	binDir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	// One block of three: two separate picks could hand out the same port.
	base := testenv.FreePorts(t, 3)
	return Options{
		StateDir:    stateDir,
		BinDir:      binDir,
		KubeVersion: kubeVersion,
		EtcdVersion: tools.Pinned().Etcd,
		APIPort:     base,
		EtcdPort:    base + 1,
	}
}

func startPlane(t *testing.T, opts Options) *Plane {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("starting the management plane: %v", err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	return p
}

// The whole life of a management plane across a version upgrade: every
// pinned release serves /version with its own version, objects survive each
// restart, and only clients with a certificate from the plane's CA get in.
func TestPlaneKeepsObjectsAcrossRestartsAndUpgrades(t *testing.T) {
	stateDir := t.TempDir()
	ctx := context.Background()
	for i, version := range tools.Pinned().Kube {
		p := startPlane(t, testOptions(t, stateDir, version))
		cs := kubernetes.NewForConfigOrDie(p.Config())

		info, err := cs.Discovery().ServerVersion()
		if err != nil {
			t.Fatalf("GET /version: %v", err)
		}
		if info.GitVersion != version {
			t.Errorf("/version reports %q, want %q", info.GitVersion, version)
		}
		// Every earlier start left one ConfigMap behind; all must still be here.
		for j := 0; j < i; j++ {
			if _, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "kept-"+strconv.Itoa(j), metav1.GetOptions{}); err != nil {
				t.Errorf("object from start %d lost after restart on %s: %v", j, version, err)
			}
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kept-" + strconv.Itoa(i)}}
		if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating a ConfigMap: %v", err)
		}
		if err := p.Stop(); err != nil {
			t.Fatalf("stopping: %v", err)
		}
		for name, pid := range p.PIDs() {
			if processAlive(pid) {
				t.Errorf("%s (pid %d) still runs after Stop", name, pid)
			}
		}
	}
}

func TestPlaneRefusesClientsWithoutItsCertificate(t *testing.T) {
	stateDir := t.TempDir()
	p := startPlane(t, testOptions(t, stateDir, tools.Pinned().NewestKube()))

	if _, err := kubernetes.NewForConfigOrDie(p.Config()).CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatalf("the admin kubeconfig cannot list namespaces: %v", err)
	}
	st, err := os.Stat(p.AdminKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("admin kubeconfig has mode %v, want 0600", st.Mode().Perm())
	}

	caPEM, err := os.ReadFile(filepath.Join(stateDir, "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	foreignCA, _ := pki.NewCA("intruder")
	foreign, _ := foreignCA.Issue(pki.CertSpec{CommonName: "marina-admin", Organizations: []string{"system:masters"}, Usage: pki.ClientAuth})
	foreignKey, _ := foreign.KeyPEM()
	foreignPair, err := tls.X509KeyPair(foreign.CertPEM(), foreignKey)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]tls.Certificate{
		"no client certificate":         nil,
		"certificate from a foreign CA": {foreignPair},
	}
	for name, certs := range cases {
		t.Run(name, func(t *testing.T) {
			httpClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs}}}
			resp, err := httpClient.Get(p.Config().Host + "/api/v1/namespaces")
			if err != nil {
				// A TLS-level rejection of the certificate is a refusal too.
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("status %d (%s), want 401 Unauthorized", resp.StatusCode, body)
			}
		})
	}
}

func TestPlaneStartErrorsNameTheFix(t *testing.T) {
	newest := tools.Pinned().NewestKube()
	t.Run("missing binary", func(t *testing.T) {
		opts := testOptions(t, t.TempDir(), newest)
		opts.BinDir = t.TempDir()
		_, err := Start(context.Background(), opts)
		assertErrorContains(t, err, "make setup")
	})
	t.Run("port in use", func(t *testing.T) {
		opts := testOptions(t, t.TempDir(), newest)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(opts.APIPort)))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		_, err = Start(context.Background(), opts)
		assertErrorContains(t, err, "--api-port")
	})
	t.Run("corrupt CA", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "pki"), 0o700); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"ca.crt", "ca.key"} {
			if err := os.WriteFile(filepath.Join(dir, "pki", f), []byte("not PEM"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		_, err := Start(context.Background(), testOptions(t, dir, newest))
		assertErrorContains(t, err, "is corrupt")
		if data, _ := os.ReadFile(filepath.Join(dir, "pki", "ca.crt")); string(data) != "not PEM" {
			t.Error("the corrupt CA was overwritten; it must be left for the operator to restore")
		}
	})
	t.Run("corrupt etcd data", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "etcd", "member", "snap"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "etcd", "member", "snap", "db"), []byte("garbage"), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := Start(ctx, testOptions(t, dir, newest))
		assertErrorContains(t, err, "etcd")
	})
	t.Run("state directory in use", func(t *testing.T) {
		dir := t.TempDir()
		startPlane(t, testOptions(t, dir, newest))
		_, err := Start(context.Background(), testOptions(t, dir, newest))
		assertErrorContains(t, err, "in use by another marina")
	})
}

func assertErrorContains(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("Start succeeded, want an error containing %q", want)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not contain %q", err, want)
	}
}

func processAlive(pid int) bool {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// A zombie has exited; only its parent has yet to collect it.
	fields := strings.Fields(string(data))
	return len(fields) > 2 && fields[2] != "Z"
}

package bootstrap_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/manifest"
	"marina.dev/marina/internal/nodeagent/components"
	"marina.dev/marina/internal/pki"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/tools"
)

// TestStackedMachineRunsAWorkingControlPlane writes the bundle of a lone
// stacked control-plane machine into a sandbox, runs it with the real
// components under the supervisor, and checks what each part of the bundle
// is for: the serving certificate and client CA (an admin reaches /readyz
// over verified TLS), the pinned version, the controller manager's and the
// scheduler's kubeconfigs (they hold their leader Leases), the
// service-account key and root CA (the default ServiceAccount and
// kube-root-ca.crt appear), cluster signing (a kubelet's CSR is signed by
// the cluster CA), the etcd healthcheck client and the controller manager's
// secure port; then that no process outlives the supervisor.
func TestStackedMachineRunsAWorkingControlPlane(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd, kube-apiserver, kube-controller-manager and kube-scheduler")
	}
	binDir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	version := tools.Pinned().NewestKube()
	for _, b := range []string{"etcd-" + tools.Pinned().Etcd, "kube-apiserver-" + version, "kube-controller-manager-" + version, "kube-scheduler-" + version} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			t.Fatalf("%s is missing: run `make setup` to build the pinned components: %v", b, err)
		}
	}

	set := newSet(t)
	ip, ports := machineAddress(t)
	dir := t.TempDir()
	m := &bootstrap.Machine{
		ClusterName: "it",
		PKI:         set,
		Name:        "it-cp-0",
		IP:          ip,
		Endpoint:    net.JoinHostPort(ip.String(), strconv.Itoa(ports.APIServer)),
		Ports:       ports,
		Version:     version,
		BinDir:      binDir,
		Dir:         dir,
		Etcd:        bootstrap.EtcdConfig{Stacked: &bootstrap.StackedEtcd{}},
	}
	b, err := bootstrap.ControlPlane(m, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Write(); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	sup, stop := supervise(t, dir)
	ctx := context.Background()

	cs := adminClient(t, set, m.Endpoint)
	testenv.Eventually(t, 90*time.Second, "kube-apiserver answers /readyz over TLS verified against the cluster CA", func() error {
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return err
		}
		if string(body) != "ok" {
			return fmt.Errorf("/readyz says %q", body)
		}
		return nil
	})
	t.Logf("/readyz ok %s after the supervisor started", time.Since(start).Round(10*time.Millisecond))

	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != version {
		t.Errorf("/version reports %s, want the pinned %s", v.GitVersion, version)
	}

	for _, lease := range []string{"kube-controller-manager", "kube-scheduler"} {
		testenv.Eventually(t, 60*time.Second, lease+" holds its leader Lease", func() error {
			l, err := cs.CoordinationV1().Leases("kube-system").Get(ctx, lease, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
				return errors.New("no holder")
			}
			return nil
		})
	}
	t.Logf("both leader Leases held %s after the start", time.Since(start).Round(10*time.Millisecond))

	testenv.Eventually(t, 60*time.Second, "the default ServiceAccount and kube-root-ca.crt appear in the default namespace", func() error {
		if _, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return err
		}
		cm, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cm.Data["ca.crt"] != string(set.CA.CertPEM()) {
			return errors.New("kube-root-ca.crt does not hold the cluster CA")
		}
		return nil
	})

	checkKubeletCSRIsSigned(ctx, t, cs, set)
	t.Logf("a kubelet's CSR signed %s after the start", time.Since(start).Round(10*time.Millisecond))

	checkEtcdHealth(t, b, m)
	checkControllerManagerHealthz(t, net.JoinHostPort(ip.String(), strconv.Itoa(ports.ControllerManager)))

	var running []proc
	for _, st := range sup.Status() {
		if st.State != components.Running || st.PID == 0 {
			t.Errorf("%s is %s (restarts %d), want Running", st.Name, st.State, st.Restarts)
			continue
		}
		if st.Restarts != 0 {
			t.Errorf("%s was restarted %d times", st.Name, st.Restarts)
		}
		running = append(running, procOf(t, st.PID))
	}
	if len(running) != 4 {
		t.Errorf("%d components run, want 4", len(running))
	}
	stopStart := time.Now()
	stop()
	t.Logf("the supervisor stopped in %s", time.Since(stopStart).Round(10*time.Millisecond))
	for _, st := range sup.Status() {
		if e := st.LastExit; e != nil {
			t.Logf("%s exited with code %d, signal %q, after %s", st.Name, e.Code, e.Signal, e.At.Sub(stopStart).Round(10*time.Millisecond))
		}
	}
	for _, p := range running {
		if p.alive() {
			t.Errorf("process %d still runs after the supervisor stopped", p.pid)
		}
	}
}

// supervise runs a supervisor of sandbox dir until stop is called or the
// test ends, and shows the end of each component's log if the test failed.
func supervise(t *testing.T, dir string) (sup *components.Supervisor, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sup = components.New(dir, components.Options{})
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the supervisor of %s: %v", dir, err)
			}
		case <-time.After(time.Minute):
			t.Errorf("the supervisor of %s did not stop within a minute", dir)
		}
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			for _, st := range sup.Status() {
				t.Logf("last lines of %s's log in %s:\n%s", st.Name, dir, files.Tail(manifest.LogPath(dir, st.Name), 15))
			}
		}
	})
	return sup, stop
}

// machineAddress picks a loopback address of its own for the machine,
// 127.0.x.y, with the default ports free on it; should something listen on
// a default port on every address, it takes free ports instead.
func machineAddress(t *testing.T) (net.IP, bootstrap.Ports) {
	t.Helper()
	defaults := bootstrap.Ports{
		APIServer: bootstrap.DefaultAPIServerPort, EtcdClient: bootstrap.DefaultEtcdClientPort, EtcdPeer: bootstrap.DefaultEtcdPeerPort,
		ControllerManager: bootstrap.DefaultControllerManagerPort, Scheduler: bootstrap.DefaultSchedulerPort,
	}
	for attempt := 0; attempt < 20; attempt++ {
		n, err := rand.Int(rand.Reader, big.NewInt(254*254))
		if err != nil {
			t.Fatal(err)
		}
		ip := net.IPv4(127, 0, byte(n.Int64()/254+1), byte(n.Int64()%254+1))
		if ip.Equal(net.IPv4(127, 0, 0, 1)) {
			continue
		}
		if portsFree(ip, defaults) {
			return ip, defaults
		}
	}
	base := testenv.FreePorts(t, 5)
	ports := bootstrap.Ports{APIServer: base, EtcdClient: base + 1, EtcdPeer: base + 2, ControllerManager: base + 3, Scheduler: base + 4}
	ip := net.IPv4(127, 0, 0, 1)
	if !portsFree(ip, ports) {
		t.Fatal("no free address and ports for the machine")
	}
	return ip, ports
}

func portsFree(ip net.IP, p bootstrap.Ports) bool {
	for _, port := range []int{p.APIServer, p.EtcdClient, p.EtcdPeer, p.ControllerManager, p.Scheduler} {
		l, err := net.Listen("tcp", net.JoinHostPort(ip.String(), strconv.Itoa(port)))
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}

// adminClient reaches server as a cluster administrator with a client
// certificate of the cluster CA, trusting only that CA.
func adminClient(t *testing.T, set *clusterpki.Set, server string) *kubernetes.Clientset {
	t.Helper()
	admin, err := set.CA.Issue(pki.CertSpec{CommonName: "test-admin", Organizations: []string{"system:masters"}, Usage: pki.ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	key, err := admin.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(&rest.Config{
		Host:    "https://" + server,
		Timeout: 10 * time.Second,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: set.CA.CertPEM(), CertData: admin.CertPEM(), KeyData: key,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// checkKubeletCSRIsSigned asks for a kubelet client certificate for
// system:node:test, approves it, and checks that kube-controller-manager
// signs it with the cluster CA.
func checkKubeletCSRIsSigned(ctx context.Context, t *testing.T, cs *kubernetes.Clientset, set *clusterpki.Set) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:test", Organization: []string{"system:nodes"}},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "node-test"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}
	if csr, err = cs.CertificatesV1().CertificateSigningRequests().Create(ctx, csr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test", Message: "approved by the test",
	})
	if _, err := cs.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var issued []byte
	testenv.Eventually(t, 60*time.Second, "the approved CSR of system:node:test is signed", func() error {
		got, err := cs.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range got.Status.Conditions {
			if c.Type == certificatesv1.CertificateFailed {
				return fmt.Errorf("signing failed: %s", c.Message)
			}
		}
		if len(got.Status.Certificate) == 0 {
			return errors.New("no certificate yet")
		}
		issued = got.Status.Certificate
		return nil
	})
	block, _ := pem.Decode(issued)
	if block == nil {
		t.Fatal("the CSR's certificate is not PEM")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(set.CA.Cert)
	if _, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the kubelet's certificate does not verify against the cluster CA: %v", err)
	}
	if c.Subject.CommonName != "system:node:test" {
		t.Errorf("the kubelet's certificate is for %q", c.Subject.CommonName)
	}
}

// checkEtcdHealth asks the etcd member for /health with the bundle's
// healthcheck client certificate, trusting only the etcd CA.
func checkEtcdHealth(t *testing.T, b *bootstrap.Bundle, m *bootstrap.Machine) {
	t.Helper()
	pair, err := tls.X509KeyPair(b.Files[bootstrap.EtcdHealthcheckClientCert].Data, b.Files[bootstrap.EtcdHealthcheckClientKey].Data)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b.Files[bootstrap.EtcdCACert].Data)
	body := httpsGet(t, &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}},
		"https://"+net.JoinHostPort(m.IP.String(), strconv.Itoa(m.Ports.EtcdClient))+"/health")
	if !strings.Contains(body, `"health":"true"`) {
		t.Errorf("etcd /health = %s", body)
	}
}

// checkControllerManagerHealthz asks kube-controller-manager's secure port
// for /healthz, which any client may read. It serves a self-signed
// certificate of its own, as under kubeadm, hence no verification.
func checkControllerManagerHealthz(t *testing.T, addr string) {
	t.Helper()
	body := httpsGet(t, &tls.Config{InsecureSkipVerify: true}, "https://"+addr+"/healthz")
	if body != "ok" {
		t.Errorf("kube-controller-manager /healthz = %q", body)
	}
}

func httpsGet(t *testing.T, cfg *tls.Config, url string) string {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	defer client.CloseIdleConnections()
	var body string
	testenv.Eventually(t, 30*time.Second, "GET "+url, func() error {
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", resp.Status, data)
		}
		body = string(data)
		return nil
	})
	return body
}

package local

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"

	"marina.dev/marina/internal/loadbalancer"
	"marina.dev/marina/internal/pki"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider"
)

// backend is an HTTPS server on its own loopback address, as an API server
// would be, answering /readyz and /hello.
func backend(t *testing.T, ca *pki.KeyPair, ip string) string {
	t.Helper()
	pair, err := ca.Issue(pki.CertSpec{CommonName: "apiserver", IPs: []net.IP{net.ParseIP(ip)}, Usage: pki.ServerAuth})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pair.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(pair.CertPEM(), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", net.JoinHostPort(ip, "0"), &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok "+r.URL.Path) })}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

// A cluster's endpoint is one balancer process on an address of its own,
// the same across calls and restarts of marina, following its backends,
// started again when it dies, and gone without a trace when deleted.
func TestEndpointLifecycle(t *testing.T) {
	ctx := context.Background()
	p := newProvider(t)
	ca, err := pki.NewCA("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	req := &provider.EndpointRequest{UID: uuid.NewUUID(), Namespace: "default", Name: "c1", CAData: ca.CertPEM()}

	host, port, err := p.EnsureEndpoint(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(host, "127.") || port != EndpointPort {
		t.Fatalf("endpoint %s:%d, want a 127/8 address on port %d", host, port, EndpointPort)
	}
	dir := p.endpointDir(req.UID)
	pid := balancerPIDOf(t, dir)

	// A machine made afterwards never gets the endpoint's address.
	if _, err := p.Create(ctx, request("w0")); err != nil {
		t.Fatal(err)
	}
	used, err := p.usedAddresses()
	if err != nil {
		t.Fatal(err)
	}
	if !used[host] || len(used) != 2 {
		t.Errorf("the allocator sees %v, want the endpoint's %s and one machine's", used, host)
	}

	// The backends reach the running balancer: a client gets through.
	be := backend(t, ca, "127.0.0.1")
	req.Backends = []string{be}
	if h, pt, err := p.EnsureEndpoint(ctx, req); err != nil || h != host || pt != port {
		t.Fatalf("second EnsureEndpoint: %s:%d, %v; want %s:%d", h, pt, err, host, port)
	}
	if got := balancerPIDOf(t, dir); got != pid {
		t.Errorf("the balancer was restarted for a change of backends (pid %d, then %d)", pid, got)
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true, // the test server's certificate names 127.0.0.1, not the endpoint
	}}}
	testenv.Eventually(t, 20*time.Second, "a request through the endpoint reaches the backend", func() error {
		resp, err := client.Get("https://" + net.JoinHostPort(host, "6443") + "/hello")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if string(body) != "ok /hello" {
			return io.ErrUnexpectedEOF
		}
		return nil
	})

	// A restarted marina (a new Provider on the same root) finds it.
	again, err := New(Options{Root: p.root, AgentCommand: agentCommand, LoadBalancerCommand: lbCommand})
	if err != nil {
		t.Fatal(err)
	}
	if h, _, err := again.EnsureEndpoint(ctx, req); err != nil || h != host {
		t.Fatalf("after a restart: %s, %v; want %s", h, err, host)
	}
	if got := balancerPIDOf(t, dir); got != pid {
		t.Errorf("a restart of marina started a second balancer (pid %d, then %d)", pid, got)
	}

	// A balancer that died is started again.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the killed balancer releases its lock", func() error {
		if running, _ := loadbalancer.Running(dir); running {
			return io.ErrNoProgress
		}
		return nil
	})
	if h, _, err := p.EnsureEndpoint(ctx, req); err != nil || h != host {
		t.Fatalf("after the balancer died: %s, %v; want %s", h, err, host)
	}
	if got := balancerPIDOf(t, dir); got == pid {
		t.Error("the dead balancer was not replaced")
	}

	if err := p.DeleteEndpoint(ctx, req.UID); err != nil {
		t.Fatal(err)
	}
	if running, _ := loadbalancer.Running(dir); running {
		t.Error("the balancer still runs after DeleteEndpoint")
	}
	if left, _ := filepath.Glob(filepath.Join(p.root, endpointsDir, "*")); len(left) > 0 {
		t.Errorf("DeleteEndpoint left %v", left)
	}
	if err := p.DeleteEndpoint(ctx, req.UID); err != nil {
		t.Errorf("a second DeleteEndpoint: %v", err)
	}
}

func balancerPIDOf(t *testing.T, dir string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, loadbalancer.PIDFile))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

package loadbalancer

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/klog/v2/textlogger"

	"marina.dev/marina/internal/pki"
	"marina.dev/marina/internal/testenv"
)

// waitFor polls cond until it holds, failing the test after timeout.
var waitFor = testenv.Eventually

// quietLog drops a test server's own log: the handshakes cut short by the
// tests are expected.
func quietLog() *log.Logger { return log.New(io.Discard, "", 0) }

// testPKI is a cluster CA, a serving certificate for 127.0.0.1 and a client
// certificate, as a cluster's API servers and the balancer's checks use.
type testPKI struct {
	pool       *x509.CertPool
	serving    tls.Certificate
	client     tls.Certificate
	caPEM      []byte
	clientPEM  []byte
	clientKey  []byte
	checkerTLS *tls.Config // what the balancer checks with
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	ca, err := pki.NewCA("test-cluster-ca")
	if err != nil {
		t.Fatal(err)
	}
	serving, err := ca.Issue(pki.CertSpec{CommonName: "kube-apiserver", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Usage: pki.ServerAuth})
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue(pki.CertSpec{CommonName: "marina-load-balancer", Usage: pki.ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{pool: x509.NewCertPool(), caPEM: ca.CertPEM(), clientPEM: client.CertPEM()}
	p.pool.AddCert(ca.Cert)
	if p.serving, err = tlsPair(serving); err != nil {
		t.Fatal(err)
	}
	if p.clientKey, err = client.KeyPEM(); err != nil {
		t.Fatal(err)
	}
	if p.client, err = tls.X509KeyPair(p.clientPEM, p.clientKey); err != nil {
		t.Fatal(err)
	}
	p.checkerTLS = &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{p.client}, MinVersion: tls.VersionTLS12}
	return p
}

func tlsPair(k *pki.KeyPair) (tls.Certificate, error) {
	key, err := k.KeyPEM()
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(k.CertPEM(), key)
}

// testBackend is an HTTPS server standing in for a kube-apiserver: /readyz
// refuses anonymous requests, as an API server without anonymous auth
// does, fails while ready is false and never answers while hung; /whoami answers its name, or 503
// while sick (an API server that lost etcd).
type testBackend struct {
	name   string
	srv    *httptest.Server
	addr   string
	ready  atomic.Bool
	sick   atomic.Bool
	hung   atomic.Bool  // /readyz never answers
	hits   atomic.Int64 // /whoami requests served
	checks atomic.Int64 // /readyz requests answered
}

func newBackend(t testing.TB, p *testPKI, name string, ready bool) *testBackend {
	t.Helper()
	tb := &testBackend{name: name}
	tb.ready.Store(ready)
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		tb.checks.Add(1)
		if tb.hung.Load() {
			<-r.Context().Done()
			return
		}
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		if !tb.ready.Load() {
			http.Error(w, "[-]etcd failed: reason withheld\nreadyz check failed", http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("/whoami", func(w http.ResponseWriter, _ *http.Request) {
		if tb.sick.Load() {
			http.Error(w, "etcd unreachable", http.StatusServiceUnavailable)
			return
		}
		tb.hits.Add(1)
		fmt.Fprint(w, tb.name)
	})
	tb.srv = httptest.NewUnstartedServer(mux)
	tb.srv.TLS = &tls.Config{
		Certificates: []tls.Certificate{p.serving},
		ClientCAs:    p.pool,
		ClientAuth:   tls.VerifyClientCertIfGiven,
		MinVersion:   tls.VersionTLS12,
	}
	tb.srv.Config.ErrorLog = quietLog()
	tb.srv.StartTLS()
	tb.addr = tb.srv.Listener.Addr().String()
	t.Cleanup(tb.srv.Close)
	return tb
}

// kill stops the backend as kill -9 would: no more connections, and the
// open ones cut.
func (tb *testBackend) kill() {
	tb.srv.Listener.Close()
	tb.srv.CloseClientConnections()
}

// fastCheck makes failover take a fraction of a second.
func fastCheck(p *testPKI) HealthCheck {
	return HealthCheck{TLS: p.checkerTLS, Interval: 50 * time.Millisecond, Timeout: 500 * time.Millisecond, FailThreshold: 3, RiseThreshold: 2}
}

// startBalancer serves cfg on a free loopback port until the test ends, and
// then checks that Serve returned.
func startBalancer(t testing.TB, cfg Config) (*Balancer, string, context.CancelFunc) {
	t.Helper()
	if cfg.Log.GetSink() == nil {
		cfg.Log = textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(1), textlogger.Output(testWriter{t})))
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("Serve did not return within 5s of its context ending")
		}
	})
	return b, l.Addr().String(), cancel
}

// testWriter sends the balancer's log to the test's, while it runs.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // a log line after the test ended
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// client makes one connection per request through the balancer, as a
// client reconnecting would, and trusts the cluster CA.
func client(p *testPKI) *http.Client {
	return &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: p.pool, MinVersion: tls.VersionTLS12},
			DisableKeepAlives: true,
		},
	}
}

// whoami asks the backend behind addr for its name.
func whoami(c *http.Client, addr string) (string, error) {
	resp, err := c.Get("https://" + addr + "/whoami")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return string(body), nil
}

// persistentConn is one TLS connection through the balancer that the test
// sends several requests over, to see whether the balancer kept it.
type persistentConn struct {
	conn *tls.Conn
	r    *bufio.Reader
}

func dialPersistent(t testing.TB, p *testPKI, addr string) *persistentConn {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, &tls.Config{RootCAs: p.pool, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("connecting through the balancer: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return &persistentConn{conn: conn, r: bufio.NewReader(conn)}
}

func (pc *persistentConn) whoami() (string, error) {
	_ = pc.conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(pc.conn, "GET /whoami HTTP/1.1\r\nHost: lb\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(pc.r, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// closed reports whether the balancer closed the connection.
func (pc *persistentConn) closed() error {
	_, err := pc.whoami()
	if err == nil {
		return errors.New("the connection still works")
	}
	return nil
}

func healthy(b *Balancer, addr string) bool {
	for _, s := range b.Status() {
		if s.Address == addr {
			return s.Healthy
		}
	}
	return false
}

func waitHealthy(t testing.TB, b *Balancer, want bool, backends ...*testBackend) {
	t.Helper()
	for _, be := range backends {
		waitFor(t, 5*time.Second, fmt.Sprintf("%s healthy=%v", be.name, want), func() error {
			if healthy(b, be.addr) != want {
				return fmt.Errorf("status %+v", b.Status())
			}
			return nil
		})
	}
}

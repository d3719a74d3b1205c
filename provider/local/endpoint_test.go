package local

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
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

// Without Options.LoadBalancerCommand the provider says so, and makes
// nothing.
func TestEndpointNeedsTheLoadBalancerCommand(t *testing.T) {
	p, err := New(Options{Root: t.TempDir(), AgentCommand: agentCommand})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = p.EnsureEndpoint(context.Background(), &provider.EndpointRequest{UID: uuid.NewUUID(), Namespace: "default", Name: "c1", CAData: []byte("x")})
	if err == nil || !strings.Contains(err.Error(), "LoadBalancerCommand") {
		t.Fatalf("EnsureEndpoint without a LoadBalancerCommand: %v, want an error naming it", err)
	}
	if _, err := os.Stat(filepath.Join(p.root, endpointsDir)); !os.IsNotExist(err) {
		t.Errorf("it made %s anyway (%v)", endpointsDir, err)
	}
}

// The request reaches the balancer's directory: backends (sorted, without
// repeats), the CA and the client pair, all 0600; a request that changes
// nothing writes nothing, and no call starts a second balancer.
func TestEndpointFollowsItsRequest(t *testing.T) {
	ctx := context.Background()
	p := newProvider(t)
	ca, err := pki.NewCA("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue(pki.CertSpec{CommonName: "marina-endpoint", Usage: pki.ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := client.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	req := &provider.EndpointRequest{UID: uuid.NewUUID(), Namespace: "default", Name: "c1", CAData: ca.CertPEM(),
		ClientCert: client.CertPEM(), ClientKey: keyPEM}
	dir := p.endpointDir(req.UID)
	ensure := func() {
		t.Helper()
		if _, _, err := p.EnsureEndpoint(ctx, req); err != nil {
			t.Fatal(err)
		}
		if n := balancersOf(dir); n != 1 {
			t.Fatalf("%d balancers run for the endpoint, want 1", n)
		}
	}

	ensure()
	if got := readEndpoint(t, dir).Backends; len(got) != 0 {
		t.Errorf("backends %v, want none yet", got)
	}
	for name, want := range map[string][]byte{loadbalancer.CAFile: req.CAData, loadbalancer.ClientCertFile: req.ClientCert, loadbalancer.ClientKeyFile: req.ClientKey} {
		path := filepath.Join(dir, name)
		got, err := os.ReadFile(path)
		if err != nil || string(got) != string(want) {
			t.Errorf("%s does not hold what was asked (%v)", name, err)
		}
		if info, err := os.Stat(path); err != nil || info.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v; want 0600", name, info.Mode().Perm(), err)
		}
	}

	req.Backends = []string{"127.0.0.3:6443", "127.0.0.2:6443", "127.0.0.3:6443"}
	ensure()
	if got, want := readEndpoint(t, dir).Backends, []string{"127.0.0.2:6443", "127.0.0.3:6443"}; !slices.Equal(got, want) {
		t.Errorf("backends %v, want %v", got, want)
	}
	before := inodes(t, dir)
	req.Backends = []string{"127.0.0.2:6443", "127.0.0.3:6443"}
	ensure()
	if after := inodes(t, dir); after != before {
		t.Errorf("a request that changed nothing rewrote the directory (%s, then %s)", before, after)
	}

	req.Backends = []string{"127.0.0.2:6443"}
	ensure()
	if got := readEndpoint(t, dir).Backends; !slices.Equal(got, req.Backends) {
		t.Errorf("backends %v after a machine left, want %v", got, req.Backends)
	}
	// Health checks without a client certificate: the pair goes.
	req.ClientCert, req.ClientKey = nil, nil
	ensure()
	for _, name := range []string{loadbalancer.ClientCertFile, loadbalancer.ClientKeyFile} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("%s is still there (%v)", name, err)
		}
	}
	// The running balancer applied the last config, in place.
	testenv.Eventually(t, 10*time.Second, "the balancer reloads its config", func() error {
		data, _ := os.ReadFile(filepath.Join(dir, loadbalancer.LogFile))
		if !strings.Contains(string(data), `"Load balancer config reloaded" logger="load-balancer" backends=["127.0.0.2:6443"]`) {
			return errors.New("the reload to the last backends is not logged yet")
		}
		return nil
	})
}

// Machines and endpoints share one allocator: an endpoint and a machine
// seeded by the same UID, and endpoints and machines made at the same
// time from two Providers over one root, all get addresses of their own;
// and the endpoints are never taken for sandboxes.
func TestEndpointAndMachineAddressesNeverCollide(t *testing.T) {
	ctx := context.Background()
	p := newProvider(t)
	other, err := New(Options{Root: p.root, AgentCommand: agentCommand, LoadBalancerCommand: lbCommand, AgentStopTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.NewCA("kubernetes")
	if err != nil {
		t.Fatal(err)
	}

	// The same UID seeds the same first pick.
	shared := request("shared")
	host, _, err := p.EnsureEndpoint(ctx, &provider.EndpointRequest{UID: shared.UID, Name: "shared", CAData: ca.CertPEM()})
	if err != nil {
		t.Fatal(err)
	}
	inst, err := p.Create(ctx, shared)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Addresses[0].Address == host {
		t.Fatalf("the machine got its endpoint's address %s", host)
	}

	const n = 4
	var (
		mu        sync.Mutex
		addresses = map[string]string{host: "endpoint shared", inst.Addresses[0].Address: "machine shared"}
		errs      []error
	)
	owned := map[string]string{}
	claim := func(addr, who string) {
		mu.Lock()
		defer mu.Unlock()
		if prev, ok := addresses[addr]; ok && prev != who {
			errs = append(errs, fmt.Errorf("%s and %s both got %s", prev, who, addr))
		}
		if prev, ok := owned[who]; ok && prev != addr {
			errs = append(errs, fmt.Errorf("%s got two addresses, %s and %s", who, prev, addr))
		}
		addresses[addr], owned[who] = who, addr
	}
	var wg sync.WaitGroup
	for i := range n {
		cluster := &provider.EndpointRequest{UID: uuid.NewUUID(), Name: fmt.Sprintf("c%d", i), CAData: ca.CertPEM()}
		for _, prov := range []*Provider{p, other} {
			wg.Go(func() {
				h, _, err := prov.EnsureEndpoint(ctx, cluster)
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				claim(h, "endpoint "+cluster.Name)
			})
		}
		machine := request(fmt.Sprintf("m%d", i))
		wg.Go(func() {
			inst, err := p.Create(ctx, machine)
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			claim(inst.Addresses[0].Address, "machine "+machine.Name)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if len(addresses) != 2+2*n {
		t.Errorf("%d addresses for %d endpoints and %d machines: %v", len(addresses), n+1, n+1, addresses)
	}

	endpoints, err := p.EndpointUIDs()
	if err != nil {
		t.Fatal(err)
	}
	for _, uid := range endpoints {
		testenv.Eventually(t, 10*time.Second, "one balancer per endpoint", func() error {
			if got := balancersOf(p.endpointDir(uid)); got != 1 {
				return fmt.Errorf("%d balancers run for endpoint %s", got, uid)
			}
			return nil
		})
	}
	// The endpoints are not sandboxes, and deleting a machine leaves them.
	sandboxes, err := p.UIDs()
	if err != nil {
		t.Fatal(err)
	}
	if len(sandboxes) != n+1 || len(endpoints) != n+1 {
		t.Errorf("%d sandboxes and %d endpoints, want %d of each", len(sandboxes), len(endpoints), n+1)
	}
	if err := p.Delete(ctx, shared.UID); err != nil {
		t.Fatal(err)
	}
	if running, err := loadbalancer.Running(p.endpointDir(shared.UID)); err != nil || !running {
		t.Errorf("deleting the machine stopped the endpoint with its UID (running %v, %v)", running, err)
	}
}

// balancersOf counts the processes running the balancer of dir.
func balancersOf(dir string) int {
	n := 0
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || pid == os.Getpid() {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if slices.Contains(args, "load-balancer") && slices.Contains(args, dir) {
			n++
		}
	}
	return n
}

func readEndpoint(t *testing.T, dir string) loadbalancer.FileConfig {
	t.Helper()
	cfg, err := readEndpointConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// inodes names the files of dir the balancer reads by their inodes, which
// every write (a rename over) changes.
func inodes(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	for _, name := range []string{loadbalancer.ConfigFile, loadbalancer.CAFile, loadbalancer.ClientCertFile, loadbalancer.ClientKeyFile} {
		info, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s:%d ", name, info.Sys().(*syscall.Stat_t).Ino)
	}
	return b.String()
}

// An endpoint the user set at an address of this machine that the operator
// opened is where the balancer listens (so that machines elsewhere, such
// as servers on a bridge, reach the API servers behind it); one at an
// address not opened is refused; one at any other host is the user's, and
// nothing is made for it.
func TestEndpointAtTheUsersLocalAddress(t *testing.T) {
	ctx := context.Background()
	p := newProvider(t)
	ca, err := pki.NewCA("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	// A free port on 127.0.0.1, an address of this machine that the
	// allocator never hands out.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()

	req := &provider.EndpointRequest{UID: uuid.NewUUID(), Namespace: "default", Name: "c1", CAData: ca.CertPEM(), Host: "127.0.0.1", Port: int32(port)}
	// Issue 24: only addresses the operator opened. A cluster's balancer
	// on any address of this host could take a port the management plane
	// needs when it restarts.
	_, _, err = p.EnsureEndpoint(ctx, req)
	if !provider.IsEndpointNotAllowed(err) || !strings.Contains(err.Error(), "--endpoint-addresses") {
		t.Fatalf("EnsureEndpoint at 127.0.0.1 with no address open: %v, want an EndpointNotAllowedError naming --endpoint-addresses", err)
	}
	p.opts.EndpointAddresses = []netip.Prefix{netip.MustParsePrefix("10.77.0.0/24")}
	if _, _, err = p.EnsureEndpoint(ctx, req); !provider.IsEndpointNotAllowed(err) || !strings.Contains(err.Error(), "10.77.0.0/24") {
		t.Fatalf("EnsureEndpoint at 127.0.0.1 with 10.77.0.0/24 open: %v, want an EndpointNotAllowedError naming 10.77.0.0/24", err)
	}
	if uids, err := p.EndpointUIDs(); err != nil || len(uids) != 0 {
		t.Fatalf("endpoints after refused requests: %v, %v; want none", uids, err)
	}
	p.opts.EndpointAddresses = append(p.opts.EndpointAddresses, netip.MustParsePrefix("127.0.0.1/32"))
	host, got, err := p.EnsureEndpoint(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if host != "127.0.0.1" || int(got) != port {
		t.Fatalf("endpoint %s:%d, want the user's 127.0.0.1:%d", host, got, port)
	}
	be := backend(t, ca, "127.0.0.1")
	req.Backends = []string{be}
	if h, pt, err := p.EnsureEndpoint(ctx, req); err != nil || h != host || pt != got {
		t.Fatalf("second EnsureEndpoint: %s:%d, %v; want %s:%d", h, pt, err, host, got)
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true, // the test server's certificate is not what is checked here
	}}}
	testenv.Eventually(t, 20*time.Second, "a request to the user's address reaches the backend", func() error {
		resp, err := client.Get("https://" + net.JoinHostPort(host, strconv.Itoa(port)) + "/hello")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if string(body) != "ok /hello" {
			return fmt.Errorf("got %q", body)
		}
		return nil
	})
	if err := p.DeleteEndpoint(ctx, req.UID); err != nil {
		t.Fatal(err)
	}

	// 192.0.2.1 (TEST-NET-1) is no address of this machine: the user's.
	other := &provider.EndpointRequest{UID: uuid.NewUUID(), Namespace: "default", Name: "c2", CAData: ca.CertPEM(), Host: "192.0.2.1", Port: 6443}
	if _, _, err := p.EnsureEndpoint(ctx, other); !provider.IsEndpointElsewhere(err) {
		t.Fatalf("EnsureEndpoint at 192.0.2.1: %v, want an EndpointElsewhereError", err)
	}
	if uids, err := p.EndpointUIDs(); err != nil || len(uids) != 0 {
		t.Errorf("endpoints after a request for another machine's address: %v, %v; want none", uids, err)
	}
}

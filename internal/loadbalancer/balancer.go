package loadbalancer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// Defaults for the zero values of Config and HealthCheck.
const (
	DefaultPath          = "/readyz"
	DefaultInterval      = time.Second
	DefaultTimeout       = time.Second
	DefaultFailThreshold = 2
	DefaultRiseThreshold = 2
	DefaultDialTimeout   = 2 * time.Second
	// DefaultDrain matches how long client-go's HTTP/2 connections take to
	// notice a dead peer by themselves (a 30s read-idle timeout, then a 15s
	// ping), so a sick backend's clients move no later than they would
	// have on their own, and a backend shutting down gracefully (it fails
	// /readyz first, then finishes its requests) has that long.
	DefaultDrain = 30 * time.Second
)

// HealthCheck says how backends are checked: GET https://<backend><Path>,
// healthy when the answer is 200 within Timeout. Zero values take the
// defaults above.
type HealthCheck struct {
	// TLS verifies the backends' serving certificates (RootCAs, and
	// ServerName when their certificates do not name their IP) and, when
	// it holds a client certificate, authenticates the checks: an API
	// server may refuse anonymous requests. nil means the system's roots.
	TLS *tls.Config
	// Path is the URL path checked, /readyz by default.
	Path string
	// Interval is the time between the end of one check of a backend and
	// the start of the next.
	Interval time.Duration
	// Timeout bounds one check, connection and TLS handshake included.
	Timeout time.Duration
	// FailThreshold consecutive failed checks take a healthy backend out.
	FailThreshold int
	// RiseThreshold consecutive successful checks put an unhealthy backend
	// back. A backend that was never healthy (a new one) needs only one:
	// there is no flapping to guard against yet, and a new cluster's
	// endpoint should work as soon as its first API server does.
	RiseThreshold int
}

func (hc HealthCheck) withDefaults() HealthCheck {
	if hc.Path == "" {
		hc.Path = DefaultPath
	}
	if hc.Interval <= 0 {
		hc.Interval = DefaultInterval
	}
	if hc.Timeout <= 0 {
		hc.Timeout = DefaultTimeout
	}
	if hc.FailThreshold <= 0 {
		hc.FailThreshold = DefaultFailThreshold
	}
	if hc.RiseThreshold <= 0 {
		hc.RiseThreshold = DefaultRiseThreshold
	}
	return hc
}

// Config configures a Balancer. Zero values take the defaults above.
type Config struct {
	// Backends are the API servers' addresses, host:port.
	Backends []string
	// HealthCheck says how the backends are checked.
	HealthCheck HealthCheck
	// DialTimeout bounds connecting to a backend; a backend that does not
	// answer in time is skipped for the next one.
	DialTimeout time.Duration
	// Drain is how long the connections to a backend that turned
	// unhealthy, or was removed, are kept before the balancer closes them.
	Drain time.Duration
	// SlowDrain replaces Drain, when longer, for a backend taken out
	// because its checks got no answer: they timed out (it is slow, as
	// every API server of a busy host is at once, or frozen) or were
	// refused (it is going away, and closes its own connections once its
	// requests are done). It is not known to be sick, and the requests it
	// is still answering should finish. A frozen one's clients move after
	// SlowDrain, as client-go's would on their own. DefaultDrain when zero.
	SlowDrain time.Duration
	// Log receives the balancer's logs: backends going in and out, at
	// level 0; refused connections and failed checks, at level 1.
	Log klog.Logger
}

// BackendStatus is what the balancer knows of one backend.
type BackendStatus struct {
	Address string
	Healthy bool
	// Connections is the number of client connections proxied to it now.
	Connections int
	// LastError is why the last check failed, if it did.
	LastError string
}

// Balancer passes TCP connections to healthy backends. Build it with New,
// run it with Serve; SetBackends and SetHealthCheck may be called at any
// time, from any goroutine.
//
// A new connection goes to the healthy backend with the fewest
// connections, ties broken round-robin. Least-connections rather than
// plain round-robin because API server connections live long (watches,
// and client-go multiplexes everything over one HTTP/2 connection): after
// a backend comes back, round-robin would leave it idle while the others
// keep every reconnection they took; counting connections sends the next
// ones to it.
//
// If connecting to the chosen backend fails, the next healthy one is
// tried: nothing has been sent yet, so the client never sees it. Only the
// health checks take a backend out, though: a refused connection may be a
// moment's overload, and the checks decide within FailThreshold*Interval.
//
// Connections to a backend that turns unhealthy or is removed are kept
// for Config.Drain, then closed (and kept for good if it recovers or
// comes back first): an API server shutting down fails /readyz before it
// stops serving, so its requests can finish, and it closes its own
// connections when it goes; a dead one's connections are dead already.
// Closing after Drain covers the one that is alive but sick (it lost
// etcd, say), whose clients would otherwise stay on it for as long as
// their connection lives; they reconnect, and land on a healthy one.
// A backend whose checks got no answer (timed out, or refused) keeps them
// for Config.SlowDrain: it may be merely slow, or finishing its requests
// on its way out.
type Balancer struct {
	log         klog.Logger
	dialTimeout time.Duration
	drain       time.Duration
	slowDrain   time.Duration
	served      atomic.Bool

	mu       sync.Mutex
	hc       HealthCheck
	client   *http.Client
	backends []*backend // in the caller's order, which round-robin follows
	next     int        // round-robin cursor into backends
	conns    map[*pair]struct{}
	ctx      context.Context // Serve's, once it runs
	closed   bool            // Serve has ended
	wg       sync.WaitGroup  // every goroutine Serve started
}

type backend struct {
	addr        string
	healthy     bool
	everHealthy bool
	removed     bool
	// draining: it takes no new connection, and its connections are left
	// for it to close (an API server restarted for an upgrade shuts down
	// gracefully: it tells its HTTP/2 clients to go, and finishes what they
	// asked), whatever its health.
	draining bool
	fails    int // consecutive, while healthy
	rises    int // consecutive, while unhealthy
	lastErr  string
	// quiet: the checks that took it out got no answer (see unanswered).
	quiet      bool
	active     int // connections proxied to it, and dials in progress
	stop       context.CancelFunc
	drainTimer *time.Timer
}

// eligible reports whether the backend may take new connections and keep
// its old ones.
func (be *backend) eligible() bool { return be.healthy && !be.removed && !be.draining }

// lastResort reports whether be may take new connections when no backend
// is eligible: it is out only because its checks got no answer. When every
// API server of a busy host answers its checks late at once, they are
// still serving; refusing every new connection then would fail clients
// that the slow servers would have answered.
func (be *backend) lastResort() bool {
	return !be.healthy && be.quiet && !be.removed && !be.draining
}

// New checks cfg and returns a Balancer that does nothing until Serve.
func New(cfg Config) (*Balancer, error) {
	addrs, err := checkAddresses(cfg.Backends)
	if err != nil {
		return nil, err
	}
	b := &Balancer{
		log:         cfg.Log,
		dialTimeout: cfg.DialTimeout,
		drain:       cfg.Drain,
		slowDrain:   cfg.SlowDrain,
		conns:       map[*pair]struct{}{},
	}
	if b.dialTimeout <= 0 {
		b.dialTimeout = DefaultDialTimeout
	}
	if b.drain <= 0 {
		b.drain = DefaultDrain
	}
	if b.slowDrain <= 0 {
		b.slowDrain = DefaultDrain
	}
	b.setHealthCheckLocked(cfg.HealthCheck)
	for _, a := range addrs {
		b.backends = append(b.backends, &backend{addr: a})
	}
	return b, nil
}

func checkAddresses(addrs []string) ([]string, error) {
	var out []string
	for _, a := range addrs {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return nil, fmt.Errorf("backend %q is not host:port", a)
		}
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out, nil
}

// Serve accepts connections on l and passes them to healthy backends until
// ctx ends; then it closes l and every proxied connection, waits for all
// its goroutines and returns nil. It returns an error if l fails for
// another reason, and may be called only once.
func (b *Balancer) Serve(ctx context.Context, l net.Listener) error {
	if !b.served.CompareAndSwap(false, true) {
		return errors.New("the load balancer is already serving")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	b.mu.Lock()
	b.ctx = ctx
	for _, be := range b.backends {
		b.startCheckerLocked(be)
	}
	b.mu.Unlock()
	b.log.Info("Load balancer serving", "address", l.Addr().String(), "backends", b.addresses())

	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		<-ctx.Done()
		l.Close()
	}()
	err := b.accept(ctx, l)
	cancel()

	b.mu.Lock()
	b.closed = true
	conns := make([]*pair, 0, len(b.conns))
	for p := range b.conns {
		conns = append(conns, p)
	}
	for _, be := range b.backends {
		be.stopDrain()
	}
	b.mu.Unlock()
	for _, p := range conns {
		p.close()
	}
	b.wg.Wait()
	b.mu.Lock()
	b.client.CloseIdleConnections()
	b.mu.Unlock()
	b.log.Info("Load balancer stopped", "address", l.Addr().String())
	return err
}

func (b *Balancer) accept(ctx context.Context, l net.Listener) error {
	backoff := 5 * time.Millisecond
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accepting connections: %w", err)
			}
			// Out of file descriptors, say: wait, as net/http does,
			// rather than spin or give up.
			b.log.Error(err, "Accepting a connection failed", "retryIn", backoff)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		b.wg.Add(1)
		go b.handle(ctx, c)
	}
}

// SetBackends replaces the backends. Those that stay keep their health and
// their connections; new ones start unhealthy and are checked at once;
// removed ones take no new connections, and theirs are closed after
// Config.Drain. It fails, changing nothing, when an address is not
// host:port.
func (b *Balancer) SetBackends(addrs []string) error {
	addrs, err := checkAddresses(addrs)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	old := map[string]*backend{}
	for _, be := range b.backends {
		old[be.addr] = be
	}
	next := make([]*backend, 0, len(addrs))
	for _, a := range addrs {
		if be, ok := old[a]; ok {
			next = append(next, be)
			delete(old, a)
			continue
		}
		be := &backend{addr: a}
		next = append(next, be)
		b.log.Info("Backend added", "backend", a)
		if b.ctx != nil && !b.closed {
			b.startCheckerLocked(be)
		}
	}
	for _, be := range old {
		be.removed = true
		if be.stop != nil {
			be.stop()
		}
		b.log.Info("Backend removed", "backend", be.addr, "connections", be.active, "closingThemIn", b.drain)
		b.drainLocked(be)
	}
	b.backends = next
	b.next = 0
	return nil
}

// SetHealthCheck changes how backends are checked, from each backend's
// next check on (the TLS material, for one, when certificates rotate).
func (b *Balancer) SetHealthCheck(hc HealthCheck) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setHealthCheckLocked(hc)
}

func (b *Balancer) setHealthCheckLocked(hc HealthCheck) {
	hc = hc.withDefaults()
	var tlsConfig *tls.Config
	if hc.TLS != nil {
		tlsConfig = hc.TLS.Clone()
	}
	if b.client != nil {
		b.client.CloseIdleConnections()
	}
	b.hc = hc
	b.client = &http.Client{
		Transport: &http.Transport{
			// Never a proxy from the environment: the backends are ours.
			Proxy:           nil,
			TLSClientConfig: tlsConfig,
			// A new connection per check, as a client's would be: a
			// backend that stops accepting connections fails its checks
			// even if an old kept-alive one still answers.
			DisableKeepAlives: true,
		},
		// A redirect is not a healthy answer.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Status returns what the balancer knows of each backend, in the order
// SetBackends (or New) gave them.
func (b *Balancer) Status() []BackendStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]BackendStatus, 0, len(b.backends))
	for _, be := range b.backends {
		out = append(out, BackendStatus{Address: be.addr, Healthy: be.healthy, Connections: be.active, LastError: be.lastErr})
	}
	return out
}

func (b *Balancer) addresses() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]string, 0, len(b.backends))
	for _, be := range b.backends {
		out = append(out, be.addr)
	}
	return out
}

// pick reserves a connection slot on the healthy backend with the fewest
// connections, skipping those already tried; with none, on a last-resort
// one (see lastResort); or returns nil when there is none of either.
func (b *Balancer) pick(tried []*backend) *backend {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.backends)
	var best *backend
	bestAt := 0
	for _, usable := range []func(*backend) bool{(*backend).eligible, (*backend).lastResort} {
		for i := range n {
			at := (b.next + i) % n
			be := b.backends[at]
			if !usable(be) || slices.Contains(tried, be) {
				continue
			}
			if best == nil || be.active < best.active {
				best, bestAt = be, at
			}
		}
		if best != nil {
			break
		}
	}
	if best == nil {
		return nil
	}
	best.active++
	b.next = (bestAt + 1) % n
	return best
}

// release gives back a slot that pick reserved.
func (b *Balancer) release(be *backend) {
	b.mu.Lock()
	be.active--
	b.mu.Unlock()
}

// errClosed and errOutOfService say why register refused a connection.
var (
	errClosed       = errors.New("the load balancer has stopped")
	errOutOfService = errors.New("the backend went out of service while connecting to it")
)

// register records a proxied connection. It fails when Serve has ended, or
// when the backend went out of service while we were connecting to it
// (its drain may have run already, and would miss this connection).
func (b *Balancer) register(p *pair) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed
	}
	if !p.backend.eligible() && !p.backend.lastResort() {
		return errOutOfService
	}
	b.conns[p] = struct{}{}
	return nil
}

func (b *Balancer) unregister(p *pair) {
	b.mu.Lock()
	delete(b.conns, p)
	p.backend.active--
	b.mu.Unlock()
}

// SetDraining marks the backends at addrs as draining (see backend) and
// the others as not: a backend leaving draining that is healthy takes new
// connections again at once.
func (b *Balancer) SetDraining(addrs []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, be := range b.backends {
		draining := slices.Contains(addrs, be.addr)
		if draining == be.draining {
			continue
		}
		be.draining = draining
		if draining {
			be.stopDrain()
			b.log.Info("Backend draining: no new connections, its own are left for it to close", "backend", be.addr, "connections", be.active)
		} else {
			b.log.Info("Backend back from draining", "backend", be.addr, "healthy", be.healthy)
			if !be.healthy {
				b.drainLocked(be)
			}
		}
	}
}

// drainPeriod is how long be's connections are kept once it is out of
// service.
func (b *Balancer) drainPeriod(be *backend) time.Duration {
	if be.quiet && !be.removed {
		return max(b.drain, b.slowDrain)
	}
	return b.drain
}

// drainLocked closes be's connections after its drain period, unless it is
// back in service by then. A draining backend closes its own.
func (b *Balancer) drainLocked(be *backend) {
	be.stopDrain()
	if be.draining {
		return
	}
	be.drainTimer = time.AfterFunc(b.drainPeriod(be), func() {
		b.mu.Lock()
		if b.closed || be.eligible() {
			b.mu.Unlock()
			return
		}
		var doomed []*pair
		for p := range b.conns {
			if p.backend == be {
				doomed = append(doomed, p)
			}
		}
		b.mu.Unlock()
		if len(doomed) > 0 {
			b.log.Info("Closing the connections of a backend out of service", "backend", be.addr, "connections", len(doomed))
		}
		for _, p := range doomed {
			p.close()
		}
	})
}

func (be *backend) stopDrain() {
	if be.drainTimer != nil {
		be.drainTimer.Stop()
		be.drainTimer = nil
	}
}

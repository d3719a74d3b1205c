package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/loadbalancer"
	"marina.dev/marina/provider"
)

// endpointsDir holds one directory per cluster endpoint, named by the
// Cluster's UID. Its dot keeps it out of the sandboxes (UIDs).
const endpointsDir = ".endpoints"

// EndpointPort is the port of every local cluster's endpoint, on an
// address of its own.
const EndpointPort = 6443

// endpointDrain is how long the connections to an API server that left
// the endpoint (its machine is being deleted, or it fails /readyz) are kept
// before they are closed, so that their clients reconnect to one that
// serves. The balancer's default of 30s suits any backend; a control-plane
// machine being removed loses its etcd member moments later (the control
// plane waits controlplane.EndpointDrainWait for this), and its clients
// would see errors for the rest of those 30s.
const endpointDrain = 2 * time.Second

// endpointStartTimeout bounds a balancer's start; it listens within
// milliseconds.
const endpointStartTimeout = 15 * time.Second

var (
	_ provider.EndpointProvider = (*Provider)(nil)
	_ provider.EndpointLister   = (*Provider)(nil)
)

// EnsureEndpoint implements provider.EndpointProvider: one balancer
// process per cluster (marina load-balancer), on a loopback address of its
// own taken from the machines' allocator. Its directory holds what it
// reads; a change of backends is a file write it applies in place, and a
// balancer that died is started again. The address is read back from the
// directory, so it survives a restart of marina.
//
// An endpoint the user set (req.Host) that is an address of this machine,
// such as its end of a bridge to servers, is where the balancer listens:
// machines elsewhere reach the API servers, which stay on their loopback
// addresses behind it. Any other host is the user's (*EndpointElsewhereError).
func (p *Provider) EnsureEndpoint(ctx context.Context, req *provider.EndpointRequest) (string, int32, error) {
	if err := checkUID(req.UID); err != nil {
		return "", 0, err
	}
	listen := ""
	if req.Host != "" {
		local, err := isLocalAddress(req.Host)
		if err != nil {
			return "", 0, err
		}
		if !local {
			return "", 0, &provider.EndpointElsewhereError{Host: req.Host}
		}
		if err := p.endpointAllowed(req.Host, req.Port); err != nil {
			return "", 0, err
		}
		listen = net.JoinHostPort(req.Host, strconv.Itoa(int(req.Port)))
	}
	if len(p.opts.LoadBalancerCommand) == 0 {
		return "", 0, errors.New("local provider: Options.LoadBalancerCommand is not set: it cannot make control-plane endpoints")
	}
	defer p.lock(req.UID)()
	dir := p.endpointDir(req.UID)
	cfg, err := readEndpointConfig(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if cfg, err = p.allocateEndpoint(req.UID, listen); err != nil {
			return "", 0, fmt.Errorf("making the endpoint of cluster %s/%s: %w", req.Namespace, req.Name, err)
		}
	case err != nil:
		return "", 0, err
	}
	if err := p.claim(dir); err != nil {
		return "", 0, err
	}
	want := endpointConfig(cfg.Listen, req.Backends, req.Draining)
	tlsFiles := loadbalancer.TLSFiles{CA: req.CAData, ClientCert: req.ClientCert, ClientKey: req.ClientKey}
	// Only what differs is written: every write makes the balancer reload,
	// and EnsureEndpoint runs on every reconcile of the cluster.
	if !reflect.DeepEqual(cfg, want) || !sameTLS(dir, tlsFiles) {
		if err := loadbalancer.WriteDir(dir, want, tlsFiles); err != nil {
			return "", 0, fmt.Errorf("writing the endpoint of cluster %s/%s: %w", req.Namespace, req.Name, err)
		}
	}
	running, err := loadbalancer.Running(dir)
	if err != nil {
		return "", 0, err
	}
	if !running {
		if _, err := loadbalancer.Start(ctx, dir, p.opts.LoadBalancerCommand, endpointStartTimeout); err != nil && !loadbalancer.IsRunning(err) {
			// One started by another Provider at the same moment took the
			// lock, and ours exited: the endpoint runs all the same.
			if running, rerr := loadbalancer.Running(dir); rerr != nil || !running {
				return "", 0, fmt.Errorf("starting the endpoint of cluster %s/%s: %w", req.Namespace, req.Name, err)
			}
		}
	}
	host, port, err := net.SplitHostPort(want.Listen)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return "", 0, err
	}
	return host, int32(n), nil
}

// DeleteEndpoint implements provider.EndpointProvider: it stops the
// balancer and removes its directory (renamed first, so that a crash
// leaves either all of it or a tombstone the next call removes).
func (p *Provider) DeleteEndpoint(ctx context.Context, uid types.UID) error {
	if err := checkUID(uid); err != nil {
		return err
	}
	defer p.lock(uid)()
	dir := p.endpointDir(uid)
	if _, err := os.Stat(dir); err == nil {
		if err := loadbalancer.Stop(ctx, dir, 10*time.Second); err != nil {
			return fmt.Errorf("stopping the endpoint of cluster %s: %w", uid, err)
		}
		tomb := filepath.Join(p.root, endpointsDir, fmt.Sprintf("%s%s-%d", tombPrefix, uid, time.Now().UnixNano()))
		if err := os.Rename(dir, tomb); err != nil {
			return fmt.Errorf("deleting the endpoint of cluster %s: %w", uid, err)
		}
		if err := files.SyncDir(filepath.Join(p.root, endpointsDir)); err != nil {
			return fmt.Errorf("deleting the endpoint of cluster %s: %w", uid, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	tombs, err := filepath.Glob(filepath.Join(p.root, endpointsDir, tombPrefix+string(uid)+"-*"))
	if err != nil {
		return err
	}
	for _, t := range tombs {
		if err := os.RemoveAll(t); err != nil {
			return fmt.Errorf("deleting the endpoint of cluster %s: %w", uid, err)
		}
	}
	return nil
}

// EndpointUIDs lists the clusters that have an endpoint under the root.
func (p *Provider) EndpointUIDs() ([]types.UID, error) {
	entries, err := os.ReadDir(filepath.Join(p.root, endpointsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var uids []types.UID
	for _, e := range entries {
		if e.IsDir() && checkUID(types.UID(e.Name())) == nil {
			uids = append(uids, types.UID(e.Name()))
		}
	}
	return uids, nil
}

func (p *Provider) endpointDir(uid types.UID) string {
	return filepath.Join(p.root, endpointsDir, string(uid))
}

// allocateEndpoint picks the endpoint's address (listen, when the user set
// it) and writes its first configuration, under the allocator's lock, so
// that no machine or other endpoint gets the address.
func (p *Provider) allocateEndpoint(uid types.UID, listen string) (loadbalancer.FileConfig, error) {
	allocMu.Lock()
	defer allocMu.Unlock()
	// p.lock serialises one Provider's calls; another Provider of this
	// process over the same root (a restarted controller) may have just
	// allocated it.
	if cfg, err := readEndpointConfig(p.endpointDir(uid)); err == nil {
		return cfg, nil
	}
	if listen == "" {
		used, err := p.usedAddresses()
		if err != nil {
			return loadbalancer.FileConfig{}, err
		}
		addr, err := pickAddress(uid, used)
		if err != nil {
			return loadbalancer.FileConfig{}, err
		}
		listen = net.JoinHostPort(addr, strconv.Itoa(EndpointPort))
	}
	cfg := endpointConfig(listen, nil, nil)
	if err := os.MkdirAll(filepath.Join(p.root, endpointsDir), 0o700); err != nil {
		return loadbalancer.FileConfig{}, err
	}
	// The config is written with an empty CA first only to claim the
	// address; EnsureEndpoint writes the real one right after.
	data, err := json.Marshal(cfg)
	if err != nil {
		return loadbalancer.FileConfig{}, err
	}
	dir := p.endpointDir(uid)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return loadbalancer.FileConfig{}, err
	}
	if err := files.WriteAtomic(filepath.Join(dir, loadbalancer.ConfigFile), data, 0o600); err != nil {
		return loadbalancer.FileConfig{}, err
	}
	return cfg, files.SyncDir(filepath.Join(p.root, endpointsDir))
}

// endpointConfig is the configuration of an endpoint listening on listen
// in front of backends (sorted and without repeats, so that neither their
// order nor a repeat is a change).
func endpointConfig(listen string, backends, draining []string) loadbalancer.FileConfig {
	cfg := loadbalancer.FileConfig{Listen: listen, Drain: metav1.Duration{Duration: endpointDrain}}
	if len(backends) > 0 {
		cfg.Backends = slices.Compact(slices.Sorted(slices.Values(backends)))
	}
	for _, d := range slices.Compact(slices.Sorted(slices.Values(draining))) {
		if slices.Contains(cfg.Backends, d) {
			cfg.Draining = append(cfg.Draining, d)
		}
	}
	return cfg
}

// endpointAddresses are the addresses the endpoints under the root listen
// on.
func (p *Provider) endpointAddresses() ([]string, error) {
	uids, err := p.EndpointUIDs()
	if err != nil {
		return nil, err
	}
	var addrs []string
	for _, uid := range uids {
		cfg, err := readEndpointConfig(p.endpointDir(uid))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if host, _, err := net.SplitHostPort(cfg.Listen); err == nil {
			addrs = append(addrs, host)
		}
	}
	return addrs, nil
}

// isLocalAddress reports whether host is an IP address of one of this
// machine's interfaces. A DNS name is not: it may resolve anywhere.
// endpointAllowed refuses a user-set endpoint at an address of this host
// outside Options.EndpointAddresses.
func (p *Provider) endpointAllowed(host string, port int32) error {
	addr, err := netip.ParseAddr(host)
	if err == nil && slices.ContainsFunc(p.opts.EndpointAddresses, func(pr netip.Prefix) bool { return pr.Contains(addr.Unmap()) }) {
		return nil
	}
	why := "no address of this host is open to clusters; an operator opens some with marina's --endpoint-addresses"
	if len(p.opts.EndpointAddresses) > 0 {
		open := make([]string, len(p.opts.EndpointAddresses))
		for i, pr := range p.opts.EndpointAddresses {
			open[i] = pr.String()
		}
		why = "clusters may listen only within " + strings.Join(open, ", ") + " (marina's --endpoint-addresses)"
	}
	return &provider.EndpointNotAllowedError{Host: host, Port: port, Why: why}
}

func isLocalAddress(host string) (bool, error) {
	ip := net.ParseIP(host)
	if ip == nil {
		return false, nil
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false, fmt.Errorf("listing this machine's addresses: %w", err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true, nil
		}
	}
	return false, nil
}

func readEndpointConfig(dir string) (loadbalancer.FileConfig, error) {
	var cfg loadbalancer.FileConfig
	data, err := os.ReadFile(filepath.Join(dir, loadbalancer.ConfigFile))
	if err != nil {
		return cfg, err
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return cfg, fmt.Errorf("decoding %s: %w", filepath.Join(dir, loadbalancer.ConfigFile), err)
	}
	return cfg, nil
}

// sameTLS reports whether dir already holds exactly t's files.
func sameTLS(dir string, t loadbalancer.TLSFiles) bool {
	for name, want := range map[string][]byte{loadbalancer.CAFile: t.CA, loadbalancer.ClientCertFile: t.ClientCert, loadbalancer.ClientKeyFile: t.ClientKey} {
		have, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) && len(want) == 0 {
			continue
		}
		if err != nil || !bytes.Equal(have, want) {
			return false
		}
	}
	return true
}

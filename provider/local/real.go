package local

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"marina.dev/marina/internal/cgroups"
	"marina.dev/marina/internal/image"
	"marina.dev/marina/internal/mounts"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/internal/nodenet"
	"marina.dev/marina/internal/registry"
)

// Defaults of RealOptions.
const (
	DefaultBridge    = "marina0"
	DefaultCNIBinDir = "/usr/lib/cni"
	// runtimeRoot holds each real machine's runtime state and sockets,
	// short paths as sockets need.
	runtimeRoot = "/run/marina"
	// cgroupParent is the cgroup every real machine's own is below.
	cgroupParent = "/marina"
)

// DefaultNetwork is the real machines' network, the bridge's address
// being its first.
var DefaultNetwork = netip.MustParsePrefix("10.231.0.0/16")

// RealOptions configure the machines whose kubelet is real (LocalMachine
// spec.kubelet: Real).
type RealOptions struct {
	// Bridge is the host's bridge the machines are attached to;
	// DefaultBridge when empty.
	Bridge string
	// Network is the machines' network; its first address is the
	// bridge's. DefaultNetwork when invalid (unset).
	Network netip.Prefix
	// ContainerdVersion is the containerd make setup built
	// (containerd-<version> in BinDir). Required for real machines.
	ContainerdVersion string
	// CNIBinDir holds the CNI reference plugins; DefaultCNIBinDir when
	// empty.
	CNIBinDir string
	// Registry is the host:port, on this host, of the OCI registry (plain
	// HTTP) every real machine pulls its images from: the one marina up
	// runs, which holds make images' pause image and test images.
	// Required for real machines.
	Registry string
}

func (o RealOptions) withDefaults() RealOptions {
	if o.Bridge == "" {
		o.Bridge = DefaultBridge
	}
	if !o.Network.IsValid() {
		o.Network = DefaultNetwork
	}
	if o.CNIBinDir == "" {
		o.CNIBinDir = DefaultCNIBinDir
	}
	return o
}

func (o RealOptions) bridge() nodenet.Bridge {
	return nodenet.Bridge{Name: o.Bridge, Gateway: netip.PrefixFrom(o.Network.Masked().Addr().Next(), o.Network.Bits())}
}

// netMu serialises the changes to the bridge of this process's providers:
// a Delete removing the last machine's bridge must not race a Create
// attaching the next.
var netMu sync.Mutex

// checkRealHost says what this host lacks to run a real machine, naming
// it, or nil.
func (p *Provider) checkRealHost(ctx context.Context) error {
	o := p.opts.Real
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (a real kubelet makes mounts, cgroups and network namespaces)")
	}
	if p.binDir == "" || o.ContainerdVersion == "" {
		missing = append(missing, "the binaries of make setup (the provider was given no bin directory or containerd version)")
	} else {
		for _, bin := range []string{"containerd-", "containerd-shim-runc-v2-", "ctr-"} {
			if _, err := os.Stat(filepath.Join(p.binDir, bin+o.ContainerdVersion)); err != nil {
				missing = append(missing, bin+o.ContainerdVersion+" in "+p.binDir+" (make setup)")
			}
		}
	}
	for _, plugin := range []string{"bridge", "host-local", "loopback", "portmap"} {
		if _, err := os.Stat(filepath.Join(o.CNIBinDir, plugin)); err != nil {
			missing = append(missing, "the CNI plugin "+filepath.Join(o.CNIBinDir, plugin)+" (Debian's containernetworking-plugins)")
		}
	}
	for _, tool := range []string{"/usr/sbin/runc", "/usr/bin/runc"} {
		if _, err := os.Stat(tool); err == nil {
			break
		} else if tool == "/usr/bin/runc" {
			missing = append(missing, "runc (Debian's runc)")
		}
	}
	if _, err := os.Stat("/dev/kmsg"); err != nil {
		missing = append(missing, "/dev/kmsg (the kubelet's OOM watcher reads it)")
	}
	if hs, err := cgroups.Hierarchies(); err != nil || len(hs) == 0 {
		missing = append(missing, "mounted cgroups under /sys/fs/cgroup")
	}
	if o.Registry == "" {
		missing = append(missing, "a registry to pull images from (marina up runs one; marina controller takes --registry)")
	} else if _, err := registry.Digest(ctx, o.Registry, image.SandboxImage); err != nil {
		missing = append(missing, "the pause image "+image.SandboxImage+" in the registry at "+o.Registry+" (make images, then restart marina up): "+err.Error())
	}
	if len(missing) > 0 {
		return &HostNotReadyError{Missing: missing}
	}
	return nil
}

// HostNotReadyError says what this host lacks to run a real kubelet.
type HostNotReadyError struct {
	Missing []string
}

func (e *HostNotReadyError) Error() string {
	return "this host cannot run a real kubelet: it lacks " + strings.Join(e.Missing, "; ")
}

// realNames are the names of what a real machine has on the host, all
// derived from its UID, so that a Delete finds them without its sandbox.
type realNames struct {
	net        nodenet.Machine
	cgroup     string
	runtimeDir string
}

func namesFor(uid types.UID, addr netip.Prefix) realNames {
	m := nodenet.ForMachine(string(uid), addr)
	return realNames{net: m, cgroup: cgroupParent + "/" + string(uid), runtimeDir: filepath.Join(runtimeRoot, strings.TrimPrefix(m.NetNS, "marina-"))}
}

// realBootstrap is what a real machine's agent needs beside the rest of
// its bootstrap.
func (p *Provider) realBootstrap(uid types.UID, addr string, maxPods int) *sandbox.RealNode {
	o := p.opts.Real
	n := namesFor(uid, netip.Prefix{})
	return &sandbox.RealNode{
		NetNS:             n.net.NetNSPath(),
		Network:           o.Network.Masked().String(),
		Cgroup:            n.cgroup,
		RuntimeDir:        n.runtimeDir,
		ContainerdVersion: o.ContainerdVersion,
		CNIBinDir:         o.CNIBinDir,
		Registry:          o.Registry,
		MaxPods:           maxPods,
		APIAddress:        nodenet.APIAddress(o.Network).String(),
	}
}

// ensureNetwork makes the real machine's network (bridge, namespace,
// veth, address), idempotently: after a reboot /run is empty, after a
// crash half of it may be there.
func (p *Provider) ensureNetwork(ctx context.Context, uid types.UID, b *sandbox.Bootstrap) error {
	addr, err := netip.ParseAddr(b.Address)
	if err != nil {
		return fmt.Errorf("the machine's address %q: %w", b.Address, err)
	}
	o := p.opts.Real
	netMu.Lock()
	defer netMu.Unlock()
	if err := nodenet.EnsureBridge(ctx, o.bridge()); err != nil {
		return err
	}
	m := namesFor(uid, netip.PrefixFrom(addr, o.Network.Bits())).net
	m.APIAddress = nodenet.APIAddress(o.Network)
	return nodenet.Ensure(ctx, o.bridge(), m)
}

// removeReal removes what a real machine of uid made on the host, once
// its agent is stopped: every process left in its cgroup (the containers
// and their shims outlive the kubelet and containerd), the mounts below
// its sandbox and runtime directory, its cgroups, its network namespace
// and veth, and the bridge when no machine is on it any more. It does
// nothing for a machine that had none of it (a simulated one), and checks
// that without running a command, as a fleet deletes a thousand of those.
func (p *Provider) removeReal(ctx context.Context, uid types.UID, dirs ...string) error {
	n := namesFor(uid, netip.Prefix{})
	var errs []error
	if err := cgroups.KillAll(n.cgroup, 30*time.Second); err != nil {
		errs = append(errs, err)
	}
	for _, d := range append(dirs, n.runtimeDir) {
		if err := mounts.UnmountAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := os.RemoveAll(n.runtimeDir); err != nil {
		errs = append(errs, err)
	}
	// The shared parents go with the last machine; while another holds
	// them, removing them fails, as it should.
	cgroups.RemoveEmpty(cgroupParent)
	_ = os.Remove(runtimeRoot)
	if _, err := os.Stat(n.net.NetNSPath()); err == nil || p.hasLink(n.net.HostVeth) {
		netMu.Lock()
		defer netMu.Unlock()
		if err := nodenet.Remove(ctx, n.net); err != nil {
			errs = append(errs, err)
		}
		if err := p.removeIdleBridge(ctx); err != nil {
			errs = append(errs, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (p *Provider) hasLink(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/class/net", name))
	return err == nil
}

// removeIdleBridge removes the bridge once nothing is attached to it;
// called under netMu.
func (p *Provider) removeIdleBridge(ctx context.Context) error {
	name := p.opts.Real.withDefaults().Bridge
	ports, err := os.ReadDir(filepath.Join("/sys/class/net", name, "brif"))
	if errors.Is(err, fs.ErrNotExist) || (err == nil && len(ports) > 0) {
		return nil
	}
	if err != nil {
		return err
	}
	return nodenet.RemoveBridge(ctx, name)
}

// realAddressSpace is the number of machine addresses in network: all
// but the network's own, the bridge's (the first), the API address (the
// last, nodenet.APIAddress) and the broadcast.
func realAddressSpace(network netip.Prefix) uint64 {
	bits := 32 - network.Bits()
	if bits < 2 || bits > 24 {
		return 0
	}
	return 1<<bits - 4
}

// pickRealAddress derives a real machine's address in network from its
// UID and probes the next ones until one is free.
func pickRealAddress(uid types.UID, network netip.Prefix, used map[string]bool) (string, error) {
	space := realAddressSpace(network)
	if space == 0 {
		return "", fmt.Errorf("the real machines' network %s must be a /8 to /30 of IPv4", network)
	}
	sum := sha256.Sum256([]byte(uid))
	start := binary.BigEndian.Uint64(sum[:8]) % space
	base := network.Masked().Addr().As4()
	b := binary.BigEndian.Uint32(base[:])
	for i := uint64(0); i < space; i++ {
		n := (start+i)%space + 2 // past the network's and the bridge's
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], b+uint32(n))
		addr := netip.AddrFrom4(a).String()
		if !used[addr] {
			return addr, nil
		}
	}
	return "", fmt.Errorf("no free address is left in the real machines' network %s", network)
}

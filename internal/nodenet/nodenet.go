package nodenet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// NetNSDir is where ip netns keeps its named namespaces.
const NetNSDir = "/run/netns"

// Bridge is the host's bridge that machines' veths are attached to.
type Bridge struct {
	// Name is the bridge's interface name, e.g. marina0.
	Name string
	// Gateway is the host's address on the bridge with the network's
	// prefix length, e.g. 10.231.0.1/16: the machines' default route.
	Gateway netip.Prefix
}

// Machine is one machine's network.
type Machine struct {
	// NetNS is the name of its network namespace (/run/netns/<NetNS>).
	NetNS string
	// HostVeth is the host end of its veth pair, on the bridge.
	HostVeth string
	// Address is its address on the bridge's network, with the network's
	// prefix length.
	Address netip.Prefix
	// APIAddress, when valid, is put on the namespace's loopback device:
	// the address the kubernetes Service's endpoints carry (see
	// APIAddress), served in every machine by its own relay.
	APIAddress netip.Addr
}

// APIAddress is the address a network's machines reach their cluster's
// API servers at from inside (the kubernetes Service's endpoints): the
// last address before the network's broadcast, which no machine is given.
// Every machine holds it itself, on its loopback device, so a pod's
// connection to the Service, translated by kube-proxy to it, ends in the
// pod's own machine, whose agent relays it to the cluster's endpoint (a
// loopback address of the management host that no namespace reaches).
func APIAddress(network netip.Prefix) netip.Addr {
	a := network.Masked().Addr().As4()
	n := binary.BigEndian.Uint32(a[:]) | (1<<(32-network.Bits()) - 1) // the broadcast
	binary.BigEndian.PutUint32(a[:], n-1)
	return netip.AddrFrom4(a)
}

// ForMachine names the network namespace and veth of the machine with the
// given key (its UID): both are derived from it, so that a provider that
// lost everything but the key finds them again. Interface names are at
// most 15 bytes, hence a hash.
func ForMachine(key string, addr netip.Prefix) Machine {
	sum := sha256.Sum256([]byte(key))
	h := hex.EncodeToString(sum[:])[:10]
	return Machine{NetNS: "marina-" + h, HostVeth: "mv" + h, Address: addr}
}

// NetNSPath is the file that holds m's network namespace.
func (m Machine) NetNSPath() string { return filepath.Join(NetNSDir, m.NetNS) }

// EnsureBridge makes the bridge, with its address, and brings it up.
func EnsureBridge(ctx context.Context, b Bridge) error {
	if !linkExists(ctx, "", b.Name) {
		if err := ip(ctx, "", "link", "add", b.Name, "type", "bridge"); err != nil && !linkExists(ctx, "", b.Name) {
			return fmt.Errorf("making bridge %s: %w", b.Name, err)
		}
	}
	if !hasAddress(ctx, "", b.Name, b.Gateway) {
		if err := ip(ctx, "", "addr", "add", b.Gateway.String(), "dev", b.Name); err != nil && !hasAddress(ctx, "", b.Name, b.Gateway) {
			return fmt.Errorf("giving bridge %s the address %s: %w", b.Name, b.Gateway, err)
		}
	}
	if err := ip(ctx, "", "link", "set", b.Name, "up"); err != nil {
		return fmt.Errorf("bringing bridge %s up: %w", b.Name, err)
	}
	return nil
}

// Ensure makes m's namespace, veth pair and address, attached to b, and
// its default route through b's gateway. The machine's end of the veth is
// eth0. Forwarding is switched on in the namespace only: a machine routes
// its pods' traffic; the host's own settings are not touched.
func Ensure(ctx context.Context, b Bridge, m Machine) error {
	if _, err := os.Stat(m.NetNSPath()); errors.Is(err, os.ErrNotExist) {
		if err := ip(ctx, "", "netns", "add", m.NetNS); err != nil {
			return fmt.Errorf("making network namespace %s: %w", m.NetNS, err)
		}
	} else if err != nil {
		return err
	}
	if !linkExists(ctx, "", m.HostVeth) {
		// The namespace may hold an eth0 whose host end is gone (deleted
		// by hand): remove it, or the new pair cannot be named eth0.
		if linkExists(ctx, m.NetNS, "eth0") {
			if err := ip(ctx, m.NetNS, "link", "del", "eth0"); err != nil {
				return fmt.Errorf("removing the stale eth0 of %s: %w", m.NetNS, err)
			}
		}
		if err := ip(ctx, "", "link", "add", m.HostVeth, "type", "veth", "peer", "name", "eth0", "netns", m.NetNS); err != nil {
			return fmt.Errorf("making the veth pair of %s: %w", m.NetNS, err)
		}
	}
	steps := [][]string{
		{"", "link", "set", m.HostVeth, "master", b.Name},
		{"", "link", "set", m.HostVeth, "up"},
		{m.NetNS, "link", "set", "lo", "up"},
		{m.NetNS, "link", "set", "eth0", "up"},
	}
	for _, s := range steps {
		if err := ip(ctx, s[0], s[1:]...); err != nil {
			return fmt.Errorf("setting up the network of %s: %w", m.NetNS, err)
		}
	}
	if !hasAddress(ctx, m.NetNS, "eth0", m.Address) {
		if err := ip(ctx, m.NetNS, "addr", "add", m.Address.String(), "dev", "eth0"); err != nil && !hasAddress(ctx, m.NetNS, "eth0", m.Address) {
			return fmt.Errorf("giving %s the address %s: %w", m.NetNS, m.Address, err)
		}
	}
	if a := m.APIAddress; a.IsValid() {
		p := netip.PrefixFrom(a, a.BitLen())
		if !hasAddress(ctx, m.NetNS, "lo", p) {
			if err := ip(ctx, m.NetNS, "addr", "add", p.String(), "dev", "lo"); err != nil && !hasAddress(ctx, m.NetNS, "lo", p) {
				return fmt.Errorf("giving %s the API address %s: %w", m.NetNS, a, err)
			}
		}
	}
	if err := ip(ctx, m.NetNS, "route", "replace", "default", "via", b.Gateway.Addr().String(), "dev", "eth0"); err != nil {
		return fmt.Errorf("routing %s through %s: %w", m.NetNS, b.Gateway.Addr(), err)
	}
	return Sysctl(ctx, m.NetNS, "net.ipv4.ip_forward", "1")
}

// Sysctl sets a sysctl inside the network namespace ns (those under
// net/ are per namespace).
func Sysctl(ctx context.Context, ns, key, value string) error {
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "sh", "-c", `printf '%s' "$1" > "$2"`, "sh", value, path)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("setting %s=%s in %s: %w: %s", key, value, ns, err, bytes.TrimSpace(out))
	}
	return nil
}

// Remove deletes m's namespace and veth pair; what is already gone is
// skipped. Everything made inside the namespace (the pods' bridge, their
// veths, iptables rules) goes with it.
func Remove(ctx context.Context, m Machine) error {
	var errs []error
	if linkExists(ctx, "", m.HostVeth) {
		if err := ip(ctx, "", "link", "del", m.HostVeth); err != nil && linkExists(ctx, "", m.HostVeth) {
			errs = append(errs, fmt.Errorf("removing veth %s: %w", m.HostVeth, err))
		}
	}
	if _, err := os.Stat(m.NetNSPath()); err == nil {
		if err := ip(ctx, "", "netns", "del", m.NetNS); err != nil {
			errs = append(errs, fmt.Errorf("removing network namespace %s: %w", m.NetNS, err))
		}
	}
	return errors.Join(errs...)
}

// RemoveBridge deletes the bridge, if it exists.
func RemoveBridge(ctx context.Context, name string) error {
	if !linkExists(ctx, "", name) {
		return nil
	}
	if err := ip(ctx, "", "link", "del", name); err != nil && linkExists(ctx, "", name) {
		return fmt.Errorf("removing bridge %s: %w", name, err)
	}
	return nil
}

func linkExists(ctx context.Context, ns, name string) bool {
	return ip(ctx, ns, "link", "show", "dev", name) == nil
}

func hasAddress(ctx context.Context, ns, dev string, addr netip.Prefix) bool {
	out, err := ipOutput(ctx, ns, "-o", "addr", "show", "dev", dev)
	return err == nil && bytes.Contains(out, []byte(" "+addr.String()+" "))
}

// ip runs `ip [-n ns] args...`.
func ip(ctx context.Context, ns string, args ...string) error {
	_, err := ipOutput(ctx, ns, args...)
	return err
}

func ipOutput(ctx context.Context, ns string, args ...string) ([]byte, error) {
	if ns != "" {
		args = append([]string{"-n", ns}, args...)
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

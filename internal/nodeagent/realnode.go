package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/cgroups"
	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/manifest"
	"marina.dev/marina/internal/nodeagent/components"
	"marina.dev/marina/internal/nodeagent/sandbox"
)

// The real node's files, under its sandbox.
const (
	// KubeletDir holds the kubelet's credentials and configuration (its
	// --cert-dir, the CA, resolv.conf); its --root-dir is kubeletRoot.
	KubeletDir = "kubelet"
	// ContainerdDir is containerd's root (images, snapshots).
	ContainerdDir = "containerd"
	// CNIConfDir holds the pod network's configuration, written once the
	// Node has its pod CIDR.
	CNIConfDir = "cni/net.d"
	// RegistryConfDir is containerd's registry host configuration
	// (config_path): every registry's images come from marina's.
	RegistryConfDir = "containerd-hosts"
	// binLinksDir holds the names containerd looks for in PATH
	// (containerd-shim-runc-v2), linked to the versioned binaries.
	binLinksDir = "bin"

	kubeletKubeconfig = "kubelet.kubeconfig"
	kubeletConfigJSON = "kubelet-config.json"
	kubeProxyConfig   = "kube-proxy-config.json"
	containerdConfig  = "containerd.toml"
	cniConfFile       = "10-marina.conflist"
)

// APIRelayAddress is where, inside a real node's network namespace, the
// agent relays to the cluster's endpoint: the endpoint is a loopback
// address of the management host, which the namespace cannot reach.
const APIRelayAddress = "127.0.0.1:6443"

// RegistryRelayAddress is where, inside a real node's network namespace,
// the agent relays to the registry marina up runs on the management
// host's loopback: containerd's only registry.
const RegistryRelayAddress = "127.0.0.1:5000"

// SandboxImage is the pod sandbox ("pause") image containerd runs as
// every pod's first container; marina builds it (make images) and its
// registry serves it, as no other registry is reachable from here.
const SandboxImage = "registry.k8s.io/pause:3.10.2"

// realNode is a worker's real kubelet and containerd under the machine's
// supervisor, in the machine's network namespace and cgroup.
type realNode struct {
	dir  string
	boot *sandbox.Bootstrap
	sup  *components.Supervisor
	// done is closed once the supervisor has stopped the kubelet and
	// containerd (the containers' shims live on, as on a real node).
	done chan struct{}
	log  klog.Logger

	mu      sync.Mutex
	kubelet string // the version the kubelet manifest runs
}

// startRealNode puts the agent in the machine's cgroup, starts the relay
// to the API server, writes the runtime's and the kubelet's configuration
// and manifests, and starts the supervisor. The node's credential must be
// in the sandbox (tlsBootstrap).
func startRealNode(ctx context.Context, dir string, b *sandbox.Bootstrap, kubeletVersion string) (*realNode, error) {
	r := b.Real
	log := klog.FromContext(ctx)
	if b.BinDir == "" {
		return nil, errors.New("the sandbox names no directory of binaries (binDir)")
	}
	// First: every process started from here on (containerd, its shims,
	// the kubelet) is then in the machine's cgroup, where deleting the
	// machine finds them all.
	if err := cgroups.Join(r.Cgroup, os.Getpid()); err != nil {
		return nil, fmt.Errorf("joining the machine's cgroup: %w", err)
	}
	if err := ensureHostLimits(log); err != nil {
		return nil, err
	}
	for _, d := range []string{KubeletDir, ContainerdDir, CNIConfDir, binLinksDir, manifest.LogsDir, filepath.Join(RegistryConfDir, "_default")} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(r.RuntimeDir, 0o700); err != nil {
		return nil, err
	}
	if err := linkBinaries(dir, b); err != nil {
		return nil, err
	}
	server, err := url.Parse(b.Server)
	if err != nil || server.Host == "" {
		return nil, fmt.Errorf("the bootstrap's server %q is not a URL", b.Server)
	}
	ln, err := listenIn(r.NetNS, APIRelayAddress)
	if err != nil {
		return nil, fmt.Errorf("opening the API relay in the machine's network namespace: %w", err)
	}
	go relay(ctx, ln, server.Host)
	if r.APIAddress != "" {
		// The pods' way in: kube-proxy translates the kubernetes Service
		// to the API servers' advertised address and port (the local
		// provider's control planes listen on bootstrap's default port).
		addr := net.JoinHostPort(r.APIAddress, strconv.Itoa(bootstrap.DefaultAPIServerPort))
		ln, err := listenIn(r.NetNS, addr)
		if err != nil {
			return nil, fmt.Errorf("opening the pods' API relay at %s in the machine's network namespace: %w", addr, err)
		}
		go relay(ctx, ln, server.Host)
	}
	if r.Registry != "" {
		ln, err := listenIn(r.NetNS, RegistryRelayAddress)
		if err != nil {
			return nil, fmt.Errorf("opening the registry's relay at %s in the machine's network namespace: %w", RegistryRelayAddress, err)
		}
		go relay(ctx, ln, r.Registry)
	}

	n := &realNode{dir: dir, boot: b, sup: components.New(dir, components.Options{StopGrace: 5 * time.Second}), done: make(chan struct{}), log: log}
	if err := n.writeConfig(server.Hostname()); err != nil {
		return nil, err
	}
	if err := manifest.Write(dir, "containerd", n.containerdManifest()); err != nil {
		return nil, err
	}
	if err := n.setKubelet(kubeletVersion); err != nil {
		return nil, err
	}
	go func() {
		defer close(n.done)
		if err := n.sup.Run(ctx); err != nil {
			log.Error(err, "Component supervisor failed")
		}
	}()
	log.Info("Started the real node's runtime and kubelet", "kubelet", kubeletVersion, "containerd", r.ContainerdVersion, "netns", r.NetNS, "registry", r.Registry)
	return n, nil
}

// setKubelet makes the kubelet's manifest run version v (an InPlace
// upgrade moves it; the supervisor restarts the kubelet alone).
func (n *realNode) setKubelet(v string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, b := range []string{n.binary("kubelet", v), n.binary("kube-proxy", v)} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%s was not built here: run make setup with version %s", b, v)
		}
	}
	return n.writeKubelet(v)
}

func (n *realNode) binary(component, version string) string {
	return filepath.Join(n.boot.BinDir, component+"-"+version)
}

// writeKubelet writes the manifests of the kubelet and kube-proxy of
// version v; called under n.mu.
func (n *realNode) writeKubelet(v string) error {
	if v == n.kubelet {
		return nil
	}
	bin, proxy := n.binary("kubelet", v), n.binary("kube-proxy", v)
	// kube-proxy moves with the kubelet, after it, as kubeadm upgrades
	// its DaemonSet after the control plane: both are the node's.
	if err := manifest.Write(n.dir, "kubelet", n.kubeletManifest(v, bin)); err != nil {
		return err
	}
	if err := manifest.Write(n.dir, "kube-proxy", &manifest.Manifest{Version: v, Binary: proxy,
		Args: []string{"--config=" + n.path(kubeProxyConfig)}, Env: n.env(), NetNS: n.boot.Real.NetNS}); err != nil {
		return err
	}
	if n.kubelet != "" {
		n.log.Info("Kubelet moves to another version", "from", n.kubelet, "to", v)
	}
	n.kubelet = v
	return nil
}

// linkBinaries gives containerd the names it runs its shim and runc by.
func linkBinaries(dir string, b *sandbox.Bootstrap) error {
	links := map[string]string{
		"containerd-shim-runc-v2": filepath.Join(b.BinDir, "containerd-shim-runc-v2-"+b.Real.ContainerdVersion),
	}
	for name, target := range links {
		path := filepath.Join(dir, binLinksDir, name)
		if cur, err := os.Readlink(path); err == nil && cur == target {
			continue
		}
		tmp := path + ".tmp"
		_ = os.Remove(tmp)
		if err := os.Symlink(target, tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, path); err != nil {
			return err
		}
	}
	return nil
}

func (n *realNode) path(parts ...string) string {
	return filepath.Join(append([]string{n.dir}, parts...)...)
}

// kubeletRoot is the kubelet's --root-dir. It is in the machine's short
// runtime directory, not in its sandbox: the kubelet listens on unix
// sockets below it (pod-resources, device-plugins, plugins_registry), and a
// socket's path must fit in 108 bytes, which a sandbox under a long state
// directory (a test's temporary one) does not. Its pods' volumes then live
// in /run as the runtime's state does; a host's reboot empties both, and
// the kubelet makes them again for the pods it runs.
func (n *realNode) kubeletRoot() string { return filepath.Join(n.boot.Real.RuntimeDir, "kubelet") }

// socket is containerd's CRI socket.
func (n *realNode) socket() string { return filepath.Join(n.boot.Real.RuntimeDir, "containerd.sock") }

func (n *realNode) env() map[string]string {
	return map[string]string{"PATH": n.path(binLinksDir) + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
}

func (n *realNode) containerdManifest() *manifest.Manifest {
	return &manifest.Manifest{
		Version: n.boot.Real.ContainerdVersion,
		Binary:  filepath.Join(n.boot.BinDir, "containerd-"+n.boot.Real.ContainerdVersion),
		Args:    []string{"--config", n.path(containerdConfig)},
		Env:     n.env(),
		NetNS:   n.boot.Real.NetNS,
	}
}

func (n *realNode) kubeletManifest(version, bin string) *manifest.Manifest {
	args := []string{
		"--config=" + n.path(kubeletConfigJSON),
		"--kubeconfig=" + n.path(kubeletKubeconfig),
		"--root-dir=" + n.kubeletRoot(),
		"--cert-dir=" + n.path(KubeletDir, "pki"),
		"--hostname-override=" + n.boot.NodeName,
		"--node-ip=" + n.boot.Address,
	}
	if l := kubeletLabels(n.boot.Labels); l != "" {
		args = append(args, "--node-labels="+l)
	}
	return &manifest.Manifest{Version: version, Binary: bin, Args: args, Env: n.env(), NetNS: n.boot.Real.NetNS}
}

// kubeletLabels are the machine's labels a node may set on itself, as
// --node-labels wants them (the kubelet refuses to start with others; the
// machine controller adds those).
func kubeletLabels(labels map[string]string) string {
	var kv []string
	for k, v := range labels {
		if nodeSettableLabel(k) {
			kv = append(kv, k+"="+v)
		}
	}
	sort.Strings(kv)
	return strings.Join(kv, ",")
}

// writeConfig writes the kubelet's kubeconfig and configuration and
// containerd's configuration. serverName is the name the API server's
// certificate is checked against: the endpoint's, reached through the
// relay.
func (n *realNode) writeConfig(serverName string) error {
	b := n.boot
	caPath := n.path(KubeletDir, "ca.crt")
	if err := files.WriteAtomic(caPath, []byte(b.CAPEM), 0o600); err != nil {
		return err
	}
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: cluster
  cluster:
    server: https://%s
    certificate-authority: %s
    tls-server-name: %s
users:
- name: node
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: node
  context: {cluster: cluster, user: node}
current-context: node
`, APIRelayAddress, caPath, serverName, n.path(sandbox.NodeCertFile), n.path(sandbox.NodeKeyFile))
	if err := files.WriteAtomic(n.path(kubeletKubeconfig), []byte(kubeconfig), 0o600); err != nil {
		return err
	}
	taints := make([]map[string]string, 0, len(b.Taints))
	for _, t := range b.Taints {
		taints = append(taints, map[string]string{"key": t.Key, "value": t.Value, "effect": string(t.Effect)})
	}
	resolv := n.path(KubeletDir, "resolv.conf")
	if err := files.WriteAtomic(resolv, []byte("# no upstream DNS is reachable from marina's machines\n"), 0o644); err != nil {
		return err
	}
	domain := b.ClusterDomain
	if domain == "" {
		domain = "cluster.local"
	}
	cfg := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		// In the machine's own namespace: its address is the Node's.
		"address":            b.Address,
		"port":               10250,
		"readOnlyPort":       0,
		"healthzBindAddress": "127.0.0.1",
		"healthzPort":        10248,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": caPath},
		},
		"authorization":            map[string]any{"mode": "Webhook"},
		"containerRuntimeEndpoint": "unix://" + n.socket(),
		"providerID":               b.ProviderID,
		"maxPods":                  b.Real.MaxPods,
		// This host's cgroups are v1; the kubelets from v1.35 refuse them
		// unless told (failCgroupV1), and each machine has a subtree.
		"failCgroupV1":       false,
		"cgroupDriver":       "cgroupfs",
		"cgroupRoot":         b.Real.Cgroup,
		"failSwapOn":         false,
		"resolvConf":         resolv,
		"clusterDomain":      domain,
		"registerWithTaints": taints,
		"rotateCertificates": false,
		// The agent renews the node's certificate; the serving one the
		// kubelet makes itself.
		"serverTLSBootstrap": false,
		// A local machine shares the host's disks: the host's free space
		// is not the machine's to guard.
		"evictionHard":                  map[string]string{"memory.available": "100Mi"},
		"imageGCHighThresholdPercent":   100,
		"imageGCLowThresholdPercent":    99,
		"localStorageCapacityIsolation": false,
	}
	if b.ClusterDNS != "" {
		cfg["clusterDNS"] = []string{b.ClusterDNS}
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	if err := files.WriteAtomic(n.path(kubeletConfigJSON), data, 0o600); err != nil {
		return err
	}
	proxy := map[string]any{
		"apiVersion":       "kubeproxy.config.k8s.io/v1alpha1",
		"kind":             "KubeProxyConfiguration",
		"clientConnection": map[string]any{"kubeconfig": n.path(kubeletKubeconfig)},
		"hostnameOverride": b.NodeName,
		"mode":             "iptables",
		// The Node's own pod CIDR tells local traffic from the rest: the
		// agent knows no cluster CIDR.
		"detectLocalMode": "NodeCIDR",
		"bindAddress":     "0.0.0.0",
		// On the Node's address, as kube-proxy's default: a load
		// balancer asks it whether to send the Node traffic.
		"healthzBindAddress": "0.0.0.0:10256",
		"metricsBindAddress": "127.0.0.1:10249",
		// The conntrack table's size is the host's, shared by every
		// machine: not one machine's to set.
		// Lowering it needs CAP_SYS_RESOURCE, which this host withholds.
		"oomScoreAdj": 0,
		"conntrack":   map[string]any{"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
	}
	if data, err = json.MarshalIndent(proxy, "", "  "); err != nil {
		return err
	}
	if err := files.WriteAtomic(n.path(kubeProxyConfig), data, 0o600); err != nil {
		return err
	}
	state := filepath.Join(b.Real.RuntimeDir, "state")
	toml := fmt.Sprintf(`version = 3
root = %q
state = %q

[grpc]
  address = %q

[ttrpc]
  address = %q

[plugins.'io.containerd.cri.v1.runtime']
  # Pod network namespaces under the state directory, not /var/run/netns:
  # a deleted machine's are found, and unmounted, there.
  netns_mounts_under_state_dir = true
  # This host withholds CAP_SYS_RESOURCE, without which no process may
  # lower an oom_score_adj (the kubelet asks -998 for every pod sandbox):
  # containers get at least containerd's own, as in a rootless setup.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        # runc's state is the machine's own: /run/containerd/runc is
        # shared by every containerd of the host.
        Root = %q
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%q]
    conf_dir = %q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = %q

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
`, n.path(ContainerdDir), state, n.socket(), n.socket()+".ttrpc", filepath.Join(b.Real.RuntimeDir, "runc"), b.Real.CNIBinDir, n.path(CNIConfDir), SandboxImage, n.path(RegistryConfDir))
	if err := files.WriteAtomic(n.path(containerdConfig), []byte(toml), 0o600); err != nil {
		return err
	}
	return files.WriteAtomic(n.path(RegistryConfDir, "_default", "hosts.toml"), []byte(n.registryHosts()), 0o600)
}

// registryHosts is containerd's configuration for every registry whose
// name has no directory of its own (_default): all of them. With a
// registry, every image comes from marina's, asked by its path alone
// (registry.k8s.io/pause:3.10.2 as pause:3.10.2; marina's registry keeps
// them so); an image it lacks fails the pull, as a missing one does
// anywhere, and nothing is asked of the internet. Without one, the node
// keeps containerd's defaults.
func (n *realNode) registryHosts() string {
	if n.boot.Real.Registry == "" {
		return "# No registry was given to this node: containerd's defaults.\n"
	}
	return fmt.Sprintf("# Every registry's images come from marina's, relayed to from %[1]s.\nserver = \"http://%[1]s\"\n", RegistryRelayAddress)
}

// writeCNI writes the pod network's configuration for the Node's pod
// CIDR: the reference plugins' bridge with host-local addresses, no
// masquerade (other Nodes' pods are routed to, and there is nowhere else
// to go), portmap for hostPorts. containerd loads it when it appears; the
// kubelet reports the Node Ready once it has.
func (n *realNode) writeCNI(podCIDR string) error {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "marina",
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      "cni0",
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": podCIDR}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": filepath.Join(n.boot.Real.RuntimeDir, "cni-ipam"),
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	path := n.path(CNIConfDir, cniConfFile)
	if cur, err := os.ReadFile(path); err == nil && string(cur) == string(data) {
		return nil
	}
	if err := files.WriteAtomic(path, data, 0o644); err != nil {
		return err
	}
	n.log.Info("Wrote the pod network's configuration", "podCIDR", podCIDR)
	return nil
}

// listenIn opens a TCP listener at addr inside the network namespace
// file netns: the socket stays in that namespace whatever thread accepts
// on it. The calling goroutine's thread enters the namespace for the
// socket call alone.
func listenIn(netns, addr string) (net.Listener, error) {
	type result struct {
		ln  net.Listener
		err error
	}
	res := make(chan result, 1)
	go func() {
		// Not unlocked: should returning to our namespace fail, the
		// thread ends with the goroutine instead of serving others.
		runtime.LockOSThread()
		own, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			res <- result{err: err}
			return
		}
		defer own.Close()
		target, err := os.Open(netns)
		if err != nil {
			res <- result{err: err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			res <- result{err: fmt.Errorf("entering %s: %w", netns, err)}
			return
		}
		ln, lerr := net.Listen("tcp", addr)
		if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err != nil {
			if ln != nil {
				ln.Close()
			}
			res <- result{err: fmt.Errorf("returning from %s: %w", netns, err)}
			return
		}
		runtime.UnlockOSThread()
		res <- result{ln: ln, err: lerr}
	}()
	r := <-res
	return r.ln, r.err
}

// relay copies each connection accepted on ln to target until ctx ends.
func relay(ctx context.Context, ln net.Listener, target string) {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	var d net.Dialer
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			up, err := d.DialContext(dctx, "tcp", target)
			cancel()
			if err != nil {
				return
			}
			defer up.Close()
			done := make(chan struct{}, 2)
			cp := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				done <- struct{}{}
			}
			go cp(up, c)
			go cp(c, up)
			select {
			case <-done:
				<-done
			case <-ctx.Done():
			}
		}()
	}
}

package bootstrap

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"time"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/manifest"
	"marina.dev/marina/internal/ownedflags"
	"marina.dev/marina/tools"
)

// Component names: the manifests' names in the sandbox.
const (
	Etcd              = "etcd"
	APIServer         = "kube-apiserver"
	ControllerManager = "kube-controller-manager"
	Scheduler         = "kube-scheduler"
)

// componentNames are the components a control-plane machine may run, in the
// order they start: Write removes the manifest of any the bundle lacks.
var componentNames = []string{Etcd, APIServer, ControllerManager, Scheduler}

// Default ports, those of kubeadm: every machine has its own address, so
// fixed ports do not clash.
const (
	DefaultAPIServerPort         = 6443
	DefaultEtcdClientPort        = 2379
	DefaultEtcdPeerPort          = 2380
	DefaultControllerManagerPort = 10257
	DefaultSchedulerPort         = 10259
)

// Defaults of the cluster network, the same as the Cluster API's, for
// callers that build a ClusterNetwork in Go rather than read it from the
// API server (which has applied them already).
const (
	DefaultPodCIDR     = "10.244.0.0/16"
	DefaultServiceCIDR = "10.96.0.0/12"
	DefaultDNSDomain   = "cluster.local"
)

// Paths in the sandbox, relative to its directory. They follow kubeadm's
// layout of /etc/kubernetes, so that an operator finds what they know.
const (
	PKIDir                      = "pki"
	CACert                      = "pki/ca.crt"
	CAKey                       = "pki/ca.key"
	ServiceAccountKey           = "pki/sa.key"
	ServiceAccountPub           = "pki/sa.pub"
	APIServerCert               = "pki/apiserver.crt"
	APIServerKey                = "pki/apiserver.key"
	APIServerKubeletClientCert  = "pki/apiserver-kubelet-client.crt"
	APIServerKubeletClientKey   = "pki/apiserver-kubelet-client.key"
	APIServerEtcdClientCert     = "pki/apiserver-etcd-client.crt"
	APIServerEtcdClientKey      = "pki/apiserver-etcd-client.key"
	FrontProxyCACert            = "pki/front-proxy-ca.crt"
	FrontProxyClientCert        = "pki/front-proxy-client.crt"
	FrontProxyClientKey         = "pki/front-proxy-client.key"
	EtcdCACert                  = "pki/etcd/ca.crt" // with external etcd, the CA given for it
	EtcdServerCert              = "pki/etcd/server.crt"
	EtcdServerKey               = "pki/etcd/server.key"
	EtcdPeerCert                = "pki/etcd/peer.crt"
	EtcdPeerKey                 = "pki/etcd/peer.key"
	EtcdHealthcheckClientCert   = "pki/etcd/healthcheck-client.crt"
	EtcdHealthcheckClientKey    = "pki/etcd/healthcheck-client.key"
	ControllerManagerKubeconfig = "controller-manager.conf"
	SchedulerKubeconfig         = "scheduler.conf"
	// EtcdDataDir is the stacked etcd member's data, made by etcd itself.
	EtcdDataDir = "etcd"
)

// Machine is what a control-plane machine's bundle is made from.
type Machine struct {
	// ClusterName names the cluster (kube-controller-manager's
	// --cluster-name, the kubeconfigs' cluster entry).
	ClusterName string
	// PKI is the cluster's key material. CA, FrontProxy and the
	// service-account keys are required; Etcd too with stacked etcd.
	PKI *clusterpki.Set
	// Name is the machine's name: its etcd member name and a SAN of its
	// serving certificates.
	Name string
	// IP is the machine's own address; every component listens on it and
	// nowhere else (on the local provider, 127.x.y.z, one per machine).
	IP net.IP
	// AdvertiseAddress is what the API server advertises as the kubernetes
	// Service's endpoint; nil: IP. The local provider's machines have
	// loopback addresses, which that Service cannot hold and no pod
	// reaches: it gives the address its real workers relay from.
	AdvertiseAddress net.IP
	// Endpoint is host:port of the control-plane endpoint, the load
	// balancer in front of every API server of the cluster; it may be the
	// machine's own API server address.
	Endpoint string
	// Ports are the components' ports on IP; zero fields take the defaults.
	Ports Ports
	// Network is the cluster's spec.clusterNetwork; empty fields take the
	// API's defaults.
	Network clusterv1.ClusterNetwork
	// Version is the control plane's Kubernetes version, e.g. v1.37.2.
	Version string
	// EtcdVersion is the etcd release to run when stacked; empty means the
	// pinned one (tools.Pinned().Etcd).
	EtcdVersion string
	// Overrides are versions single components run instead of Version and
	// EtcdVersion, during an in-place upgrade (M12); empty fields follow
	// Version and EtcdVersion.
	Overrides clusterv1.ComponentVersions
	// SettingsByVersion are the settings a component runs at a version
	// an upgrade moved it to, in place of Components (the settings the
	// machine was made with): a component's settings change with its
	// version, so rolling a step back restores both.
	SettingsByVersion map[string]clusterv1.ControlPlaneComponents
	// CertValidity is how long the certificates issued for the machine are
	// valid; zero: pki.LeafValidity.
	CertValidity time.Duration
	// BinDir is the absolute directory holding the pinned binaries,
	// <component>-<version>.
	BinDir string
	// Dir is the absolute sandbox directory the bundle is written to; the
	// components' arguments name files in it.
	Dir string
	// Components are spec.controlPlane.components: extraArgs, flag names
	// without dashes, override marina's flags of the same name.
	Components clusterv1.ControlPlaneComponents
	// Etcd says where the cluster's etcd runs: exactly one of Stacked and
	// External is set.
	Etcd EtcdConfig
}

// Ports are a control-plane machine's ports.
type Ports struct {
	APIServer         int
	EtcdClient        int
	EtcdPeer          int
	ControllerManager int
	Scheduler         int
}

func (p Ports) withDefaults() Ports {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&p.APIServer, DefaultAPIServerPort)
	def(&p.EtcdClient, DefaultEtcdClientPort)
	def(&p.EtcdPeer, DefaultEtcdPeerPort)
	def(&p.ControllerManager, DefaultControllerManagerPort)
	def(&p.Scheduler, DefaultSchedulerPort)
	return p
}

// EtcdConfig is the cluster's etcd as one machine sees it.
type EtcdConfig struct {
	Stacked  *StackedEtcd
	External *ExternalEtcd
}

// EtcdClusterState is etcd's --initial-cluster-state.
type EtcdClusterState string

const (
	// EtcdNewCluster: the members of InitialCluster start a cluster
	// together (the first control-plane machine, alone).
	EtcdNewCluster EtcdClusterState = "new"
	// EtcdExistingCluster: the member joins a running cluster, to which it
	// was added (etcdctl member add) before it starts.
	EtcdExistingCluster EtcdClusterState = "existing"
)

// StackedEtcd is this machine's member of a stacked etcd. The member's
// name is the machine's name and its peer URL https://<IP>:<EtcdPeer>.
type StackedEtcd struct {
	// InitialCluster are the cluster's members when this one starts, this
	// one included; empty means this member alone.
	InitialCluster []EtcdMember
	// State is new or existing; empty means new.
	State EtcdClusterState
}

// EtcdMember is one member of an etcd cluster.
type EtcdMember struct {
	Name    string
	PeerURL string
}

// ExternalEtcd is an etcd cluster marina does not run.
type ExternalEtcd struct {
	// Endpoints are the members' client URLs.
	Endpoints []string
	// CACert verifies the members' serving certificates (PEM).
	CACert []byte
	// ClientCert and ClientKey authenticate kube-apiserver (PEM);
	// ClientKey is a secret.
	ClientCert []byte
	ClientKey  []byte
}

// Bundle is everything a control-plane machine needs on disk.
type Bundle struct {
	// Dir is the sandbox directory the bundle is for.
	Dir string
	// Files are the files to write, by path relative to Dir. Their content
	// includes private keys and kubeconfigs with keys: never log a File's
	// data (File's String hides it).
	Files map[string]File
	// Manifests are the components to run, by name.
	Manifests map[string]*manifest.Manifest
}

// File is one file of a bundle. Data may be a private key: it is a secret
// and must never be logged, put in an event, a condition or an argument.
// String, GoString and MarshalLog print only its size and mode, so a File
// formatted by accident leaks nothing.
type File struct {
	Data []byte
	Mode fs.FileMode
}

// String hides the content.
func (f File) String() string { return fmt.Sprintf("<%d bytes, mode %#o>", len(f.Data), f.Mode) }

// GoString hides the content.
func (f File) GoString() string { return f.String() }

// MarshalLog hides the content from logr.
func (f File) MarshalLog() any { return f.String() }

// fileMode is the mode of every file of a bundle, certificates included:
// every reader is a component run by the machine's agent as its own user,
// so no one else has a reason to read any of them, and a single rule cannot
// leave a key readable by mistake. Directories are 0700.
const fileMode fs.FileMode = 0o600

// versionPattern is what a Kubernetes or etcd release looks like: it names
// a binary, so nothing else may get into a path.
var versionPattern = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$`)

// ControlPlane returns the bundle of one control-plane machine, its
// certificates valid from now. Errors say which input is wrong and never
// quote key material.
func ControlPlane(m *Machine, now time.Time) (*Bundle, error) {
	in, err := resolve(m)
	if err != nil {
		return nil, err
	}
	b := &Bundle{Dir: m.Dir, Files: map[string]File{}, Manifests: map[string]*manifest.Manifest{}}
	if err := in.certificates(b, now); err != nil {
		return nil, err
	}
	o := m.Overrides
	if in.etcd.Stacked != nil {
		b.Manifests[Etcd] = in.manifest(Etcd, or(o.Etcd, in.etcdVersion), in.etcdFlags(), nil)
	}
	settings := func(version string, pick func(*clusterv1.ControlPlaneComponents) clusterv1.ComponentSettings) map[string]string {
		if s, ok := m.SettingsByVersion[version]; ok {
			return pick(&s).ExtraArgs
		}
		return pick(&m.Components).ExtraArgs
	}
	for _, c := range []struct {
		name, version string
		flags         []flag
		pick          func(*clusterv1.ControlPlaneComponents) clusterv1.ComponentSettings
	}{
		{APIServer, or(o.APIServer, m.Version), in.apiServerFlags(), func(c *clusterv1.ControlPlaneComponents) clusterv1.ComponentSettings { return c.APIServer }},
		{ControllerManager, or(o.ControllerManager, m.Version), in.controllerManagerFlags(), func(c *clusterv1.ControlPlaneComponents) clusterv1.ComponentSettings { return c.ControllerManager }},
		{Scheduler, or(o.Scheduler, m.Version), in.schedulerFlags(), func(c *clusterv1.ControlPlaneComponents) clusterv1.ComponentSettings { return c.Scheduler }},
	} {
		b.Manifests[c.name] = in.manifest(c.name, c.version, c.flags, settings(c.version, c.pick))
	}
	return b, nil
}

// or is v, or def when v is empty.
func or(v, def string) string {
	if v != "" {
		return v
	}
	return def
}

// input is a Machine checked, with defaults applied and derived values.
type input struct {
	*Machine
	ports        Ports
	ip           netip.Addr
	advertise    netip.Addr
	endpointHost string
	pods         []netip.Prefix
	services     []netip.Prefix
	dnsDomain    string
	etcdVersion  string
	etcd         EtcdConfig
	members      []EtcdMember
	state        EtcdClusterState
}

func resolve(m *Machine) (*input, error) {
	if m == nil {
		return nil, errors.New("no machine given")
	}
	in := &input{Machine: m, ports: m.Ports.withDefaults(), etcd: m.Etcd, etcdVersion: m.EtcdVersion}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if m.ClusterName == "" {
		fail("the cluster name is empty")
	}
	if m.Name == "" {
		fail("the machine name is empty")
	}
	if p := m.PKI; p == nil || p.CA == nil || p.FrontProxy == nil || len(p.ServiceAccountKey) == 0 || len(p.ServiceAccountPub) == 0 {
		fail("the cluster's key material is incomplete: the cluster CA, the front-proxy CA and the service-account key pair are required")
	}
	ip, ok := netip.AddrFromSlice(m.IP)
	if !ok || !ip.IsValid() || ip.IsUnspecified() {
		fail("the machine's address %q is not a single IP address", m.IP)
	}
	in.ip = ip.Unmap()
	in.advertise = in.ip
	if m.AdvertiseAddress != nil {
		a, ok := netip.AddrFromSlice(m.AdvertiseAddress)
		if !ok || a.IsUnspecified() || a.IsLoopback() {
			fail("the advertised address %q is not a single IP address other pods can reach", m.AdvertiseAddress)
		}
		in.advertise = a.Unmap()
	}
	host, port, err := net.SplitHostPort(m.Endpoint)
	if err != nil || host == "" {
		fail("the control-plane endpoint %q is not host:port", m.Endpoint)
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		fail("the control-plane endpoint %q has no valid port", m.Endpoint)
	}
	in.endpointHost = host
	for _, p := range []int{in.ports.APIServer, in.ports.EtcdClient, in.ports.EtcdPeer, in.ports.ControllerManager, in.ports.Scheduler} {
		if p < 1 || p > 65535 {
			fail("port %d is out of range", p)
		}
	}
	if !versionPattern.MatchString(m.Version) {
		fail("the control-plane version %q is not a release such as v1.37.2", m.Version)
	}
	for _, v := range []string{m.Overrides.APIServer, m.Overrides.ControllerManager, m.Overrides.Scheduler, m.Overrides.Etcd} {
		if v != "" && !versionPattern.MatchString(v) {
			fail("the component version %q is not a release such as v1.37.2", v)
		}
	}
	if in.etcdVersion == "" {
		in.etcdVersion = tools.Pinned().Etcd
	}
	if !versionPattern.MatchString(in.etcdVersion) {
		fail("the etcd version %q is not a release such as v3.6.16", in.etcdVersion)
	}
	if !filepath.IsAbs(m.BinDir) {
		fail("the binaries' directory %q is not an absolute path", m.BinDir)
	}
	if !filepath.IsAbs(m.Dir) {
		fail("the sandbox directory %q is not an absolute path", m.Dir)
	}
	errs = append(errs, in.resolveNetwork()...)
	errs = append(errs, in.resolveEtcd()...)
	type args struct {
		name string
		args map[string]string
	}
	all := []args{
		{APIServer, m.Components.APIServer.ExtraArgs},
		{ControllerManager, m.Components.ControllerManager.ExtraArgs},
		{Scheduler, m.Components.Scheduler.ExtraArgs},
	}
	versions := make([]string, 0, len(m.SettingsByVersion))
	for v := range m.SettingsByVersion {
		versions = append(versions, v)
	}
	sort.Strings(versions) // the same input, the same error
	for _, v := range versions {
		n := m.SettingsByVersion[v]
		all = append(all, args{APIServer, n.APIServer.ExtraArgs}, args{ControllerManager, n.ControllerManager.ExtraArgs}, args{Scheduler, n.Scheduler.ExtraArgs})
	}
	for _, c := range all {
		names := make([]string, 0, len(c.args))
		for k := range c.args {
			names = append(names, k)
		}
		sort.Strings(names) // the same input, the same error
		for _, k := range names {
			if err := checkFlagName(k); err != nil {
				fail("extraArgs of %s: %w", c.name, err)
				continue
			}
			// Admission refuses these too; a Cluster stored before that
			// rule must still not rewire a component.
			if reason, owned := ownedflags.Owned(c.name, k); owned {
				fail("extraArgs of %s: flag %q is owned by marina (%s): remove it from the Cluster", c.name, k, reason)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("bootstrap data of control-plane machine %q: %w", m.Name, err)
	}
	return in, nil
}

func (in *input) resolveNetwork() []error {
	var errs []error
	parse := func(what string, cidrs []clusterv1.CIDR, def string) []netip.Prefix {
		if len(cidrs) == 0 {
			cidrs = []clusterv1.CIDR{clusterv1.CIDR(def)}
		}
		var out []netip.Prefix
		for _, c := range cidrs {
			p, err := netip.ParsePrefix(string(c))
			if err != nil {
				errs = append(errs, fmt.Errorf("the %s network %q is not a CIDR", what, c))
				continue
			}
			out = append(out, p.Masked())
		}
		return out
	}
	in.pods = parse("pod", in.Network.Pods, DefaultPodCIDR)
	in.services = parse("service", in.Network.Services, DefaultServiceCIDR)
	in.dnsDomain = in.Network.DNSDomain
	if in.dnsDomain == "" {
		in.dnsDomain = DefaultDNSDomain
	}
	return errs
}

func (in *input) resolveEtcd() []error {
	s, x := in.etcd.Stacked, in.etcd.External
	switch {
	case s == nil && x == nil:
		return []error{errors.New("no etcd given: set Stacked or External")}
	case s != nil && x != nil:
		return []error{errors.New("etcd is both stacked and external: set one")}
	case x != nil:
		return in.resolveExternal(x)
	}
	var errs []error
	if in.PKI != nil && in.PKI.Etcd == nil {
		errs = append(errs, errors.New("stacked etcd needs the cluster's etcd CA"))
	}
	self := EtcdMember{Name: in.Name, PeerURL: in.peerURL()}
	in.members = s.InitialCluster
	if len(in.members) == 0 {
		in.members = []EtcdMember{self}
	}
	found := false
	names := map[string]bool{}
	for _, mem := range in.members {
		if mem.Name == "" || mem.PeerURL == "" {
			errs = append(errs, fmt.Errorf("an etcd member of the initial cluster lacks a name or a peer URL: %+v", mem))
		}
		if names[mem.Name] {
			errs = append(errs, fmt.Errorf("etcd member %q is twice in the initial cluster", mem.Name))
		}
		names[mem.Name] = true
		if mem.Name == self.Name {
			found = true
			if mem.PeerURL != self.PeerURL {
				errs = append(errs, fmt.Errorf("the initial cluster gives this member the peer URL %q, but it listens on %q", mem.PeerURL, self.PeerURL))
			}
		}
	}
	if !found {
		errs = append(errs, fmt.Errorf("the initial cluster does not include this member %q", self.Name))
	}
	switch in.state = s.State; in.state {
	case "":
		in.state = EtcdNewCluster
	case EtcdNewCluster, EtcdExistingCluster:
	default:
		errs = append(errs, fmt.Errorf("etcd cluster state %q is neither %q nor %q", s.State, EtcdNewCluster, EtcdExistingCluster))
	}
	return errs
}

func (in *input) resolveExternal(x *ExternalEtcd) []error {
	var errs []error
	if len(x.Endpoints) == 0 {
		errs = append(errs, errors.New("external etcd has no endpoints"))
	}
	for _, e := range x.Endpoints {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			errs = append(errs, fmt.Errorf("external etcd endpoint %q is not a client URL such as https://10.0.0.5:2379", e))
		}
	}
	if err := checkCertPEM(x.CACert); err != nil {
		errs = append(errs, fmt.Errorf("the external etcd's CA certificate: %w", err))
	}
	if _, err := parsePair(x.ClientCert, x.ClientKey); err != nil {
		errs = append(errs, fmt.Errorf("the external etcd's client certificate and key: %w", err))
	}
	return errs
}

func (in *input) hostPort(port int) string {
	return net.JoinHostPort(in.ip.String(), strconv.Itoa(port))
}

func (in *input) peerURL() string   { return "https://" + in.hostPort(in.ports.EtcdPeer) }
func (in *input) clientURL() string { return "https://" + in.hostPort(in.ports.EtcdClient) }

// localAPIServer is the URL of this machine's own API server.
func (in *input) localAPIServer() string { return "https://" + in.hostPort(in.ports.APIServer) }

// path is the absolute path of a file of the bundle.
func (in *input) path(rel string) string { return filepath.Join(in.Dir, rel) }

// Write writes the bundle into its sandbox: every file, each atomically
// with its mode, in directories only the owner can enter; then the
// manifests, so that a running supervisor never starts a component before
// its files are in place; then it removes the manifest of any component the
// bundle does not run. Writing the same bundle again changes nothing a
// supervisor acts on but the certificates.
func (b *Bundle) Write() error {
	if err := os.MkdirAll(b.Dir, 0o700); err != nil {
		return fmt.Errorf("creating the sandbox %s: %w", b.Dir, err)
	}
	paths := make([]string, 0, len(b.Files))
	for p := range b.Files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		full := filepath.Join(b.Dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
			return fmt.Errorf("creating the directory of %s: %w", p, err)
		}
		f := b.Files[p]
		if err := files.WriteAtomic(full, f.Data, f.Mode); err != nil {
			return err
		}
	}
	for _, name := range componentNames {
		if m, ok := b.Manifests[name]; ok {
			if err := manifest.Write(b.Dir, name, m); err != nil {
				return err
			}
		}
	}
	for _, name := range componentNames {
		if _, ok := b.Manifests[name]; !ok {
			if err := manifest.Remove(b.Dir, name); err != nil {
				return err
			}
		}
	}
	return nil
}

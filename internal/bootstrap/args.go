package bootstrap

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"marina.dev/marina/internal/manifest"
)

// flag is one --name=value of a component.
type flag struct{ name, value string }

// checkFlagName refuses what cannot be a flag name: extraArgs are written
// without dashes and become --name=value.
func checkFlagName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("a flag name is empty")
	case strings.HasPrefix(name, "-"):
		return fmt.Errorf("flag %q: write flag names without the leading dashes", name)
	case strings.ContainsAny(name, "= \t\n"):
		return fmt.Errorf("flag %q: a flag name holds no '=' or white space", name)
	}
	return nil
}

// withExtraArgs renders flags as arguments, then extra's flags in name
// order. A flag of extra that marina sets never replaces marina's value:
// resolve refuses every flag marina owns (ownedflags) with the reason, and
// this is the last line behind it. No flag is ever given twice, so which
// value wins never depends on how a component parses repeated flags.
func withExtraArgs(flags []flag, extra map[string]string) []string {
	args := make([]string, 0, len(flags)+len(extra))
	set := map[string]bool{}
	for _, f := range flags {
		set[f.name] = true
		args = append(args, "--"+f.name+"="+f.value)
	}
	rest := make([]string, 0, len(extra))
	for name := range extra {
		if !set[name] {
			rest = append(rest, name)
		}
	}
	sort.Strings(rest)
	for _, name := range rest {
		args = append(args, "--"+name+"="+extra[name])
	}
	return args
}

func (in *input) manifest(name, version string, flags []flag, extra map[string]string) *manifest.Manifest {
	return &manifest.Manifest{
		Version: version,
		Binary:  filepath.Join(in.BinDir, name+"-"+version),
		Args:    withExtraArgs(flags, extra),
	}
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func (in *input) etcdFlags() []flag {
	initial := make([]string, len(in.members))
	for i, m := range in.members {
		initial[i] = m.Name + "=" + m.PeerURL
	}
	return []flag{
		{"name", in.Name},
		{"data-dir", in.path(EtcdDataDir)},
		// Only the machine's own address: kubeadm also listens on
		// 127.0.0.1, which several machines on one host cannot share.
		{"listen-client-urls", in.clientURL()},
		{"advertise-client-urls", in.clientURL()},
		{"listen-peer-urls", in.peerURL()},
		{"initial-advertise-peer-urls", in.peerURL()},
		{"initial-cluster", strings.Join(initial, ",")},
		{"initial-cluster-state", string(in.state)},
		// Clients and peers both present certificates of the cluster's etcd
		// CA: any local user can reach loopback.
		{"client-cert-auth", "true"},
		{"cert-file", in.path(EtcdServerCert)},
		{"key-file", in.path(EtcdServerKey)},
		{"trusted-ca-file", in.path(EtcdCACert)},
		{"peer-client-cert-auth", "true"},
		{"peer-cert-file", in.path(EtcdPeerCert)},
		{"peer-key-file", in.path(EtcdPeerKey)},
		{"peer-trusted-ca-file", in.path(EtcdCACert)},
		{"snapshot-count", "10000"},
	}
}

func (in *input) apiServerFlags() []flag {
	etcdServers := in.clientURL() // stacked: the member on this machine, as kubeadm
	if x := in.etcd.External; x != nil {
		etcdServers = strings.Join(x.Endpoints, ",")
	}
	return []flag{
		{"advertise-address", in.advertise.String()},
		{"bind-address", in.ip.String()},
		{"secure-port", strconv.Itoa(in.ports.APIServer)},
		{"tls-cert-file", in.path(APIServerCert)},
		{"tls-private-key-file", in.path(APIServerKey)},
		{"client-ca-file", in.path(CACert)},
		// The Node authorizer and NodeRestriction confine each kubelet to
		// its own Node and pods; bootstrap tokens let a new kubelet ask for
		// its certificate (TLS bootstrap).
		{"authorization-mode", "Node,RBAC"},
		{"enable-admission-plugins", "NodeRestriction"},
		{"enable-bootstrap-token-auth", "true"},
		{"allow-privileged", "true"},
		{"etcd-servers", etcdServers},
		{"etcd-cafile", in.path(EtcdCACert)},
		{"etcd-certfile", in.path(APIServerEtcdClientCert)},
		{"etcd-keyfile", in.path(APIServerEtcdClientKey)},
		{"kubelet-client-certificate", in.path(APIServerKubeletClientCert)},
		{"kubelet-client-key", in.path(APIServerKubeletClientKey)},
		{"kubelet-preferred-address-types", "InternalIP,ExternalIP,Hostname"},
		// Aggregated API servers trust the front-proxy client's headers.
		{"proxy-client-cert-file", in.path(FrontProxyClientCert)},
		{"proxy-client-key-file", in.path(FrontProxyClientKey)},
		{"requestheader-client-ca-file", in.path(FrontProxyCACert)},
		{"requestheader-allowed-names", frontProxyClientName},
		{"requestheader-extra-headers-prefix", "X-Remote-Extra-"},
		{"requestheader-group-headers", "X-Remote-Group"},
		{"requestheader-username-headers", "X-Remote-User"},
		{"service-account-issuer", "https://kubernetes.default.svc." + in.dnsDomain},
		{"service-account-key-file", in.path(ServiceAccountPub)},
		{"service-account-signing-key-file", in.path(ServiceAccountKey)},
		{"service-cluster-ip-range", joinPrefixes(in.services)},
		// The kubernetes Service's endpoints are the API servers'
		// advertised addresses, and the API refuses loopback ones: with
		// the default reconciler an API server advertising one would fail
		// to write them, forever.
		{"endpoint-reconciler-type", in.endpointReconciler()},
	}
}

// endpointReconciler is lease (kubeadm's default, for several API servers)
// unless the advertised address is one the kubernetes Service's endpoints
// cannot hold. Several API servers advertising one address (the local
// provider's) share one lease: the Service keeps that one endpoint while
// any of them runs, but loses it for up to a reconcile interval (10 s)
// after the one that wrote it last stops.
func (in *input) endpointReconciler() string {
	if in.advertise.IsLoopback() {
		return "none"
	}
	return "lease"
}

func (in *input) controllerManagerFlags() []flag {
	kubeconfig := in.path(ControllerManagerKubeconfig)
	return []flag{
		{"kubeconfig", kubeconfig},
		// Its secure port serves /healthz for health checks: on the
		// machine's own address, authenticated and authorized through the
		// API server like kubeadm's.
		{"authentication-kubeconfig", kubeconfig},
		{"authorization-kubeconfig", kubeconfig},
		{"bind-address", in.ip.String()},
		{"secure-port", strconv.Itoa(in.ports.ControllerManager)},
		{"client-ca-file", in.path(CACert)},
		{"requestheader-client-ca-file", in.path(FrontProxyCACert)},
		{"cluster-name", in.ClusterName},
		// Every controller, bootstrap-token signing and cleanup included
		// (off by default): workers join with bootstrap tokens.
		{"controllers", "*,bootstrapsigner,tokencleaner"},
		// Each controller acts as its own service account, with the
		// bootstrap policy's per-controller roles.
		{"use-service-account-credentials", "true"},
		// The cluster CA signs the certificates kubelets ask for.
		{"cluster-signing-cert-file", in.path(CACert)},
		{"cluster-signing-key-file", in.path(CAKey)},
		{"root-ca-file", in.path(CACert)},
		{"service-account-private-key-file", in.path(ServiceAccountKey)},
		// Nodes get their pod networks (spec.podCIDRs), as kubeadm does
		// when it is given a pod network; the API always gives one.
		{"allocate-node-cidrs", "true"},
		{"cluster-cidr", joinPrefixes(in.pods)},
		{"service-cluster-ip-range", joinPrefixes(in.services)},
		// Several control-plane machines: one active instance.
		{"leader-elect", "true"},
	}
}

func (in *input) schedulerFlags() []flag {
	kubeconfig := in.path(SchedulerKubeconfig)
	return []flag{
		{"kubeconfig", kubeconfig},
		{"authentication-kubeconfig", kubeconfig},
		{"authorization-kubeconfig", kubeconfig},
		{"bind-address", in.ip.String()},
		{"secure-port", strconv.Itoa(in.ports.Scheduler)},
		{"leader-elect", "true"},
	}
}

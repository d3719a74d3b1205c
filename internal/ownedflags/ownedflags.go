package ownedflags

import (
	"slices"
	"strings"
)

// The components whose flags a Cluster's extraArgs can add to
// (spec.controlPlane.components). etcd and the kubelet take no extraArgs:
// marina sets every flag of theirs.
const (
	APIServer         = "kube-apiserver"
	ControllerManager = "kube-controller-manager"
	Scheduler         = "kube-scheduler"
)

// Components are the components with extraArgs, in the order the docs list
// them.
var Components = []string{APIServer, ControllerManager, Scheduler}

// Reason is why marina owns a flag: the sentence the admission webhook and
// the bootstrap error give a user, after "marina owns this flag: ".
type Reason string

// The reasons, one per kind of wiring.
const (
	// Address: where the component listens and how it is reached. On a
	// provider that runs components as host processes, a flag here opens a
	// port on the management host.
	Address Reason = "it sets an address or port the component listens on or is reached at"
	// File: a path on the machine. A component run as a host process can
	// read or write any file its user can, including the management
	// plane's keys.
	File Reason = "it names a file or directory on the machine, which marina lays out; a component could otherwise read or write files outside its machine"
	// Authentication: whom the component trusts.
	Authentication Reason = "it decides whom the component trusts (authentication)"
	// Authorization: what callers may do once known.
	Authorization Reason = "it decides what callers may do (authorization and admission)"
	// Etcd: where the API server keeps the cluster's data.
	Etcd Reason = "it wires the API server to etcd, where the cluster's data lives"
	// Keys: the keys that sign service-account tokens and certificates.
	Keys Reason = "it names service-account or signing keys"
	// Cluster: the cluster's identity, its networks, another API server or a
	// cloud.
	Cluster Reason = "it names the cluster, its networks, another API server or a cloud"
	// Set: marina sets it so that the component works in a marina cluster
	// (one leader among replicas, the controllers bootstrap tokens need),
	// or marina reads it (the version a component reports).
	Set Reason = "marina sets or relies on it for the component to work in the cluster"
)

// rule is a flag name, or a prefix of names when it ends in '*'.
type rule struct {
	pattern string
	reason  Reason
}

func (r rule) matches(name string) bool {
	if p, ok := strings.CutSuffix(r.pattern, "*"); ok {
		return strings.HasPrefix(name, p)
	}
	return name == r.pattern
}

// common are owned on every component: all three serve HTTPS, authenticate
// and authorize their callers the same way (k8s.io/apiserver's options), and
// read a kubeconfig or a config file.
var common = []rule{
	{"bind-address", Address},
	{"secure-port", Address},
	{"address", Address},
	{"port", Address},
	{"insecure-port", Address},
	{"insecure-bind-address", Address},
	{"permit-port-sharing", Address},
	{"permit-address-sharing", Address},
	{"cert-dir", File},
	{"tls-cert-file", File},
	{"tls-private-key-file", File},
	{"tls-sni-cert-key", File},
	{"kubeconfig", File},
	{"config", File},
	{"write-config-to", File},
	{"client-ca-file", Authentication},
	{"authentication-*", Authentication},
	{"requestheader-*", Authentication},
	{"authorization-*", Authorization},
	{"master", Cluster},
	{"cloud-*", Cluster},
	{"emulated-version", Set},
	{"version", Set},
	{"leader-elect", Set},
}

// byComponent are owned on one component.
var byComponent = map[string][]rule{
	APIServer: {
		{"advertise-address", Address},
		{"external-hostname", Address},
		{"peer-*", Cluster},
		{"etcd-*", Etcd},
		{"storage-backend", Etcd},
		{"encryption-provider-*", Etcd},
		{"anonymous-auth", Authentication},
		{"token-auth-file", Authentication},
		{"oidc-*", Authentication},
		{"enable-bootstrap-token-auth", Authentication},
		{"kubelet-*", Authentication},
		{"proxy-client-*", Authentication},
		{"enable-admission-plugins", Authorization},
		{"disable-admission-plugins", Authorization},
		{"admission-control", Authorization},
		{"admission-control-config-file", Authorization},
		{"service-account-*", Keys},
		{"api-audiences", Keys},
		{"service-cluster-ip-range", Cluster},
		{"allow-privileged", Set},
		{"endpoint-reconciler-type", Set},
		{"enable-logs-handler", File},
		{"apiserver-count", Set},
	},
	ControllerManager: {
		{"cluster-signing-*", Keys},
		{"root-ca-file", Keys},
		{"service-account-*", Keys},
		{"cluster-name", Cluster},
		{"cluster-cidr", Cluster},
		{"service-cluster-ip-range", Cluster},
		{"allocate-node-cidrs", Set},
		{"controllers", Set},
		{"use-service-account-credentials", Set},
		{"leader-migration-config", File},
	},
	Scheduler: {},
}

// fileWords and addressWords catch, in any component and in flags added by
// later releases, a name with one of these words (between '-', '.' or '_'):
// audit-log-path, flex-volume-plugin-dir, allow-metric-labels-manifest,
// service-node-port-range.
var (
	fileWords    = []string{"file", "files", "path", "paths", "dir", "directory", "kubeconfig", "filepath", "cafile", "certfile", "keyfile", "socket", "manifest"}
	addressWords = []string{"address", "addresses", "port", "ip", "url", "urls", "uri", "host", "hostname", "servers"}
)

// Owned reports whether marina owns flag name (written without dashes) of
// component, and why. A component with no extraArgs (etcd, the kubelet)
// owns every flag.
func Owned(component, name string) (Reason, bool) {
	rules, ok := byComponent[component]
	if !ok {
		return Set, true
	}
	// The components read '_' in a flag's name as '-' (component-base's
	// cli.Run sets WordSepNormalizeFunc): kube-apiserver takes
	// --authorization_mode=AlwaysAllow as --authorization-mode. Judge the
	// name the component will see.
	name = strings.ReplaceAll(name, "_", "-")
	for _, rs := range [][]rule{common, rules} {
		for _, r := range rs {
			if r.matches(name) {
				return r.reason, true
			}
		}
	}
	for _, w := range strings.FieldsFunc(name, func(r rune) bool { return r == '-' || r == '.' || r == '_' }) {
		switch {
		case slices.Contains(fileWords, w):
			return File, true
		case slices.Contains(addressWords, w):
			return Address, true
		}
	}
	return "", false
}

package plane

import (
	"fmt"
	"path/filepath"
	"strings"
)

func (p *Plane) pkiFile(name string) string { return filepath.Join(p.state.pki(), name) }

func (p *Plane) etcdArgs() []string {
	client := fmt.Sprintf("https://%s:%d", host, p.opts.EtcdPort)
	peer := fmt.Sprintf("https://%s:%d", host, p.opts.EtcdPort+1)
	return []string{
		"--name=marina",
		"--data-dir=" + p.state.etcdData(),
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=marina=" + peer,
		// Clients and peers both present certificates from the plane's CA: any
		// local user can reach loopback, so loopback alone is no protection.
		"--cert-file=" + p.pkiFile("etcd.crt"),
		"--key-file=" + p.pkiFile("etcd.key"),
		"--trusted-ca-file=" + p.pkiFile("ca.crt"),
		"--client-cert-auth",
		"--peer-cert-file=" + p.pkiFile("etcd.crt"),
		"--peer-key-file=" + p.pkiFile("etcd.key"),
		"--peer-trusted-ca-file=" + p.pkiFile("ca.crt"),
		"--peer-client-cert-auth",
		"--log-level=warn",
	}
}

func (p *Plane) apiserverArgs() []string {
	return []string{
		fmt.Sprintf("--etcd-servers=https://%s:%d", host, p.opts.EtcdPort),
		"--etcd-cafile=" + p.pkiFile("ca.crt"),
		"--etcd-certfile=" + p.pkiFile("apiserver-etcd-client.crt"),
		"--etcd-keyfile=" + p.pkiFile("apiserver-etcd-client.key"),
		"--bind-address=" + host,
		"--advertise-address=" + host,
		fmt.Sprintf("--secure-port=%d", p.opts.APIPort),
		"--tls-cert-file=" + p.pkiFile("apiserver.crt"),
		"--tls-private-key-file=" + p.pkiFile("apiserver.key"),
		"--client-ca-file=" + p.pkiFile("ca.crt"),
		// Client certificates are the only way in: no anonymous requests, no
		// static tokens; RBAC decides what each authenticated user may do.
		"--anonymous-auth=false",
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + p.pkiFile("sa.pub"),
		"--service-account-signing-key-file=" + p.pkiFile("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/24",
		// The kubernetes Service cannot point at loopback, and nothing in a
		// management plane needs it to.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
		"--v=0",
	}
}

func (p *Plane) controllerManagerArgs() []string {
	return []string{
		"--kubeconfig=" + p.state.kubeconfig("controller-manager"),
		// Only what a management plane needs: owner references cascade
		// (garbage collector), namespaces delete with their contents, new
		// namespaces get their default service account, and service-account
		// token Secrets get their token.
		"--controllers=" + strings.Join(controllerManagerControllers, ","),
		// Each controller acts as its own service account in kube-system, as
		// kubeadm runs it: the bootstrap policy grants
		// system:controller:<name> what that controller needs, while the
		// manager's own identity (system:kube-controller-manager) may only
		// make those accounts and their tokens. Without this the garbage
		// collector and the namespace controller are denied and deletions
		// never cascade.
		"--use-service-account-credentials=true",
		// The token controller signs legacy token Secrets with the same key
		// the API server verifies, and puts the plane's CA beside them.
		"--service-account-private-key-file=" + p.pkiFile("sa.key"),
		"--root-ca-file=" + p.pkiFile("ca.crt"),
		"--leader-elect=false",
		// No HTTPS endpoint: nothing scrapes it, and it would be one more port.
		"--secure-port=0",
		"--v=0",
	}
}

// controllerManagerControllers are the kube-controller-manager controllers
// the plane runs; everything else (pods, nodes, volumes) has nothing to act
// on in a management plane.
var controllerManagerControllers = []string{
	"garbage-collector-controller",
	"namespace-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
}

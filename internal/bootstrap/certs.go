package bootstrap

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"marina.dev/marina/internal/kubeconfig"
	"marina.dev/marina/internal/pki"
)

// Identities of the certificates, as kubeadm names them.
const (
	// kubeletClientGroup is the group of kube-apiserver's client
	// certificate for kubelets (logs, exec, port-forward). kubeadm now uses
	// kubeadm:cluster-admins, bound to cluster-admin by a ClusterRoleBinding
	// it creates once the API server is up, so that the identity can be
	// revoked. marina uses system:masters: nothing would create that binding
	// before the first API server starts, and revocation would buy nothing
	// here, since a control-plane machine holds the cluster CA's key (for
	// kube-controller-manager) and can mint any identity anyway.
	kubeletClientGroup = "system:masters"

	frontProxyClientName = "front-proxy-client"
)

// leaf is a certificate to issue and where its pair goes.
type leaf struct {
	ca        *pki.KeyPair
	spec      pki.CertSpec
	cert, key string
}

// certificates fills b.Files with the machine's key material.
func (in *input) certificates(b *Bundle, now time.Time) error {
	p := in.PKI
	add := func(path string, data []byte) { b.Files[path] = File{Data: data, Mode: fileMode} }
	addPair := func(certPath, keyPath string, kp *pki.KeyPair) error {
		key, err := kp.KeyPEM()
		if err != nil {
			return err
		}
		add(certPath, kp.CertPEM())
		add(keyPath, key)
		return nil
	}
	issue := func(ca *pki.KeyPair, spec pki.CertSpec, certPath, keyPath string) error {
		kp, err := ca.IssueFor(spec, now, in.CertValidity)
		if err != nil {
			return fmt.Errorf("issuing %s: %w", certPath, err)
		}
		return addPair(certPath, keyPath, kp)
	}

	// The cluster CA's key signs kubelets' client and serving certificates
	// (kube-controller-manager's csrsigning controller).
	if err := addPair(CACert, CAKey, p.CA); err != nil {
		return err
	}
	add(ServiceAccountKey, p.ServiceAccountKey)
	add(ServiceAccountPub, p.ServiceAccountPub)
	add(FrontProxyCACert, p.FrontProxy.CertPEM())

	dnsNames, ips := in.apiServerSANs()
	leaves := []leaf{
		{p.CA, pki.CertSpec{CommonName: "kube-apiserver", DNSNames: dnsNames, IPs: ips, Usage: pki.ServerAuth}, APIServerCert, APIServerKey},
		{p.CA, pki.CertSpec{CommonName: "kube-apiserver-kubelet-client", Organizations: []string{kubeletClientGroup}, Usage: pki.ClientAuth}, APIServerKubeletClientCert, APIServerKubeletClientKey},
		// Its common name is what --requestheader-allowed-names accepts.
		{p.FrontProxy, pki.CertSpec{CommonName: frontProxyClientName, Usage: pki.ClientAuth}, FrontProxyClientCert, FrontProxyClientKey},
	}
	if in.etcd.Stacked != nil {
		etcdDNS, etcdIPs := in.etcdSANs()
		// Server and peer certificates serve both ways, as kubeadm makes
		// them: a member presents its peer certificate as a client to the
		// other members.
		both := pki.ServerAuth | pki.ClientAuth
		leaves = append(leaves,
			leaf{p.Etcd, pki.CertSpec{CommonName: in.Name, DNSNames: etcdDNS, IPs: etcdIPs, Usage: both}, EtcdServerCert, EtcdServerKey},
			leaf{p.Etcd, pki.CertSpec{CommonName: in.Name, DNSNames: etcdDNS, IPs: etcdIPs, Usage: both}, EtcdPeerCert, EtcdPeerKey},
			leaf{p.Etcd, pki.CertSpec{CommonName: "kube-etcd-healthcheck-client", Usage: pki.ClientAuth}, EtcdHealthcheckClientCert, EtcdHealthcheckClientKey},
			leaf{p.Etcd, pki.CertSpec{CommonName: "kube-apiserver-etcd-client", Usage: pki.ClientAuth}, APIServerEtcdClientCert, APIServerEtcdClientKey},
		)
		add(EtcdCACert, p.Etcd.CertPEM())
	} else {
		// The same paths as stacked, so that kube-apiserver's flags differ
		// only in --etcd-servers.
		x := in.etcd.External
		add(EtcdCACert, x.CACert)
		add(APIServerEtcdClientCert, x.ClientCert)
		add(APIServerEtcdClientKey, x.ClientKey)
	}
	for _, l := range leaves {
		if err := issue(l.ca, l.spec, l.cert, l.key); err != nil {
			return err
		}
	}

	for _, kc := range []struct{ path, user string }{
		{ControllerManagerKubeconfig, "system:kube-controller-manager"},
		{SchedulerKubeconfig, "system:kube-scheduler"},
	} {
		data, err := in.localKubeconfig(kc.user, now)
		if err != nil {
			return err
		}
		add(kc.path, data)
	}
	return nil
}

// localKubeconfig is a kubeconfig for user that reaches this machine's own
// API server, not the control-plane endpoint, as kubeadm does: the
// controller manager and the scheduler then work while the load balancer
// is down or not yet made (the first machine starts before its endpoint
// has a healthy backend), and during an in-place upgrade each talks to an
// API server of its own version, never an older one (the version skew
// policy), whichever backend the balancer would have picked.
func (in *input) localKubeconfig(user string, now time.Time) ([]byte, error) {
	client, err := in.PKI.CA.IssueFor(pki.CertSpec{CommonName: user, Usage: pki.ClientAuth}, now, in.CertValidity)
	if err != nil {
		return nil, fmt.Errorf("issuing the client certificate of %s: %w", user, err)
	}
	return kubeconfig.Encode(in.ClusterName, user, in.localAPIServer(), in.PKI.CA.CertPEM(), client)
}

// apiServerSANs are the names of the API server: every way a client
// reaches it, the endpoint (through the balancer), the machine's own
// address (the balancer's health checks, the local components), loopback,
// and the in-cluster Service (kubernetes.default... and its cluster IP,
// the first address of each service network).
func (in *input) apiServerSANs() (dnsNames []string, ips []net.IP) {
	dnsNames = []string{
		"kubernetes",
		"kubernetes.default",
		"kubernetes.default.svc",
		"kubernetes.default.svc." + in.dnsDomain,
		"localhost",
		in.Name,
	}
	addrs := []netip.Addr{in.ip, netip.MustParseAddr("127.0.0.1")}
	for _, s := range in.services {
		addrs = append(addrs, s.Addr().Next())
	}
	if a, err := netip.ParseAddr(in.endpointHost); err == nil {
		addrs = append(addrs, a.Unmap())
	} else {
		dnsNames = append(dnsNames, in.endpointHost)
	}
	return dedupe(dnsNames), toIPs(addrs)
}

// etcdSANs are the names of this etcd member: its address, and localhost
// and its name as kubeadm adds them.
func (in *input) etcdSANs() (dnsNames []string, ips []net.IP) {
	return dedupe([]string{"localhost", in.Name}), toIPs([]netip.Addr{in.ip})
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	out := s[:0:0]
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

func toIPs(addrs []netip.Addr) []net.IP {
	seen := map[netip.Addr]bool{}
	var out []net.IP
	for _, a := range addrs {
		if !seen[a] {
			seen[a] = true
			out = append(out, net.IP(a.AsSlice()))
		}
	}
	return out
}

// checkCertPEM checks that data holds at least one PEM certificate and
// nothing that does not parse as one.
func checkCertPEM(data []byte) error {
	n := 0
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return fmt.Errorf("holds a PEM block of type %q where certificates are expected", block.Type)
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return fmt.Errorf("certificate %d does not parse: %w", n+1, err)
		}
		n++
	}
	if n == 0 {
		return errors.New("holds no PEM certificate")
	}
	return nil
}

// parsePair checks that a certificate and a key are a pair; its errors
// never quote the key.
func parsePair(certPEM, keyPEM []byte) (*pki.KeyPair, error) {
	if len(certPEM) == 0 || len(keyPEM) == 0 {
		return nil, errors.New("both the certificate and the key are required")
	}
	return pki.ParsePEM(certPEM, keyPEM)
}

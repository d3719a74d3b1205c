package bootstrap_test

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/manifest"
	"marina.dev/marina/internal/ownedflags"
	"marina.dev/marina/internal/pki"
	"marina.dev/marina/tools"
)

func TestAPIServerCertificateNamesEveryWayInAndNothingElse(t *testing.T) {
	set := newSet(t)
	for _, tc := range []struct {
		name      string
		endpoint  string
		network   clusterv1.ClusterNetwork
		wantDNS   []string
		wantIPs   []string
		unwantDNS []string
	}{{
		name:     "defaults, endpoint by address",
		endpoint: "127.0.9.9:7443",
		wantDNS:  []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost", "demo-cp-0"},
		wantIPs:  []string{"127.0.4.2", "127.0.0.1", "10.96.0.1", "127.0.9.9"},
	}, {
		name:     "own DNS domain, dual-stack services, endpoint by name",
		endpoint: "api.demo.example:6443",
		network: clusterv1.ClusterNetwork{
			Services:  []clusterv1.CIDR{"10.100.0.0/16", "fd00:10::/108"},
			DNSDomain: "corp.internal",
		},
		wantDNS:   []string{"kubernetes.default.svc.corp.internal", "api.demo.example"},
		wantIPs:   []string{"127.0.4.2", "127.0.0.1", "10.100.0.1", "fd00:10::1"},
		unwantDNS: []string{"kubernetes.default.svc.cluster.local"},
	}, {
		name:     "endpoint is the machine's own API server",
		endpoint: "127.0.4.2:6443",
		wantIPs:  []string{"127.0.4.2", "127.0.0.1", "10.96.0.1"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			m := stackedMachine(t, set)
			m.Endpoint, m.Network = tc.endpoint, tc.network
			c := cert(t, mustBundle(t, m), bootstrap.APIServerCert)
			for _, d := range tc.wantDNS {
				if !slices.Contains(c.DNSNames, d) {
					t.Errorf("DNS SANs %v lack %s", c.DNSNames, d)
				}
			}
			for _, d := range tc.unwantDNS {
				if slices.Contains(c.DNSNames, d) {
					t.Errorf("DNS SANs %v hold %s", c.DNSNames, d)
				}
			}
			var ips []string
			for _, ip := range c.IPAddresses {
				ips = append(ips, ip.String())
			}
			slices.Sort(ips)
			want := slices.Clone(tc.wantIPs)
			slices.Sort(want)
			if !slices.Equal(ips, want) {
				t.Errorf("IP SANs = %v, want exactly %v (no duplicates)", ips, want)
			}
			pool := x509.NewCertPool()
			pool.AddCert(set.CA.Cert)
			host, _, _ := net.SplitHostPort(tc.endpoint)
			for _, name := range []string{host, "127.0.4.2", "kubernetes.default.svc"} {
				if _, err := c.Verify(x509.VerifyOptions{Roots: pool, DNSName: name, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
					t.Errorf("the serving certificate does not verify for %s against the cluster CA: %v", name, err)
				}
			}
		})
	}
}

func TestCertificatesCarryKubeadmIdentitiesFromTheRightCA(t *testing.T) {
	set := newSet(t)
	now := time.Now().Add(72 * time.Hour).Truncate(time.Second)
	b, err := bootstrap.ControlPlane(stackedMachine(t, set), now)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path   string
		ca     *pki.KeyPair
		cn     string
		orgs   []string
		usages []x509.ExtKeyUsage
	}{
		{bootstrap.APIServerCert, set.CA, "kube-apiserver", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}},
		{bootstrap.APIServerKubeletClientCert, set.CA, "kube-apiserver-kubelet-client", []string{"system:masters"}, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{bootstrap.FrontProxyClientCert, set.FrontProxy, "front-proxy-client", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{bootstrap.APIServerEtcdClientCert, set.Etcd, "kube-apiserver-etcd-client", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{bootstrap.EtcdHealthcheckClientCert, set.Etcd, "kube-etcd-healthcheck-client", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{bootstrap.EtcdServerCert, set.Etcd, "demo-cp-0", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}},
		{bootstrap.EtcdPeerCert, set.Etcd, "demo-cp-0", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}},
	} {
		c := cert(t, b, tc.path)
		if err := c.CheckSignatureFrom(tc.ca.Cert); err != nil {
			t.Errorf("%s is not signed by %s: %v", tc.path, tc.ca.Cert.Subject.CommonName, err)
		}
		if c.Subject.CommonName != tc.cn || !slices.Equal(c.Subject.Organization, tc.orgs) {
			t.Errorf("%s: subject CN=%s O=%v, want CN=%s O=%v", tc.path, c.Subject.CommonName, c.Subject.Organization, tc.cn, tc.orgs)
		}
		if !slices.Equal(c.ExtKeyUsage, tc.usages) {
			t.Errorf("%s: extended key usages %v, want %v", tc.path, c.ExtKeyUsage, tc.usages)
		}
		if !c.NotBefore.Equal(now.Add(-time.Hour)) {
			t.Errorf("%s: valid from %s, want an hour before the given time %s", tc.path, c.NotBefore, now)
		}
	}
	etcd := cert(t, b, bootstrap.EtcdServerCert)
	if !slices.Equal(etcd.DNSNames, []string{"localhost", "demo-cp-0"}) || len(etcd.IPAddresses) != 1 || !etcd.IPAddresses[0].Equal(net.ParseIP("127.0.4.2")) {
		t.Errorf("etcd serving SANs = %v %v, want localhost, demo-cp-0 and 127.0.4.2", etcd.DNSNames, etcd.IPAddresses)
	}
	if !bytes.Equal(b.Files[bootstrap.FrontProxyCACert].Data, set.FrontProxy.CertPEM()) {
		t.Error("the front-proxy CA certificate is not the cluster's")
	}
}

func TestComponentKubeconfigsReachTheMachinesOwnAPIServer(t *testing.T) {
	set := newSet(t)
	b := mustBundle(t, stackedMachine(t, set))
	for path, user := range map[string]string{
		bootstrap.ControllerManagerKubeconfig: "system:kube-controller-manager",
		bootstrap.SchedulerKubeconfig:         "system:kube-scheduler",
	} {
		cfg, err := clientcmd.Load(b.Files[path].Data)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		ctx := cfg.Contexts[cfg.CurrentContext]
		if got := cfg.Clusters[ctx.Cluster].Server; got != "https://127.0.4.2:6443" {
			t.Errorf("%s reaches %s, want the machine's own API server https://127.0.4.2:6443, not the endpoint", path, got)
		}
		if !bytes.Equal(cfg.Clusters[ctx.Cluster].CertificateAuthorityData, set.CA.CertPEM()) {
			t.Errorf("%s does not trust the cluster CA", path)
		}
		client, err := pki.ParsePEM(cfg.AuthInfos[ctx.AuthInfo].ClientCertificateData, cfg.AuthInfos[ctx.AuthInfo].ClientKeyData)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if client.Cert.Subject.CommonName != user || client.Cert.CheckSignatureFrom(set.CA.Cert) != nil {
			t.Errorf("%s authenticates as %q (signed by the cluster CA: %v), want %s", path, client.Cert.Subject.CommonName, client.Cert.CheckSignatureFrom(set.CA.Cert) == nil, user)
		}
	}
}

// extraArgs tune a component: they are appended after marina's flags, in
// name order, each once.
func TestExtraArgsAreAppendedOnceInNameOrder(t *testing.T) {
	set := newSet(t)
	m := stackedMachine(t, set)
	m.Components = clusterv1.ControlPlaneComponents{
		APIServer:         clusterv1.ComponentSettings{ExtraArgs: map[string]string{"v": "2", "audit-log-maxage": "30"}},
		ControllerManager: clusterv1.ComponentSettings{ExtraArgs: map[string]string{"node-monitor-grace-period": "20s"}},
		Scheduler:         clusterv1.ComponentSettings{ExtraArgs: map[string]string{"v": "4"}},
	}
	b := mustBundle(t, m)
	for _, tc := range []struct {
		component, flag, want string
	}{
		{bootstrap.APIServer, "v", "2"},
		{bootstrap.APIServer, "audit-log-maxage", "30"},
		{bootstrap.APIServer, "enable-bootstrap-token-auth", "true"}, // untouched
		{bootstrap.ControllerManager, "node-monitor-grace-period", "20s"},
		{bootstrap.Scheduler, "v", "4"},
		{bootstrap.Scheduler, "leader-elect", "true"},
	} {
		if got := flag(t, b.Manifests[tc.component], tc.flag); got != tc.want {
			t.Errorf("%s --%s = %q, want %q", tc.component, tc.flag, got, tc.want)
		}
	}
	args := b.Manifests[bootstrap.APIServer].Args
	if n := len(args); args[n-2] != "--audit-log-maxage=30" || args[n-1] != "--v=2" {
		t.Errorf("extra flags are not appended in name order: ...%v", args[n-2:])
	}

	for _, bad := range []string{"--v", "-v", "", "v=2", "a b"} {
		m := stackedMachine(t, set)
		m.Components.Scheduler.ExtraArgs = map[string]string{bad: "1"}
		if _, err := bootstrap.ControlPlane(m, time.Now()); err == nil {
			t.Errorf("extraArgs key %q was accepted", bad)
		}
	}
}

// Issue 24, finding 1: a Cluster stored before admission refused owned
// flags (or written past it) must still not rewire a component that runs
// on the management host: no bundle is made, and the error names the flag
// and why.
func TestExtraArgsNeverRewireAComponent(t *testing.T) {
	set := newSet(t)
	for _, tc := range []struct {
		name  string
		set   func(m *bootstrap.Machine)
		flag  string
		cause string
	}{
		{"API server on every interface", func(m *bootstrap.Machine) {
			m.Components.APIServer.ExtraArgs = map[string]string{"bind-address": "0.0.0.0"}
		}, "bind-address", "address or port"},
		{"API server without authorization", func(m *bootstrap.Machine) {
			m.Components.APIServer.ExtraArgs = map[string]string{"authorization-mode": "AlwaysAllow"}
		}, "authorization-mode", "authorization"},
		{"API server on another cluster's etcd", func(m *bootstrap.Machine) {
			m.Components.APIServer.ExtraArgs = map[string]string{"etcd-servers": "https://127.0.0.1:2379"}
		}, "etcd-servers", "etcd"},
		{"controller manager signing with the management CA", func(m *bootstrap.Machine) {
			m.Components.ControllerManager.ExtraArgs = map[string]string{"cluster-signing-key-file": "/var/lib/marina/pki/ca.key"}
		}, "cluster-signing-key-file", "signing keys"},
		{"scheduler on another port", func(m *bootstrap.Machine) {
			m.Components.Scheduler.ExtraArgs = map[string]string{"secure-port": "0"}
		}, "secure-port", "address or port"},
		{"a recorded upgrade's settings", func(m *bootstrap.Machine) {
			m.SettingsByVersion = map[string]clusterv1.ControlPlaneComponents{
				"v1.38.0": {APIServer: clusterv1.ComponentSettings{ExtraArgs: map[string]string{"audit-log-path": "/etc/shadow"}}},
			}
		}, "audit-log-path", "file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := stackedMachine(t, set)
			tc.set(m)
			_, err := bootstrap.ControlPlane(m, time.Now())
			if err == nil {
				t.Fatalf("extraArgs --%s was rendered", tc.flag)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("%q is owned by marina", tc.flag)) || !strings.Contains(err.Error(), tc.cause) {
				t.Errorf("error does not name --%s as owned by marina because of %q: %v", tc.flag, tc.cause, err)
			}
		})
	}
}

// Every flag marina renders is on the owned list, so that a flag added to
// bootstrap without being listed cannot be overridden from extraArgs.
func TestEveryFlagMarinaSetsIsOwned(t *testing.T) {
	set := newSet(t)
	m := stackedMachine(t, set)
	for name, man := range mustBundle(t, m).Manifests {
		for f := range flags(t, man) {
			if _, owned := ownedflags.Owned(name, f); !owned {
				t.Errorf("%s --%s is set by marina but not owned (internal/ownedflags): add it to the list", name, f)
			}
		}
	}
}

func TestEtcdFlagsStackedAndExternal(t *testing.T) {
	set := newSet(t)
	external := &bootstrap.ExternalEtcd{Endpoints: []string{"https://127.0.7.1:2379", "https://127.0.7.2:2379"}, CACert: set.Etcd.CertPEM()}
	client, err := set.Etcd.Issue(pki.CertSpec{CommonName: "marina-external", Usage: pki.ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	external.ClientCert = client.CertPEM()
	if external.ClientKey, err = client.KeyPEM(); err != nil {
		t.Fatal(err)
	}
	peers := []bootstrap.EtcdMember{{Name: "demo-cp-a", PeerURL: "https://127.0.5.1:2380"}, {Name: "demo-cp-0", PeerURL: "https://127.0.4.2:2380"}}
	for _, tc := range []struct {
		name        string
		etcd        bootstrap.EtcdConfig
		wantEtcd    map[string]string // nil: no etcd manifest
		wantServers string
	}{{
		name: "stacked, first member",
		etcd: bootstrap.EtcdConfig{Stacked: &bootstrap.StackedEtcd{}},
		wantEtcd: map[string]string{
			"name": "demo-cp-0", "initial-cluster": "demo-cp-0=https://127.0.4.2:2380", "initial-cluster-state": "new",
			"listen-client-urls": "https://127.0.4.2:2379", "advertise-client-urls": "https://127.0.4.2:2379",
			"listen-peer-urls": "https://127.0.4.2:2380", "initial-advertise-peer-urls": "https://127.0.4.2:2380",
			"client-cert-auth": "true", "peer-client-cert-auth": "true",
		},
		wantServers: "https://127.0.4.2:2379",
	}, {
		name: "stacked, joining",
		etcd: bootstrap.EtcdConfig{Stacked: &bootstrap.StackedEtcd{InitialCluster: peers, State: bootstrap.EtcdExistingCluster}},
		wantEtcd: map[string]string{
			"initial-cluster":       "demo-cp-a=https://127.0.5.1:2380,demo-cp-0=https://127.0.4.2:2380",
			"initial-cluster-state": "existing",
		},
		wantServers: "https://127.0.4.2:2379",
	}, {
		name:        "external",
		etcd:        bootstrap.EtcdConfig{External: external},
		wantServers: "https://127.0.7.1:2379,https://127.0.7.2:2379",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			m := stackedMachine(t, set)
			m.Etcd = tc.etcd
			b := mustBundle(t, m)
			etcd, ok := b.Manifests[bootstrap.Etcd]
			if ok != (tc.wantEtcd != nil) {
				t.Fatalf("etcd manifest present = %v, want %v", ok, tc.wantEtcd != nil)
			}
			for name, want := range tc.wantEtcd {
				if got := flag(t, etcd, name); got != want {
					t.Errorf("etcd --%s = %q, want %q", name, got, want)
				}
			}
			if ok {
				if got, want := etcd.Binary, "/opt/marina/bin/etcd-"+tools.Pinned().Etcd; got != want {
					t.Errorf("etcd binary = %s, want %s", got, want)
				}
				if got := flag(t, etcd, "data-dir"); got != filepath.Join(m.Dir, "etcd") {
					t.Errorf("etcd --data-dir = %s, want the sandbox's etcd directory", got)
				}
			}
			api := b.Manifests[bootstrap.APIServer]
			if got := flag(t, api, "etcd-servers"); got != tc.wantServers {
				t.Errorf("kube-apiserver --etcd-servers = %q, want %q", got, tc.wantServers)
			}
			for name, path := range map[string]string{"etcd-cafile": bootstrap.EtcdCACert, "etcd-certfile": bootstrap.APIServerEtcdClientCert, "etcd-keyfile": bootstrap.APIServerEtcdClientKey} {
				if got := flag(t, api, name); got != filepath.Join(m.Dir, path) {
					t.Errorf("kube-apiserver --%s = %s, want %s in the sandbox", name, got, path)
				}
			}
			if tc.etcd.External != nil {
				if !bytes.Equal(b.Files[bootstrap.APIServerEtcdClientKey].Data, external.ClientKey) || !bytes.Equal(b.Files[bootstrap.EtcdCACert].Data, external.CACert) {
					t.Error("the external etcd's client key or CA is not the one given")
				}
				for _, p := range []string{bootstrap.EtcdServerCert, bootstrap.EtcdPeerKey, bootstrap.EtcdHealthcheckClientCert} {
					if _, ok := b.Files[p]; ok {
						t.Errorf("external etcd, yet the bundle has %s", p)
					}
				}
			}
		})
	}
}

func TestFlagsOfTheComponents(t *testing.T) {
	set := newSet(t)
	m := stackedMachine(t, set)
	m.Network = clusterv1.ClusterNetwork{Pods: []clusterv1.CIDR{"10.244.0.0/16"}, Services: []clusterv1.CIDR{"10.96.0.0/12"}}
	b := mustBundle(t, m)
	in := func(p string) string { return filepath.Join(m.Dir, p) }
	for _, tc := range []struct {
		component string
		want      map[string]string
	}{{
		bootstrap.APIServer, map[string]string{
			"authorization-mode": "Node,RBAC", "enable-admission-plugins": "NodeRestriction", "enable-bootstrap-token-auth": "true",
			"bind-address": "127.0.4.2", "advertise-address": "127.0.4.2", "secure-port": "6443",
			"client-ca-file": in(bootstrap.CACert), "service-account-key-file": in(bootstrap.ServiceAccountPub),
			"service-account-signing-key-file": in(bootstrap.ServiceAccountKey), "service-account-issuer": "https://kubernetes.default.svc.cluster.local",
			"service-cluster-ip-range": "10.96.0.0/12", "requestheader-client-ca-file": in(bootstrap.FrontProxyCACert),
			"requestheader-allowed-names": "front-proxy-client", "proxy-client-cert-file": in(bootstrap.FrontProxyClientCert),
			"kubelet-client-certificate": in(bootstrap.APIServerKubeletClientCert), "endpoint-reconciler-type": "none",
		},
	}, {
		bootstrap.ControllerManager, map[string]string{
			"kubeconfig": in(bootstrap.ControllerManagerKubeconfig), "use-service-account-credentials": "true",
			"cluster-signing-cert-file": in(bootstrap.CACert), "cluster-signing-key-file": in(bootstrap.CAKey),
			"root-ca-file": in(bootstrap.CACert), "service-account-private-key-file": in(bootstrap.ServiceAccountKey),
			"controllers": "*,bootstrapsigner,tokencleaner", "leader-elect": "true", "bind-address": "127.0.4.2", "secure-port": "10257",
			"allocate-node-cidrs": "true", "cluster-cidr": "10.244.0.0/16", "cluster-name": "demo",
		},
	}, {
		bootstrap.Scheduler, map[string]string{
			"kubeconfig": in(bootstrap.SchedulerKubeconfig), "leader-elect": "true", "bind-address": "127.0.4.2", "secure-port": "10259",
		},
	}} {
		man := b.Manifests[tc.component]
		if man.Version != "v1.37.2" || man.Binary != "/opt/marina/bin/"+tc.component+"-v1.37.2" {
			t.Errorf("%s runs %s as version %s", tc.component, man.Binary, man.Version)
		}
		for name, want := range tc.want {
			if got := flag(t, man, name); got != want {
				t.Errorf("%s --%s = %q, want %q", tc.component, name, got, want)
			}
		}
		for name, values := range flags(t, man) {
			if len(values) > 1 {
				t.Errorf("%s --%s is given %d times", tc.component, name, len(values))
			}
		}
	}

	// A loopback machine given an address to advertise (the local
	// provider's real workers relay from it) puts that one in the
	// kubernetes Service's endpoints, and listens on its own.
	m.AdvertiseAddress = net.ParseIP("10.231.255.254")
	api := mustBundle(t, m).Manifests[bootstrap.APIServer]
	for name, want := range map[string]string{"advertise-address": "10.231.255.254", "bind-address": "127.0.4.2", "endpoint-reconciler-type": "lease"} {
		if got := flag(t, api, name); got != want {
			t.Errorf("with an advertised address, --%s = %s, want %s", name, got, want)
		}
	}
	m.AdvertiseAddress = net.ParseIP("127.0.0.9")
	if _, err := bootstrap.ControlPlane(m, time.Now()); err == nil || !strings.Contains(err.Error(), "advertised address") {
		t.Errorf("a loopback advertised address: err = %v, want one naming the advertised address", err)
	}
	m.AdvertiseAddress = nil

	// A machine with a routable address keeps the kubernetes Service's
	// endpoints reconciled.
	m.IP = net.ParseIP("10.0.0.5")
	if got := flag(t, mustBundle(t, m).Manifests[bootstrap.APIServer], "endpoint-reconciler-type"); got != "lease" {
		t.Errorf("--endpoint-reconciler-type = %s for a routable address, want lease", got)
	}
}

func TestNoKeyMaterialInArgumentsAndPrivateFilesOnDisk(t *testing.T) {
	set := newSet(t)
	m := stackedMachine(t, set)
	b := mustBundle(t, m)
	for name, man := range b.Manifests {
		for _, a := range man.Args {
			if strings.Contains(a, "PRIVATE KEY") || strings.Contains(a, "-----BEGIN") {
				t.Errorf("an argument of %s holds PEM data", name)
			}
		}
		if len(man.Env) != 0 {
			t.Errorf("%s has environment variables %v: nothing is passed that way", name, man.Env)
		}
	}
	if err := b.Write(); err != nil {
		t.Fatal(err)
	}
	nKeys := 0
	err := filepath.WalkDir(m.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(m.Dir, path)
		switch {
		case path == m.Dir: // the caller's
		case d.IsDir() && st.Mode().Perm() != 0o700:
			t.Errorf("directory %s has mode %#o, want 0700", rel, st.Mode().Perm())
		case !d.IsDir() && st.Mode().Perm() != 0o600:
			t.Errorf("%s has mode %#o, want 0600", rel, st.Mode().Perm())
		}
		if !d.IsDir() {
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if bytes.Contains(data, []byte("PRIVATE KEY")) || bytes.Contains(data, []byte("client-key-data")) {
				nKeys++
			}
			if strings.HasSuffix(rel, ".json") && bytes.Contains(data, []byte("-----BEGIN")) {
				t.Errorf("manifest %s holds PEM data", rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// ca, sa, apiserver, kubelet client, front-proxy client, etcd server,
	// peer, healthcheck client, apiserver-etcd client, two kubeconfigs.
	if nKeys != 11 {
		t.Errorf("%d files hold a private key, want 11", nKeys)
	}
	for rel, f := range b.Files {
		got, err := os.ReadFile(filepath.Join(m.Dir, rel))
		if err != nil || !bytes.Equal(got, f.Data) {
			t.Errorf("%s on disk differs from the bundle (%v)", rel, err)
		}
	}
	for name := range b.Manifests {
		if _, err := os.Stat(manifest.Path(m.Dir, name)); err != nil {
			t.Errorf("manifest of %s not written: %v", name, err)
		}
	}
}

func TestWriteRemovesTheManifestOfAComponentTheBundleLacks(t *testing.T) {
	set := newSet(t)
	m := stackedMachine(t, set)
	if err := mustBundle(t, m).Write(); err != nil {
		t.Fatal(err)
	}
	client, _ := set.Etcd.Issue(pki.CertSpec{CommonName: "c", Usage: pki.ClientAuth})
	key, _ := client.KeyPEM()
	m.Etcd = bootstrap.EtcdConfig{External: &bootstrap.ExternalEtcd{Endpoints: []string{"https://127.0.7.1:2379"}, CACert: set.Etcd.CertPEM(), ClientCert: client.CertPEM(), ClientKey: key}}
	if err := mustBundle(t, m).Write(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(manifest.Path(m.Dir, bootstrap.Etcd)); !os.IsNotExist(err) {
		t.Errorf("the etcd manifest is still there after writing a bundle without etcd (%v)", err)
	}
}

func TestBadInputIsRefusedWithoutQuotingKeys(t *testing.T) {
	set := newSet(t)
	saKey := string(set.ServiceAccountKey)
	other, _ := pki.NewCA("other")
	otherKey, _ := other.KeyPEM()
	client, _ := set.Etcd.Issue(pki.CertSpec{CommonName: "c", Usage: pki.ClientAuth})
	for _, tc := range []struct {
		name   string
		change func(*bootstrap.Machine)
		want   string
	}{
		{"no cluster name", func(m *bootstrap.Machine) { m.ClusterName = "" }, "cluster name"},
		{"no key material", func(m *bootstrap.Machine) { m.PKI = nil }, "key material"},
		{"no service-account key", func(m *bootstrap.Machine) { s := *set; s.ServiceAccountKey = nil; m.PKI = &s }, "key material"},
		{"stacked without etcd CA", func(m *bootstrap.Machine) { s := *set; s.Etcd = nil; m.PKI = &s }, "etcd CA"},
		{"no address", func(m *bootstrap.Machine) { m.IP = nil }, "address"},
		{"endpoint without port", func(m *bootstrap.Machine) { m.Endpoint = "127.0.9.9" }, "endpoint"},
		{"bad version", func(m *bootstrap.Machine) { m.Version = "1.37/../../x" }, "version"},
		{"relative bin dir", func(m *bootstrap.Machine) { m.BinDir = "bin" }, "binaries"},
		{"relative sandbox", func(m *bootstrap.Machine) { m.Dir = "sandbox" }, "sandbox"},
		{"bad service network", func(m *bootstrap.Machine) { m.Network.Services = []clusterv1.CIDR{"10.96.0.0"} }, "service network"},
		{"no etcd", func(m *bootstrap.Machine) { m.Etcd = bootstrap.EtcdConfig{} }, "no etcd"},
		{"member not in initial cluster", func(m *bootstrap.Machine) {
			m.Etcd.Stacked.InitialCluster = []bootstrap.EtcdMember{{Name: "x", PeerURL: "https://127.0.5.1:2380"}}
		}, "does not include"},
		{"member with another peer URL", func(m *bootstrap.Machine) {
			m.Etcd.Stacked.InitialCluster = []bootstrap.EtcdMember{{Name: "demo-cp-0", PeerURL: "https://127.0.5.1:2380"}}
		}, "listens on"},
		{"bad cluster state", func(m *bootstrap.Machine) { m.Etcd.Stacked.State = "joining" }, "cluster state"},
		{"external without endpoints", func(m *bootstrap.Machine) {
			key, _ := client.KeyPEM()
			m.Etcd = bootstrap.EtcdConfig{External: &bootstrap.ExternalEtcd{CACert: set.Etcd.CertPEM(), ClientCert: client.CertPEM(), ClientKey: key}}
		}, "no endpoints"},
		{"external key not the certificate's", func(m *bootstrap.Machine) {
			m.Etcd = bootstrap.EtcdConfig{External: &bootstrap.ExternalEtcd{Endpoints: []string{"https://127.0.7.1:2379"}, CACert: set.Etcd.CertPEM(), ClientCert: client.CertPEM(), ClientKey: otherKey}}
		}, "does not match"},
		{"external CA is a key", func(m *bootstrap.Machine) {
			key, _ := client.KeyPEM()
			m.Etcd = bootstrap.EtcdConfig{External: &bootstrap.ExternalEtcd{Endpoints: []string{"https://127.0.7.1:2379"}, CACert: otherKey, ClientCert: client.CertPEM(), ClientKey: key}}
		}, "CA certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := stackedMachine(t, set)
			tc.change(m)
			_, err := bootstrap.ControlPlane(m, time.Now())
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "-----BEGIN") || strings.Contains(err.Error(), saKey) || strings.Contains(err.Error(), string(otherKey)) {
				t.Error("the error quotes key material")
			}
		})
	}
}

func TestFormattingAFileOrABundleHidesTheKeys(t *testing.T) {
	b := mustBundle(t, stackedMachine(t, newSet(t)))
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
		if out := fmt.Sprintf(verb, b); strings.Contains(out, "PRIVATE") || strings.Contains(out, "2d2d2d2d2d") {
			t.Errorf("%s of a Bundle shows key material", verb)
		}
	}
}

// An in-place upgrade step (M12) moves one component: the override changes
// that component's binary and version and leaves every other manifest as
// it was, so the supervisor restarts that one alone.
func TestAnOverrideMovesOneComponentOnly(t *testing.T) {
	set := newSet(t)
	m := stackedMachine(t, set)
	before := mustBundle(t, m)
	m.Overrides = clusterv1.ComponentVersions{APIServer: "v1.38.0"}
	after := mustBundle(t, m)
	api := after.Manifests[bootstrap.APIServer]
	if api.Version != "v1.38.0" || filepath.Base(api.Binary) != "kube-apiserver-v1.38.0" {
		t.Errorf("kube-apiserver runs %s from %s, want v1.38.0 from kube-apiserver-v1.38.0", api.Version, api.Binary)
	}
	for _, c := range []string{bootstrap.ControllerManager, bootstrap.Scheduler, bootstrap.Etcd} {
		if !reflect.DeepEqual(before.Manifests[c], after.Manifests[c]) {
			t.Errorf("the manifest of %s changed with kube-apiserver's override:\n%+v\n%+v", c, before.Manifests[c], after.Manifests[c])
		}
	}
	if !reflect.DeepEqual(before.Manifests[bootstrap.APIServer].Args, api.Args) {
		t.Errorf("kube-apiserver's arguments changed with its version")
	}

	m.Overrides = clusterv1.ComponentVersions{Scheduler: "1.38"}
	if _, err := bootstrap.ControlPlane(m, time.Now()); err == nil || !strings.Contains(err.Error(), `"1.38"`) {
		t.Errorf("a malformed override was not refused by name: %v", err)
	}
}

// Settings change with the version: a component moved to a version an
// upgrade recorded settings for runs them, one at a version without
// recorded settings keeps those the machine was made with, so a
// rolled-back step gets its old flags back and a second upgrade leaves the
// first one's settings alone.
func TestSettingsFollowTheVersion(t *testing.T) {
	set := newSet(t)
	m := stackedMachine(t, set)
	m.Components.APIServer.ExtraArgs = map[string]string{"v": "1"}
	m.SettingsByVersion = map[string]clusterv1.ControlPlaneComponents{
		"v1.38.0": {APIServer: clusterv1.ComponentSettings{ExtraArgs: map[string]string{"v": "4"}}},
		"v1.39.0": {APIServer: clusterv1.ComponentSettings{ExtraArgs: map[string]string{"v": "5"}}},
	}
	m.Overrides = clusterv1.ComponentVersions{APIServer: "v1.38.0"}
	b := mustBundle(t, m)
	if got := flag(t, b.Manifests[bootstrap.APIServer], "v"); got != "4" {
		t.Errorf("kube-apiserver at v1.38.0 runs --v=%q, want that version's 4", got)
	}
	if got := flags(t, b.Manifests[bootstrap.Scheduler])["v"]; len(got) != 0 {
		t.Errorf("the kube-scheduler at its first version runs --v=%q, want its own settings (none)", got)
	}
	m.Overrides = clusterv1.ComponentVersions{}
	if got := flag(t, mustBundle(t, m).Manifests[bootstrap.APIServer], "v"); got != "1" {
		t.Errorf("kube-apiserver back at its first version runs --v=%q, want its first settings' 1", got)
	}
	m.SettingsByVersion["v1.39.0"] = clusterv1.ControlPlaneComponents{Scheduler: clusterv1.ComponentSettings{ExtraArgs: map[string]string{"--bad": "1"}}}
	if _, err := bootstrap.ControlPlane(m, time.Now()); err == nil {
		t.Errorf("a bad flag name in recorded settings was accepted")
	}
}

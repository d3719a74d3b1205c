package nodeagent

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/etcdadmin"
	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/nodeagent/components"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/internal/pki"
)

// controlPlane is what a control-plane machine's agent runs beside the
// node: the components, from the bundle it makes out of the control
// plane's document.
type controlPlane struct {
	supervisor *components.Supervisor
	// done is closed when the supervisor has stopped every component.
	done chan struct{}
	// stacked: an etcd member runs here.
	stacked bool
	log     klog.Logger

	// viaEndpoint is the node's client through the cluster's endpoint: it
	// reaches the other API servers when this machine's own one is down
	// (an upgrade step whose new version cannot start, and its rollback).
	viaEndpoint kubernetes.Interface
	// boot names the node whose client certificate is renewed too.
	boot *sandbox.Bootstrap

	// mu guards machine: what the manifests were last made from.
	mu      sync.Mutex
	machine *bootstrap.Machine
}

// readControlPlane reads the control plane's document of the sandbox; nil
// on a worker.
func readControlPlane(dir string) (*bootstrap.Config, error) {
	data, err := os.ReadFile(filepath.Join(dir, sandbox.ControlPlaneFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the control plane's document: %w", err)
	}
	return bootstrap.DecodeConfig(data)
}

// startControlPlane joins the etcd cluster if this machine is a new
// member, writes the machine's certificates, kubeconfigs and component
// manifests, and starts the supervisor. It returns the node's client for
// its own API server, authenticated as system:node:<name> with a
// certificate it issues from the cluster CA, as kubeadm does for a
// control-plane kubelet, so that the Node authorizer and NodeRestriction
// hold for it.
func startControlPlane(ctx context.Context, dir string, b *sandbox.Bootstrap, cfg *bootstrap.Config) (*controlPlane, kubernetes.Interface, error) {
	log := klog.FromContext(ctx)
	set, err := cfg.PKI.Set()
	if err != nil {
		return nil, nil, fmt.Errorf("the control plane's key material: %w", err)
	}
	ip := net.ParseIP(b.Address)
	if ip == nil {
		return nil, nil, fmt.Errorf("the machine's address %q is not an IP address", b.Address)
	}
	if b.BinDir == "" {
		return nil, nil, errors.New("the sandbox names no directory of component binaries (binDir)")
	}
	etcd, promote, err := etcdConfig(ctx, dir, b, cfg, set)
	if err != nil {
		return nil, nil, err
	}
	versions, err := sandbox.ReadVersions(dir)
	if err != nil {
		return nil, nil, err
	}
	machine := &bootstrap.Machine{
		ClusterName:       cfg.ClusterName,
		PKI:               set,
		Name:              b.NodeName,
		IP:                ip,
		AdvertiseAddress:  net.ParseIP(b.AdvertiseAddress), // nil when empty
		Endpoint:          cfg.Endpoint,
		Network:           cfg.Network,
		Version:           cfg.Version,
		EtcdVersion:       cfg.EtcdVersion,
		BinDir:            b.BinDir,
		Dir:               dir,
		Components:        cfg.Components,
		Etcd:              etcd,
		Overrides:         versions.ControlPlane,
		SettingsByVersion: versions.Settings,
		CertValidity:      cfg.CertValidity,
	}
	bundle, err := bootstrap.ControlPlane(machine, time.Now())
	if err != nil {
		return nil, nil, fmt.Errorf("making the control-plane machine's files: %w", err)
	}
	if err := bundle.Write(); err != nil {
		return nil, nil, fmt.Errorf("writing the control-plane machine's files: %w", err)
	}
	// A restart keeps what an upgrade set: the joining etcd's initial
	// cluster is not needed again, its data exists by then.
	machine.Etcd = bootstrap.EtcdConfig{Stacked: etcd.Stacked, External: etcd.External}
	cp := &controlPlane{supervisor: components.New(dir, components.Options{}), done: make(chan struct{}), stacked: etcd.Stacked != nil,
		log: log, machine: machine, boot: b}
	go func() {
		defer close(cp.done)
		if err := cp.supervisor.Run(ctx); err != nil {
			log.Error(err, "Component supervisor failed")
		}
	}()
	if promote != nil {
		go promote(ctx)
	}
	if err := writeNodeCertificate(dir, b, set.CA, cfg.CertValidity); err != nil {
		return nil, nil, err
	}
	go cp.keepCertificates(ctx, dir)
	cs, viaEndpoint, err := nodeClients(dir, b, set.CA, cfg.Endpoint)
	if err != nil {
		return nil, nil, err
	}
	cp.viaEndpoint = viaEndpoint
	log.Info("Started the control-plane components", "version", cfg.Version, "stackedEtcd", cp.stacked)
	return cp, cs, nil
}

// etcdConfig is this machine's place in the cluster's etcd. A new stacked
// member that is to join adds itself as a learner through the running
// members before etcd starts (etcd's member add), unless it is a member
// already (a crash after the add: the add is keyed by its peer URL); the
// returned promote, run once etcd runs, makes it a voter as soon as it has
// caught up. A restart (its data exists) joins nothing, but still promotes
// a learner a crash left.
func etcdConfig(ctx context.Context, dir string, b *sandbox.Bootstrap, cfg *bootstrap.Config, set *clusterpki.Set) (bootstrap.EtcdConfig, func(context.Context), error) {
	if x := cfg.Etcd.External; x != nil {
		return bootstrap.EtcdConfig{External: x}, nil, nil
	}
	join := cfg.Etcd.Stacked.Join
	if len(join) == 0 {
		return bootstrap.EtcdConfig{Stacked: &bootstrap.StackedEtcd{}}, nil, nil
	}
	pair, err := set.Etcd.Issue(pki.CertSpec{CommonName: "marina-node-agent:" + b.NodeName, Usage: pki.ClientAuth})
	if err != nil {
		return bootstrap.EtcdConfig{}, nil, fmt.Errorf("issuing an etcd client certificate: %w", err)
	}
	key, err := pair.KeyPEM()
	if err != nil {
		return bootstrap.EtcdConfig{}, nil, err
	}
	access := etcdadmin.Config{Endpoints: join, CA: set.Etcd.CertPEM(), Cert: pair.CertPEM(), Key: key}
	peerURL := "https://" + net.JoinHostPort(b.Address, strconv.Itoa(bootstrap.DefaultEtcdPeerPort))
	promote := func(ctx context.Context) { promoteSelf(ctx, access, peerURL) }
	if etcdDataExists(dir) {
		return bootstrap.EtcdConfig{Stacked: &bootstrap.StackedEtcd{}}, promote, nil
	}
	var members []etcdadmin.Member
	var self etcdadmin.Member
	err = retryUntil(ctx, 2*time.Minute, func(ctx context.Context) error {
		c, err := etcdadmin.New(ctx, access)
		if err != nil {
			return err
		}
		defer c.Close()
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		members, self, err = c.Add(actx, peerURL)
		return err
	})
	if err != nil {
		return bootstrap.EtcdConfig{}, nil, fmt.Errorf("joining the etcd cluster through %v: %w", join, err)
	}
	klog.FromContext(ctx).Info("Added this machine's etcd member", "member", fmt.Sprintf("%x", self.ID), "members", len(members))
	initial := make([]bootstrap.EtcdMember, 0, len(members))
	for _, m := range members {
		name := m.Name
		switch {
		case m.ID == self.ID:
			name = b.NodeName
		case name == "":
			name = fmt.Sprintf("%x", m.ID) // added elsewhere, not started yet
		}
		for _, u := range m.PeerURLs {
			initial = append(initial, bootstrap.EtcdMember{Name: name, PeerURL: u})
		}
	}
	return bootstrap.EtcdConfig{Stacked: &bootstrap.StackedEtcd{InitialCluster: initial, State: bootstrap.EtcdExistingCluster}}, promote, nil
}

// promoteSelf makes this machine's member a voter once it has caught up
// (etcd refuses before), retrying each second until it votes or ctx ends.
func promoteSelf(ctx context.Context, access etcdadmin.Config, peerURL string) {
	log := klog.FromContext(ctx)
	for {
		done, err := tryPromote(ctx, access, peerURL)
		if done {
			log.Info("This machine's etcd member votes")
			return
		}
		if err != nil {
			log.V(2).Info("Etcd member not promoted yet", "reason", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func tryPromote(ctx context.Context, access etcdadmin.Config, peerURL string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := etcdadmin.New(ctx, access)
	if err != nil {
		return false, err
	}
	defer c.Close()
	members, err := c.List(ctx)
	if err != nil {
		return false, err
	}
	for _, m := range members {
		if slices.Contains(m.PeerURLs, peerURL) {
			if !m.Learner {
				return true, nil
			}
			err := c.Promote(ctx, m.ID)
			return err == nil, err
		}
	}
	return false, fmt.Errorf("no etcd member has peer URL %s", peerURL)
}

// etcdDataExists: a member ran here before; etcd ignores the initial
// cluster then.
func etcdDataExists(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, bootstrap.EtcdDataDir, "member"))
	return err == nil
}

// retryUntil calls f until it succeeds, ctx ends or timeout passes.
func retryUntil(ctx context.Context, timeout time.Duration, f func(context.Context) error) error {
	deadline := time.Now().Add(timeout)
	delay := 500 * time.Millisecond
	for {
		err := f(ctx)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		klog.FromContext(ctx).Error(err, "Retrying", "after", delay)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 10*time.Second)
	}
}

// writeNodeCertificate issues the node's client certificate from the
// cluster CA, valid as long as the machine's other certificates
// (spec.controlPlane.certificateValidity), and writes it to the sandbox,
// where the node's clients read it (nodeClients). keepCertificates renews
// it with the others.
func writeNodeCertificate(dir string, b *sandbox.Bootstrap, ca *pki.KeyPair, validity time.Duration) error {
	pair, err := ca.IssueFor(pki.CertSpec{CommonName: "system:node:" + b.NodeName, Organizations: []string{"system:nodes"}, Usage: pki.ClientAuth}, time.Now(), validity)
	if err != nil {
		return fmt.Errorf("issuing the node's client certificate: %w", err)
	}
	key, err := pair.KeyPEM()
	if err != nil {
		return err
	}
	return writeNodeCredential(dir, pair.CertPEM(), key)
}

// writeNodeCredential writes the node's certificate and key, the key
// first: a certificate without its key is useless.
func writeNodeCredential(dir string, certPEM, keyPEM []byte) error {
	if err := files.WriteAtomic(filepath.Join(dir, sandbox.NodeKeyFile), keyPEM, 0o600); err != nil {
		return fmt.Errorf("writing the node's key: %w", err)
	}
	if err := files.WriteAtomic(filepath.Join(dir, sandbox.NodeCertFile), certPEM, 0o600); err != nil {
		return fmt.Errorf("writing the node's certificate: %w", err)
	}
	return nil
}

// nodeClients reach, as the node, the machine's own API server and the
// cluster's endpoint (host:port), with the certificate in the sandbox.
// They read the files (client-go reloads them for every new connection,
// and closes the old ones when they change), so a renewed certificate is
// used without a restart of the agent.
func nodeClients(dir string, b *sandbox.Bootstrap, ca *pki.KeyPair, endpoint string) (local, viaEndpoint kubernetes.Interface, err error) {
	client := func(host string) (kubernetes.Interface, error) {
		cs, err := kubernetes.NewForConfig(&rest.Config{
			Host: "https://" + host,
			TLSClientConfig: rest.TLSClientConfig{CAData: ca.CertPEM(),
				CertFile: filepath.Join(dir, sandbox.NodeCertFile), KeyFile: filepath.Join(dir, sandbox.NodeKeyFile)},
			UserAgent: "marina-node-agent/" + b.NodeName,
			QPS:       5,
			Burst:     10,
		})
		if err != nil {
			return nil, fmt.Errorf("building the node's client for %s: %w", host, err)
		}
		return cs, nil
	}
	if local, err = client(net.JoinHostPort(b.Address, strconv.Itoa(bootstrap.DefaultAPIServerPort))); err != nil {
		return nil, nil, err
	}
	if viaEndpoint, err = client(endpoint); err != nil {
		return nil, nil, err
	}
	return local, viaEndpoint, nil
}

// nodeSettableLabel reports whether NodeRestriction lets a node set the
// label on its own Node: labels outside the kubernetes.io and k8s.io
// domains, and the few kubelet labels inside them. The others (the
// node-role label above all) are added by the machine controller.
func nodeSettableLabel(key string) bool {
	prefix, _, found := strings.Cut(key, "/")
	if !found {
		return true
	}
	inK8s := func(domain string) bool { return prefix == domain || strings.HasSuffix(prefix, "."+domain) }
	if !inK8s("kubernetes.io") && !inK8s("k8s.io") {
		return true
	}
	switch key {
	case "kubernetes.io/hostname", "kubernetes.io/arch", "kubernetes.io/os",
		"node.kubernetes.io/instance-type", "topology.kubernetes.io/region", "topology.kubernetes.io/zone":
		return true
	}
	return inK8s("kubelet.kubernetes.io") || inK8s("node.kubernetes.io")
}

// componentVersions are the versions this machine's components run: the
// API server's from its own /version, the others' from the manifests the
// supervisor runs them from (the binary named by that version). It fails
// when the API server did not say: a report without it would read as an
// unknown version.
func (a *agent) componentVersions() (clusterv1.ComponentVersions, error) {
	var v clusterv1.ComponentVersions
	for _, st := range a.cp.supervisor.Status() {
		if st.State != components.Running {
			continue
		}
		switch st.Name {
		case bootstrap.ControllerManager:
			v.ControllerManager = st.Version
		case bootstrap.Scheduler:
			v.Scheduler = st.Version
		case bootstrap.Etcd:
			v.Etcd = st.Version
		}
	}
	info, err := a.cs.Discovery().ServerVersion()
	if err != nil {
		return v, fmt.Errorf("reading the API server's version: %w", err)
	}
	v.APIServer = info.GitVersion
	return v, nil
}

// keepVersions keeps the control-plane versions annotation of the Node
// current (clusterv1.ControlPlaneVersionsAnnotation). Until the first
// report it tries every second: a new API server accepts the node's
// registration (Node authorizer) a few seconds before it lets a node read
// /version (RBAC, once its bootstrap roles exist), and the machine
// controller waits for the report.
func (a *agent) keepVersions(ctx context.Context, node nodeRef) {
	last := ""
	update := func(ctx context.Context) error {
		v, err := a.componentVersions()
		if err != nil {
			return err
		}
		data, err := json.Marshal(v)
		if err != nil || string(data) == last {
			return err
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"annotations": map[string]string{clusterv1.ControlPlaneVersionsAnnotation: string(data)},
		}})
		if err != nil {
			return err
		}
		if _, err := a.cs.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, patch, metav1PatchOptions); err != nil {
			return fmt.Errorf("patching node %s: %w", node.Name, err)
		}
		last = string(data)
		return nil
	}
	period := a.t.versionsCheck
	if period <= 0 {
		period = defaultTiming.versionsCheck
	}
	for {
		err := update(ctx)
		if err == nil {
			break
		}
		a.log.V(2).Info("Control-plane versions not reported yet", "reason", err.Error())
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(time.Second, period)):
		}
	}
	every(ctx, period, 0.1, func(ctx context.Context) {
		if err := update(ctx); err != nil {
			a.log.Error(err, "Reporting the control-plane versions failed")
		}
	})
}

var metav1PatchOptions = metav1.PatchOptions{FieldManager: fieldManager}

// keepCertificates renews the machine's certificates before they end
// (renewalDue) and restarts the components that read theirs only when
// they start: kube-controller-manager and kube-scheduler hold their client
// certificates in their kubeconfigs, and kube-apiserver its clients' to
// etcd and the kubelets. etcd is not restarted: it reads its certificates
// again for every new connection, and restarting every member of a
// cluster at once would cost the quorum. It sleeps until the renewal is
// due, and at most an hour, so a clock that jumps is noticed (issue 22,
// finding 7).
func (cp *controlPlane) keepCertificates(ctx context.Context, dir string) {
	cp.mu.Lock()
	caEnd := cp.machine.PKI.CA.Cert.NotAfter
	cp.mu.Unlock()
	// Drawn once per agent: machines started together (a cluster made at
	// once, a host rebooted) renew at different times.
	jitter := rand.Float64()
	toldCAEnds := false
	for {
		wait := time.Hour
		cert, err := readCertificate(filepath.Join(dir, bootstrap.APIServerCert))
		if err != nil {
			cp.log.Error(err, "Reading the API server's certificate failed; looking again in a minute")
			wait = time.Minute
		} else {
			due, worthIt := renewalDue(cert, caEnd, jitter)
			switch {
			case !worthIt:
				if !toldCAEnds {
					cp.log.Info("Not renewing the machine's certificates: a new one would end no later, with the cluster CA", "caNotAfter", caEnd)
					toldCAEnds = true
				}
			case !time.Now().Before(due):
				if err := cp.renewCertificates(); err != nil {
					cp.log.Error(err, "Renewing the machine's certificates failed; trying again in a minute", "notAfter", cert.NotAfter)
					wait = time.Minute
				} else {
					wait = time.Second
				}
			default:
				wait = min(wait, time.Until(due))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(wait, time.Second)):
		}
	}
}

// renewalDue is when a machine renews a certificate: once its renewal
// margin has begun (pki.RenewalMargin), later by jitter (0 to 1) times a
// third of the margin. worthIt is false when a new certificate would end
// no later than this one, because the cluster CA ends first: renewing
// then would only restart the components, ever more often as the CA's end
// nears (the cluster reports CAExpiringSoon instead).
func renewalDue(cert *x509.Certificate, caEnd time.Time, jitter float64) (due time.Time, worthIt bool) {
	margin := pki.RenewalMargin(cert)
	due = cert.NotAfter.Add(-margin).Add(time.Duration(jitter * float64(margin) / 3))
	return due, caEnd.After(cert.NotAfter.Add(time.Minute))
}

// renewCertificates writes the machine's files anew, certificates issued
// now, and restarts the components that read theirs only at start.
func (cp *controlPlane) renewCertificates() error {
	cp.mu.Lock()
	bundle, err := bootstrap.ControlPlane(cp.machine, time.Now())
	if err == nil {
		err = bundle.Write()
	}
	if err == nil {
		err = writeNodeCertificate(cp.machine.Dir, cp.boot, cp.machine.PKI.CA, cp.machine.CertValidity)
	}
	cp.mu.Unlock()
	if err != nil {
		return fmt.Errorf("writing renewed certificates: %w", err)
	}
	cp.supervisor.Restart("certificates renewed", bootstrap.APIServer, bootstrap.ControllerManager, bootstrap.Scheduler)
	cp.log.Info("Renewed the machine's certificates and restarted its components")
	return nil
}

// readCertificate reads the first certificate of a PEM file.
func readCertificate(path string) (*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := readCertificatePEM(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// readCertificatePEM parses the first certificate of PEM data.
func readCertificatePEM(data []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

package etcdadmin_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/etcdadmin"
	"marina.dev/marina/internal/manifest"
	"marina.dev/marina/internal/nodeagent/components"
	"marina.dev/marina/internal/pki"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/tools"
)

// TestAddIsKeyedByPeerURL runs one etcd member and adds a second, never
// started, twice: the second add finds the first's learner by its peer URL
// (what a joining machine that crashed after its add does), and removing it
// twice is no error.
func TestAddIsKeyedByPeerURL(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd")
	}
	c := startEtcd(t)
	ctx := t.Context()
	peerURL := "https://127.0.0.1:" + strconv.Itoa(testenv.FreePorts(t, 1))

	members, added, err := c.Add(ctx, peerURL)
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 2 || !added.Learner || added.ID == 0 {
		t.Fatalf("after the add: members %+v, added %+v; want 2 members, the added one a learner", members, added)
	}
	members, again, err := c.Add(ctx, peerURL)
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 2 || again.ID != added.ID {
		t.Fatalf("after adding again: members %+v, member %+v; want the same 2 members and member %x", members, again, added.ID)
	}

	members, err = c.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		if wantHealthy := m.ID != added.ID; m.Healthy != wantHealthy {
			t.Errorf("member %x (%v) healthy %t, want %t", m.ID, m.PeerURLs, m.Healthy, wantHealthy)
		}
	}

	for range 2 {
		if err := c.Remove(ctx, added.ID); err != nil {
			t.Fatal(err)
		}
	}
	members, err = c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 1 {
		t.Errorf("after the remove: members %+v, want the one running", members)
	}
}

// startEtcd starts a one-member etcd from a control-plane bundle with
// nothing but etcd in it and returns a client for it.
func startEtcd(t *testing.T) *etcdadmin.Client {
	t.Helper()
	binDir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(binDir, "etcd-"+tools.Pinned().Etcd)); err != nil {
		t.Skipf("etcd is not built (run `make setup`): %v", err)
	}
	base := testenv.FreePorts(t, 5)
	set := newSet(t)
	m := &bootstrap.Machine{
		ClusterName: "etcdadmin-test", PKI: set, Name: "etcdadmin-test-0", IP: net.IPv4(127, 0, 0, 1),
		Ports:    bootstrap.Ports{APIServer: base, EtcdClient: base + 1, EtcdPeer: base + 2, ControllerManager: base + 3, Scheduler: base + 4},
		Endpoint: net.JoinHostPort("127.0.0.1", strconv.Itoa(base)),
		Version:  tools.Pinned().NewestKube(), BinDir: binDir, Dir: t.TempDir(),
		Etcd: bootstrap.EtcdConfig{Stacked: &bootstrap.StackedEtcd{}},
	}
	b, err := bootstrap.ControlPlane(m, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Write(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{bootstrap.APIServer, bootstrap.ControllerManager, bootstrap.Scheduler} {
		if err := manifest.Remove(m.Dir, name); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = components.New(m.Dir, components.Options{}).Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })

	pair, err := set.Etcd.Issue(pki.CertSpec{CommonName: "etcdadmin-test", Usage: pki.ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	key, err := pair.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(m.Ports.EtcdClient))
	c, err := etcdadmin.New(t.Context(), etcdadmin.Config{Endpoints: []string{url}, CA: set.Etcd.CertPEM(), Cert: pair.CertPEM(), Key: key, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	testenv.Eventually(t, 30*time.Second, "etcd answers", func() error {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		members, err := c.Members(ctx)
		if err != nil {
			return err
		}
		if len(members) != 1 || !members[0].Healthy {
			return fmt.Errorf("members %+v, want one healthy", members)
		}
		return nil
	})
	return c
}

// newSet makes a cluster's key material in memory.
func newSet(t *testing.T) *clusterpki.Set {
	t.Helper()
	ca := func(name string) *pki.KeyPair {
		kp, err := pki.NewCA(name)
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	return &clusterpki.Set{
		CA: ca("kubernetes"), Etcd: ca("etcd-ca"), FrontProxy: ca("front-proxy-ca"),
		ServiceAccountKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
		ServiceAccountPub: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
	}
}

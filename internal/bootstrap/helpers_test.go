package bootstrap_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/manifest"
	"marina.dev/marina/internal/pki"
)

// newSet makes a cluster's key material in memory, as clusterpki.Ensure
// would keep it in Secrets.
func newSet(t testing.TB) *clusterpki.Set {
	t.Helper()
	ca, err := pki.NewCA("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	etcd, err := pki.NewCA("etcd-ca")
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := pki.NewCA("front-proxy-ca")
	if err != nil {
		t.Fatal(err)
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
		CA:                ca,
		Etcd:              etcd,
		FrontProxy:        proxy,
		ServiceAccountKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
		ServiceAccountPub: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
	}
}

// stackedMachine is one control-plane machine of a stacked-etcd cluster,
// alone, with its sandbox in a temporary directory.
func stackedMachine(t testing.TB, set *clusterpki.Set) *bootstrap.Machine {
	t.Helper()
	return &bootstrap.Machine{
		ClusterName: "demo",
		PKI:         set,
		Name:        "demo-cp-0",
		IP:          net.ParseIP("127.0.4.2"),
		Endpoint:    "127.0.9.9:7443",
		Version:     "v1.37.2",
		BinDir:      "/opt/marina/bin",
		Dir:         t.TempDir(),
		Etcd:        bootstrap.EtcdConfig{Stacked: &bootstrap.StackedEtcd{}},
	}
}

func mustBundle(t testing.TB, m *bootstrap.Machine) *bootstrap.Bundle {
	t.Helper()
	b, err := bootstrap.ControlPlane(m, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// cert parses the certificate at path in b.
func cert(t testing.TB, b *bootstrap.Bundle, path string) *x509.Certificate {
	t.Helper()
	f, ok := b.Files[path]
	if !ok {
		t.Fatalf("the bundle has no %s", path)
	}
	block, _ := pem.Decode(f.Data)
	if block == nil {
		t.Fatalf("%s holds no PEM block", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

// flags returns a manifest's arguments as name → values, every value of a
// repeated flag kept.
func flags(t testing.TB, m *manifest.Manifest) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, a := range m.Args {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok || !strings.HasPrefix(a, "--") {
			t.Fatalf("argument %q is not --name=value", a)
		}
		out[name] = append(out[name], value)
	}
	return out
}

// flag returns the one value of flag name, failing the test when it is
// missing or repeated.
func flag(t testing.TB, m *manifest.Manifest, name string) string {
	t.Helper()
	v := flags(t, m)[name]
	if len(v) != 1 {
		t.Fatalf("--%s is given %d times in %s, want once", name, len(v), m.Binary)
	}
	return v[0]
}

// proc is a process, told apart from a later one with the same PID by its
// start time.
type proc struct {
	pid   int
	start string // field 22 of /proc/<pid>/stat
}

// procStat returns a process's state and start time from /proc.
func procStat(pid int) (state, start string, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", "", err
	}
	// The command name, in parentheses, may hold spaces: count after it.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 {
		return "", "", fmt.Errorf("/proc/%d/stat is short", pid)
	}
	return f[0], f[19], nil
}

func procOf(t testing.TB, pid int) proc {
	t.Helper()
	_, start, err := procStat(pid)
	if err != nil {
		t.Fatalf("process %d: %v", pid, err)
	}
	return proc{pid: pid, start: start}
}

// alive reports whether p still runs; a zombie has ended.
func (p proc) alive() bool {
	state, start, err := procStat(p.pid)
	return err == nil && start == p.start && state != "Z"
}

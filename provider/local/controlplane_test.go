package local

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/etcdadmin"
	"marina.dev/marina/internal/manifest"
	"marina.dev/marina/internal/nodeagent/components"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/internal/pki"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider"
	"marina.dev/marina/tools"
)

// The role label and taint a control-plane machine asks for, as the
// control plane sets them.
const controlPlaneRoleKey = "node-role.kubernetes.io/control-plane"

// TestControlPlaneMachinesRunAControlPlane makes two control-plane machines
// through the provider, with the real components: the first starts a new
// etcd and an API server and registers its own Node as system:node,
// reporting what runs; the second joins the first's etcd through its
// client URL; deleting them leaves no process behind.
func TestControlPlaneMachinesRunAControlPlane(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two control planes")
	}
	binDir := controlPlaneBinaries(t)
	version, etcdVersion := tools.Pinned().NewestKube(), tools.Pinned().Etcd
	began := time.Now()
	ctx := t.Context()

	set := newClusterPKI(t)
	p := newControlPlaneProvider(t, binDir)

	// The endpoint only names the API servers' certificates here: nothing
	// dials it.
	first := controlPlaneRequest(t, "cp-0", set, version, nil)
	inst0, err := p.Create(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	dir0 := p.sandboxDir(first.UID)
	dumpOnFailure(t, dir0)
	checkSandbox(t, dir0, binDir)
	addr0 := inst0.Addresses[0].Address
	admin0 := adminClientFor(t, set, addr0)

	eventually(t, 60*time.Second, "the first machine's API server is ready", func() error { return ready(ctx, admin0) })
	t.Logf("first API server ready after %s", time.Since(began).Round(10*time.Millisecond))

	want := clusterv1.ComponentVersions{APIServer: version, ControllerManager: version, Scheduler: version, Etcd: etcdVersion}
	eventually(t, 30*time.Second, "the first machine's Node reports what runs", func() error {
		return checkControlPlaneNode(ctx, admin0, first, inst0, want)
	})
	t.Logf("first Node registered and reported its versions after %s", time.Since(began).Round(10*time.Millisecond))

	clientURL0 := "https://" + net.JoinHostPort(addr0, strconv.Itoa(bootstrap.DefaultEtcdClientPort))
	second := controlPlaneRequest(t, "cp-1", set, version, []string{clientURL0})
	inst1, err := p.Create(ctx, second)
	if err != nil {
		t.Fatal(err)
	}
	dir1 := p.sandboxDir(second.UID)
	dumpOnFailure(t, dir1)
	addr1 := inst1.Addresses[0].Address
	admin1 := adminClientFor(t, set, addr1)
	peerURL1 := "https://" + net.JoinHostPort(addr1, strconv.Itoa(bootstrap.DefaultEtcdPeerPort))

	etcd := etcdAdmin(t, set, clientURL0)
	eventually(t, 60*time.Second, "two healthy voting etcd members and the second API server ready", func() error {
		members, err := etcd.Members(ctx)
		if err != nil {
			return err
		}
		if len(members) != 2 {
			return fmt.Errorf("%d etcd members, want 2: %+v", len(members), members)
		}
		for _, m := range members {
			if !m.Healthy {
				return fmt.Errorf("etcd member %q (%v) is not a healthy voter (learner %t)", m.Name, m.PeerURLs, m.Learner)
			}
		}
		return ready(ctx, admin1)
	})
	t.Logf("second machine joined etcd and its API server is ready after %s", time.Since(began).Round(10*time.Millisecond))
	eventually(t, 30*time.Second, "the second machine's Node reports what runs", func() error {
		return checkControlPlaneNode(ctx, admin1, second, inst1, want)
	})

	// A retry of the join (an agent that crashed after adding its member)
	// finds the member by its peer URL and adds none.
	members, self, err := etcd.Add(ctx, peerURL1)
	if err != nil {
		t.Fatalf("adding the second machine's member again: %v", err)
	}
	if len(members) != 2 || self.Name != "cp-1" || self.Learner {
		t.Errorf("adding again: members %+v, self %+v; want the 2 members and cp-1's voting member", members, self)
	}

	// Issue 25: a power cut takes both machines, and every process of
	// theirs, at once. Each Start returns as soon as its agent runs, not
	// once etcd has a quorum, which neither member has until the other is
	// started too; then both members vote again, the same two, and what
	// was written before the cut is there.
	kept := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: "default"}, Data: map[string]string{"k": "v"}}
	if _, err := admin0.CoreV1().ConfigMaps("default").Create(ctx, kept, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	membersBefore, err := etcd.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{dir0, dir1} {
		for _, pid := range processesMentioning(dir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	eventually(t, 30*time.Second, "both machines stopped, nothing of them running", func() error {
		for _, req := range []*provider.Request{first, second} {
			if inst, err := p.Get(ctx, req.UID); err != nil || inst.State != provider.InstanceStopped {
				return fmt.Errorf("%s: %v, %v", req.Name, inst, err)
			}
		}
		if pids := append(processesMentioning(dir0), processesMentioning(dir1)...); len(pids) > 0 {
			return fmt.Errorf("processes %v still run", pids)
		}
		return nil
	})
	for _, req := range []*provider.Request{first, second} {
		starting := time.Now()
		if inst, err := p.Start(ctx, req.UID, nil); err != nil || inst.State != provider.InstanceRunning {
			t.Fatalf("Start %s = %v, %v", req.Name, inst, err)
		}
		if took := time.Since(starting); took > 10*time.Second {
			t.Errorf("Start %s took %s: it waits for something it does not need", req.Name, took)
		}
	}
	eventually(t, 2*time.Minute, "the same two etcd members voting and both API servers ready after the power cut", func() error {
		members, err := etcd.Members(ctx)
		if err != nil {
			return err
		}
		if len(members) != len(membersBefore) {
			return fmt.Errorf("%d etcd members, want the %d from before", len(members), len(membersBefore))
		}
		for _, m := range members {
			if !slices.ContainsFunc(membersBefore, func(b etcdadmin.Member) bool { return b.ID == m.ID }) || !m.Healthy {
				return fmt.Errorf("member %x (healthy %t), want one of those from before, healthy", m.ID, m.Healthy)
			}
		}
		if err := ready(ctx, admin0); err != nil {
			return err
		}
		return ready(ctx, admin1)
	})
	if got, err := admin1.CoreV1().ConfigMaps("default").Get(ctx, kept.Name, metav1.GetOptions{}); err != nil || got.Data["k"] != "v" {
		t.Errorf("the ConfigMap written before the power cut: %v, %v", got, err)
	}
	t.Logf("both machines back after the power cut, %s into the test", time.Since(began).Round(10*time.Millisecond))

	running := append(componentProcesses(t, dir0), componentProcesses(t, dir1)...)
	if len(running) != 8 {
		t.Errorf("%d components run, want 4 on each machine", len(running))
	}
	for _, dir := range []string{dir0, dir1} {
		checkNoKeysLogged(t, dir)
	}
	for _, req := range []*provider.Request{second, first} {
		deleting := time.Now()
		if err := p.Delete(ctx, req.UID); err != nil {
			t.Fatalf("deleting %s: %v", req.Name, err)
		}
		t.Logf("deleting %s took %s", req.Name, time.Since(deleting).Round(10*time.Millisecond))
	}
	for _, pr := range running {
		if pr.alive() {
			t.Errorf("%s (pid %d) still runs after its machine was deleted", pr.name, pr.pid)
		}
	}
	for _, dir := range []string{dir0, dir1} {
		if pids := processesMentioning(dir); len(pids) > 0 {
			t.Errorf("processes %v still mention the deleted sandbox %s", pids, dir)
		}
	}
	t.Logf("whole test took %s", time.Since(began).Round(10*time.Millisecond))
}

// controlPlaneBinaries is the bin directory of make setup, skipping the
// test when the pinned components are not there.
func controlPlaneBinaries(t *testing.T) string {
	t.Helper()
	binDir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	v := tools.Pinned()
	for _, name := range []string{"kube-apiserver-" + v.NewestKube(), "kube-controller-manager-" + v.NewestKube(), "kube-scheduler-" + v.NewestKube(), "etcd-" + v.Etcd} {
		if _, err := os.Stat(filepath.Join(binDir, name)); err != nil {
			t.Skipf("the pinned control-plane components are not built (%s is missing): run `make setup`", name)
		}
	}
	return binDir
}

// newClusterPKI makes a cluster's key material in memory, as
// clusterpki.Ensure keeps it in Secrets.
func newClusterPKI(t *testing.T) *clusterpki.Set {
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
		CA:                ca("kubernetes"),
		Etcd:              ca("etcd-ca"),
		FrontProxy:        ca("front-proxy-ca"),
		ServiceAccountKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
		ServiceAccountPub: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
	}
}

// controlPlaneRequest is a control-plane machine of cluster "cp-test" with
// stacked etcd, joining through join (none: the first member).
func controlPlaneRequest(t *testing.T, name string, set *clusterpki.Set, version string, join []string, edits ...func(*bootstrap.Config)) *provider.Request {
	t.Helper()
	keys, err := bootstrap.PKIOf(set)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &bootstrap.Config{
		ClusterName: "cp-test",
		Endpoint:    "cp-test.marina.invalid:6443",
		Version:     version,
		PKI:         keys,
		Etcd:        bootstrap.ConfigEtcd{Stacked: &bootstrap.ConfigStackedEtcd{Join: join}},
	}
	for _, edit := range edits {
		edit(cfg)
	}
	doc, err := bootstrap.EncodeConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &provider.Request{
		UID:       uuid.NewUUID(),
		Namespace: "default",
		Name:      name,
		Machine: clusterv1.MachineSpec{
			ClusterName: "cp-test",
			Roles:       []clusterv1.MachineRole{clusterv1.ControlPlaneRole},
			Versions:    clusterv1.MachineVersions{Kubelet: clusterv1.KubernetesVersion(version)},
			Labels:      map[string]string{controlPlaneRoleKey: "", "example.marina.dev/pool": "control-plane"},
			Taints:      []corev1.Taint{{Key: controlPlaneRoleKey, Effect: corev1.TaintEffectNoSchedule}},
		},
		ProviderSpec: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi"}}`),
		Bootstrap:    provider.Bootstrap{ControlPlane: doc},
	}
}

// checkSandbox: the control plane's document is private, and the agent
// knows where the binaries are and has no server or token to use.
func checkSandbox(t *testing.T, dir, binDir string) {
	t.Helper()
	fi, err := os.Stat(filepath.Join(dir, sandbox.ControlPlaneFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", sandbox.ControlPlaneFile, fi.Mode().Perm())
	}
	b, err := sandbox.ReadBootstrap(dir)
	if err != nil {
		t.Fatal(err)
	}
	if b.BinDir != binDir || b.Server != "" || b.Token != "" {
		t.Errorf("bootstrap has binDir %q, server %q and a token %t; want %q, none and none", b.BinDir, b.Server, b.Token != "", binDir)
	}
}

// adminClientFor reaches the API server at addr as a cluster admin.
func adminClientFor(t *testing.T, set *clusterpki.Set, addr string) kubernetes.Interface {
	t.Helper()
	pair, err := set.CA.Issue(pki.CertSpec{CommonName: "cp-test-admin", Organizations: []string{"system:masters"}, Usage: pki.ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	key, err := pair.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(&rest.Config{
		Host:            "https://" + net.JoinHostPort(addr, strconv.Itoa(bootstrap.DefaultAPIServerPort)),
		TLSClientConfig: rest.TLSClientConfig{CAData: set.CA.CertPEM(), CertData: pair.CertPEM(), KeyData: key},
		Timeout:         5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func ready(ctx context.Context, cs kubernetes.Interface) error {
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("/readyz: %w", err)
	}
	if string(body) != "ok" {
		return fmt.Errorf("/readyz says %q", body)
	}
	return nil
}

// checkControlPlaneNode: the machine's Node registered as the node itself
// (NodeRestriction kept the role label off, the taint is there) and
// reports the versions its components run.
func checkControlPlaneNode(ctx context.Context, cs kubernetes.Interface, req *provider.Request, inst *provider.Instance, want clusterv1.ComponentVersions) error {
	n, err := cs.CoreV1().Nodes().Get(ctx, req.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if n.Spec.ProviderID != inst.ProviderID {
		return fmt.Errorf("providerID %q, want %q", n.Spec.ProviderID, inst.ProviderID)
	}
	if _, ok := n.Labels[controlPlaneRoleKey]; ok {
		return fmt.Errorf("the node set the role label %s on itself", controlPlaneRoleKey)
	}
	if n.Labels["example.marina.dev/pool"] != "control-plane" {
		return fmt.Errorf("labels %v lack the machine's own", n.Labels)
	}
	// The node lifecycle controller may add its own taints beside.
	if !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == controlPlaneRoleKey }) {
		return fmt.Errorf("taints %+v lack the control-plane taint", n.Spec.Taints)
	}
	var got clusterv1.ComponentVersions
	raw, ok := n.Annotations[clusterv1.ControlPlaneVersionsAnnotation]
	if !ok {
		return errors.New("no versions annotation yet")
	}
	if err := json.Unmarshal([]byte(raw), &got); err != nil {
		return fmt.Errorf("the versions annotation %q: %w", raw, err)
	}
	if got != want {
		return fmt.Errorf("versions %+v, want %+v", got, want)
	}
	return nil
}

// etcdAdmin reaches the cluster's etcd through url with a client
// certificate of the etcd CA.
func etcdAdmin(t *testing.T, set *clusterpki.Set, url string) *etcdadmin.Client {
	t.Helper()
	pair, err := set.Etcd.Issue(pki.CertSpec{CommonName: "cp-test-etcd-admin", Usage: pki.ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	key, err := pair.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	c, err := etcdadmin.New(t.Context(), etcdadmin.Config{Endpoints: []string{url}, CA: set.Etcd.CertPEM(), Cert: pair.CertPEM(), Key: key, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// component is a running component's process, told apart from a later
// process with its PID by its start time.
type component struct {
	name  string
	pid   int
	start string
}

// componentProcesses are the processes the sandbox's supervisor runs;
// none has a key in its arguments.
func componentProcesses(t *testing.T, dir string) []component {
	t.Helper()
	var out []component
	for _, name := range []string{bootstrap.Etcd, bootstrap.APIServer, bootstrap.ControllerManager, bootstrap.Scheduler} {
		st, err := components.ReadStatus(dir, name)
		if err != nil {
			t.Errorf("status of %s: %v", name, err)
			continue
		}
		if st.State != components.Running || st.PID == 0 {
			t.Errorf("%s is %s, want Running", name, st.State)
			continue
		}
		if args, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", st.PID)); err != nil || strings.Contains(string(args), "PRIVATE KEY") {
			t.Errorf("%s's arguments cannot be read or hold a private key (err %v)", name, err)
		}
		out = append(out, component{name: name, pid: st.PID, start: startTime(st.PID)})
	}
	return out
}

func (c component) alive() bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.pid))
	if err != nil {
		return false
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 19 && f[0] != "Z" && f[19] == c.start
}

// startTime is field 22 of /proc/<pid>/stat.
func startTime(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(data)
	if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) > 19 {
		return f[19]
	}
	return ""
}

// processesMentioning are the live processes with dir in their command
// line: an agent, or a component reading its files from the sandbox.
func processesMentioning(dir string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && strings.Contains(string(data), dir) && (component{pid: pid, start: startTime(pid)}).alive() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// checkNoKeysLogged: neither the agent's log nor the components' logs hold
// a private key.
func checkNoKeysLogged(t *testing.T, dir string) {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(dir, manifest.LogsDir, "*"))
	for _, f := range append([]string{filepath.Join(dir, sandbox.LogFile)}, logs...) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Error(err)
			continue
		}
		if strings.Contains(string(data), "PRIVATE KEY") {
			t.Errorf("%s holds a private key", f)
		}
	}
}

// dumpOnFailure logs the end of the agent's and the components' logs of
// the sandbox when the test fails.
func dumpOnFailure(t *testing.T, dir string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		logs, _ := filepath.Glob(filepath.Join(dir, manifest.LogsDir, "*"))
		for _, f := range append([]string{filepath.Join(dir, sandbox.LogFile)}, logs...) {
			data, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			if len(data) > 4000 {
				data = data[len(data)-4000:]
			}
			t.Logf("--- %s (end):\n%s", f, data)
		}
	})
}

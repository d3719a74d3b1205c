package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/internal/testenv"
)

// One API server plays the management plane (it holds the Secret), another
// the workload cluster; the test stops the latter to make it unreachable.
func TestCacheFollowsTheSecretAndDropsDeadClusters(t *testing.T) {
	ctx := context.Background()
	mgmt, workload, proxy, kubeconfig := startClusters(t)

	events := make(chan string, 16)
	c := NewCache(mgmt.Client, scheme.New(), Options{
		SyncTimeout:    5 * time.Second,
		HealthInterval: 50 * time.Millisecond,
		OnNodeEvent:    func(e NodeEvent) { events <- e.Node.Name },
	})
	defer c.Stop()
	key := types.NamespacedName{Namespace: "default", Name: "c1"}

	if _, err := c.Get(ctx, key); !errors.Is(err, ErrKubeconfigMissing) {
		t.Fatalf("Get without a Secret = %v, want ErrKubeconfigMissing", err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: KubeconfigSecretName("c1"), Namespace: "default"},
		Data:       map[string][]byte{KubeconfigSecretKey: kubeconfig},
	}
	if err := mgmt.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	first, err := c.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Get(ctx, key)
	if err != nil || again != first {
		t.Errorf("a second Get rebuilt the cluster (err %v)", err)
	}

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{ProviderID: "local://abc"}}
	if err := workload.Client.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	select {
	case name := <-events:
		if name != "n1" {
			t.Errorf("node event for %q, want n1", name)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no node event for a new Node")
	}
	found, err := first.NodeByProviderID(ctx, "local://abc")
	if err != nil || found == nil || found.Name != "n1" {
		t.Errorf("NodeByProviderID = %v, %v; want n1", found, err)
	}

	secret.Annotations = map[string]string{"rotated": "yes"}
	if err := mgmt.Client.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	rebuilt, err := c.Get(ctx, key)
	if err != nil || rebuilt == first {
		t.Errorf("a changed Secret did not rebuild the cluster (err %v)", err)
	}

	proxy.cut()
	// Get runs with its own context: the poll's deadline must not be what
	// makes it fail. The probe drops the cluster; the rebuild that follows
	// cannot sync, and is remembered.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		_, err := c.Get(ctx, key)
		return err != nil && strings.Contains(err.Error(), "does not answer"), nil
	})
	if err != nil {
		t.Fatal("a cluster whose API server is gone is still handed out")
	}
}

// startClusters starts two API servers: one plays the management plane (it
// holds the Secrets), the other a workload cluster, reached through a proxy
// the test can cut as a network failure or a dead control plane would. It
// returns the workload cluster's kubeconfig through the proxy.
func startClusters(t *testing.T) (mgmt, workload *testenv.Env, p *proxy, kubeconfig []byte) {
	t.Helper()
	var err error
	if mgmt, err = testenv.StartWorkload(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgmt.Stop() })
	if workload, err = testenv.StartWorkload(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = workload.Stop() })
	p = startProxy(t, strings.Trim(strings.TrimPrefix(workload.Config.Host, "https://"), "/"))
	return mgmt, workload, p, throughProxy(t, workload.Kubeconfig, p.addr())
}

// proxy forwards TCP connections to a target until cut.
type proxy struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l}
	t.Cleanup(p.cut)
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); out.Close() }()
			go func() { _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
	return p
}

func (p *proxy) addr() string { return p.l.Addr().String() }

func (p *proxy) cut() {
	p.l.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// throughProxy rewrites a kubeconfig's server to go through addr.
func throughProxy(t *testing.T, kubeconfig []byte, addr string) []byte {
	t.Helper()
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + addr
	}
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A cluster that cannot be reached is tried once per SyncTimeout; the
// machines asking in between get its error at once.
func TestUnreachableClusterFailsFastUntilRetry(t *testing.T) {
	ctx := context.Background()
	mgmt, _, proxy, kubeconfig := startClusters(t)
	proxy.cut()

	c := NewCache(mgmt.Client, scheme.New(), Options{SyncTimeout: 2 * time.Second})
	defer c.Stop()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: KubeconfigSecretName("dead"), Namespace: "default"},
		Data:       map[string][]byte{KubeconfigSecretKey: kubeconfig},
	}
	if err := mgmt.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	key := types.NamespacedName{Namespace: "default", Name: "dead"}
	_, first := c.Get(ctx, key)
	if first == nil {
		t.Fatal("Get of an unreachable cluster succeeded")
	}
	_, second := c.Get(ctx, key)
	if second == nil || !strings.Contains(second.Error(), "next attempt after") {
		t.Errorf("second Get = %v, want the remembered failure", second)
	}
	testenv.Eventually(t, 20*time.Second, "a fresh attempt after SyncTimeout", func() error {
		_, err := c.Get(ctx, key)
		if err == nil || strings.Contains(err.Error(), "next attempt after") {
			return fmt.Errorf("still the remembered failure: %v", err)
		}
		return nil
	})
}

// A kubeconfig that may watch Nodes but not answer certificate requests (a
// cluster someone else runs, its administrator stingy) still serves the
// Nodes; asking for the certificate requests says what is missing.
func TestACredentialThatMayNotAnswerCertificateRequestsStillWatchesNodes(t *testing.T) {
	ctx := t.Context()
	mgmt, workload, _, _ := startClusters(t)
	cs := kubernetes.NewForConfigOrDie(workload.Config)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "nodes-only"}}
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "nodes-only"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}}}}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "nodes-only"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "nodes-only"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "default", Name: "nodes-only"}}}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, "nodes-only", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"c": {Server: workload.Config.Host, CertificateAuthorityData: workload.Config.CAData}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"u": {Token: tok.Status.Token}},
		Contexts:       map[string]*clientcmdapi.Context{"c": {Cluster: "c", AuthInfo: "u"}},
		CurrentContext: "c",
	})
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: KubeconfigSecretName("stingy"), Namespace: "default"},
		Data:       map[string][]byte{KubeconfigSecretKey: kubeconfig},
	}
	if err := mgmt.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{ProviderID: "local://stingy"}}
	if err := workload.Client.Create(ctx, node); err != nil {
		t.Fatal(err)
	}

	c := NewCache(mgmt.Client, scheme.New(), Options{
		SyncTimeout: 5 * time.Second,
		OnNodeEvent: func(NodeEvent) {},
		OnCSREvent:  func(CSREvent) {},
	})
	defer c.Stop()
	cl, err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "stingy"})
	if err != nil {
		t.Fatalf("a kubeconfig that may watch Nodes: %v", err)
	}
	if found, err := cl.NodeByProviderID(ctx, "local://stingy"); err != nil || found == nil {
		t.Errorf("NodeByProviderID = %v, %v; want n1", found, err)
	}
	_, err = cl.KubeletCSRsOf(ctx, "system:bootstrap:abcdef")
	if !errors.Is(err, ErrMayNotAnswerCSRs) || !strings.Contains(err.Error(), "list certificatesigningrequests") || !strings.Contains(err.Error(), "approve signers") {
		t.Errorf("KubeletCSRsOf = %v, want ErrMayNotAnswerCSRs naming the rights missing", err)
	}
}

// A kubeconfig Secret is written by users (for a cluster run elsewhere):
// one whose exec plugin would run a shell, or whose tokenFile would send
// a file of the management host to the server it names, is refused with
// the field named, and the plugin never runs (docs/security.md).
func TestAKubeconfigSecretThatRunsAProgramOrReadsAFileIsRefused(t *testing.T) {
	ctx := t.Context()
	mgmt, workload, _, _ := startClusters(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("the controller's own token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := NewCache(mgmt.Client, scheme.New(), Options{SyncTimeout: 5 * time.Second, OnNodeEvent: func(NodeEvent) {}, OnCSREvent: func(CSREvent) {}})
	defer c.Stop()

	for name, tc := range map[string]struct {
		user  *clientcmdapi.AuthInfo
		field string
	}{
		"exec": {&clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{
			APIVersion: "client.authentication.k8s.io/v1", InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
			Command: "/bin/sh", Args: []string{"-c", `touch "$0"; echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"x"}}'`, marker},
		}}, "users[u].user.exec"},
		"tokenfile": {&clientcmdapi.AuthInfo{TokenFile: tokenFile}, "users[u].user.tokenFile"},
	} {
		kubeconfig, err := clientcmd.Write(clientcmdapi.Config{
			Clusters:       map[string]*clientcmdapi.Cluster{"c": {Server: workload.Config.Host, CertificateAuthorityData: workload.Config.CAData}},
			AuthInfos:      map[string]*clientcmdapi.AuthInfo{"u": tc.user},
			Contexts:       map[string]*clientcmdapi.Context{"c": {Cluster: "c", AuthInfo: "u"}},
			CurrentContext: "c",
		})
		if err != nil {
			t.Fatal(err)
		}
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: KubeconfigSecretName(name), Namespace: "default"},
			Data:       map[string][]byte{KubeconfigSecretKey: kubeconfig},
		}
		if err := mgmt.Client.Create(ctx, secret); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: name}); !errors.Is(err, ErrKubeconfigRefused) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: Get = %v, want ErrKubeconfigRefused naming %s", name, err, tc.field)
		}
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("the exec plugin ran (%s: %v)", marker, err)
	}
}

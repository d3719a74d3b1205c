package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/etcdadmin"
	"marina.dev/marina/internal/pki"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/tools"
)

// A cluster on an etcd the user runs, signed by a CA the user brings
// (M14, M15): it reaches Ready, its API server's certificate verifies
// against the user's CA alone, its data lands in that etcd, and marina never
// changes that etcd's membership.
func TestUpRunsAClusterOnExternalEtcdWithTheUsersCA(t *testing.T) {
	t.Parallel()
	u, root, c := startUpWithClient(t)
	ctx := context.Background()

	etcd := startEtcd(t)
	before := memberIDs(t, ctx, etcd)

	usersCA, err := pki.NewCA("users-ca")
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := usersCA.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: "users-ca", Namespace: "default"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: usersCA.CertPEM(), corev1.TLSPrivateKeyKey: caKey}},
		{ObjectMeta: metav1.ObjectMeta{Name: "etcd-client", Namespace: "default"},
			Data: map[string][]byte{"ca.crt": etcd.ca, corev1.TLSCertKey: etcd.cert, corev1.TLSPrivateKeyKey: etcd.key}},
	} {
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: "default"},
		Spec: clusterv1.ClusterSpec{
			ControlPlane: clusterv1.ControlPlaneSpec{
				Version:      "v1.37.2",
				Replicas:     1,
				ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"2Gi"}}`)},
				CASecretRef:  &clusterv1.SecretReference{Name: "users-ca"},
				Etcd: clusterv1.EtcdSpec{Type: clusterv1.EtcdExternal, External: &clusterv1.ExternalEtcd{
					Endpoints: []string{etcd.url}, SecretRef: &clusterv1.SecretReference{Name: "etcd-client"},
				}},
			},
		},
	}
	if err := c.Create(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	key := types.NamespacedName{Namespace: "default", Name: "ext"}
	testenv.Eventually(t, 3*time.Minute, "cluster ext Ready", func() error {
		if err := c.Get(ctx, key, cluster); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(cluster.Status.Conditions, clusterv1.ReadyCondition) {
			return fmt.Errorf("not Ready: %v", cluster.Status.Conditions)
		}
		return nil
	})

	// The endpoint's certificate chain verifies against the user's CA and
	// nothing else.
	pool := x509.NewCertPool()
	pool.AddCert(usersCA.Cert)
	ep := cluster.Spec.ControlPlaneEndpoint
	conn, err := tls.Dial("tcp", net.JoinHostPort(ep.Host, strconv.Itoa(int(ep.Port))), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("the API server's certificate does not verify against the user's CA: %v", err)
	}
	_ = conn.Close()
	secret := &corev1.Secret{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: remote.KubeconfigSecretName("ext")}, secret); err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.Load(secret.Data[remote.KubeconfigSecretKey])
	if err != nil {
		t.Fatal(err)
	}
	for name, cl := range kc.Clusters {
		if !bytes.Equal(cl.CertificateAuthorityData, usersCA.CertPEM()) {
			t.Errorf("the admin kubeconfig's cluster %s trusts another CA than the user's", name)
		}
	}
	for _, n := range []string{"ext-ca", "ext-etcd"} {
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: n}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			t.Errorf("Secret %s: %v; marina made a CA although the user brought one or the etcd is external", n, err)
		}
	}

	// The workload cluster's objects live in the user's etcd.
	workload := workloadClient(t, ctx, c, key)
	if _, err := workload.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "in-users-etcd"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !etcdHasKey(t, ctx, etcd, "/registry/configmaps/default/in-users-etcd") {
		t.Error("the workload's ConfigMap is not in the external etcd")
	}

	if out, err := u.kubectl(t, "delete", "cluster", "ext", "--wait=false"); err != nil {
		t.Fatalf("kubectl delete cluster: %v\n%s", err, out)
	}
	testenv.Eventually(t, 2*time.Minute, "the cluster and its machines gone", func() error {
		if err := c.Get(ctx, key, &clusterv1.Cluster{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster still there (%v)", err)
		}
		if pids := processesUnder(root); len(pids) > 0 {
			return fmt.Errorf("processes still run from the sandboxes: %v", pids)
		}
		return nil
	})
	if after := memberIDs(t, ctx, etcd); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the external etcd's members changed from %v to %v", before, after)
	}
	u.stopAndCheckNoLeftovers(t, syscall.SIGTERM)
}

// userEtcd is an etcd the test runs as a user would: TLS, client
// certificates required, on 127.0.0.1.
type userEtcd struct {
	url           string
	ca, cert, key []byte
}

func startEtcd(t *testing.T) *userEtcd {
	t.Helper()
	binDir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ca, err := pki.NewCA("users-etcd-ca")
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.Issue(pki.CertSpec{CommonName: "etcd", IPs: []net.IP{net.ParseIP("127.0.0.1")}, Usage: pki.ServerAuth | pki.ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	if err := server.Write(dir, "server"); err != nil {
		t.Fatal(err)
	}
	if err := ca.Write(dir, "ca"); err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue(pki.CertSpec{CommonName: "kube-apiserver-etcd-client", Usage: pki.ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	clientKey, err := client.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	port := testenv.FreePorts(t, 2)
	url := "https://127.0.0.1:" + strconv.Itoa(port)
	peer := "http://127.0.0.1:" + strconv.Itoa(port+1)
	cmd := exec.Command(filepath.Join(binDir, "etcd-"+tools.Pinned().Etcd),
		"--name", "users-etcd", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", url, "--advertise-client-urls", url,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "users-etcd="+peer,
		"--cert-file", filepath.Join(dir, "server.crt"), "--key-file", filepath.Join(dir, "server.key"),
		"--trusted-ca-file", filepath.Join(dir, "ca.crt"), "--client-cert-auth")
	logFile, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		_ = logFile.Close()
	})
	e := &userEtcd{url: url, ca: ca.CertPEM(), cert: client.CertPEM(), key: clientKey}
	testenv.Eventually(t, 30*time.Second, "the user's etcd answers", func() error {
		_, err := e.members(context.Background())
		return err
	})
	return e
}

func (e *userEtcd) client(ctx context.Context) (*etcdadmin.Client, error) {
	return etcdadmin.New(ctx, etcdadmin.Config{Endpoints: []string{e.url}, CA: e.ca, Cert: e.cert, Key: e.key, DialTimeout: 2 * time.Second})
}

func (e *userEtcd) members(ctx context.Context) ([]etcdadmin.Member, error) {
	c, err := e.client(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return c.List(ctx)
}

func memberIDs(t *testing.T, ctx context.Context, e *userEtcd) []uint64 {
	t.Helper()
	members, err := e.members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint64
	for _, m := range members {
		ids = append(ids, m.ID)
	}
	return ids
}

func etcdHasKey(t *testing.T, ctx context.Context, e *userEtcd, key string) bool {
	t.Helper()
	c, err := e.client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	n, err := c.Count(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

package clusterpki_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/pki"
	"marina.dev/marina/internal/remote"
	"marina.dev/marina/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

// certPEM makes a self-signed certificate from tmpl with a new key.
func certPEM(t *testing.T, tmpl *x509.Certificate) (certOut, keyOut []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(1)
	tmpl.Subject = pkix.Name{CommonName: "test"}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

func caTemplate(notBefore, notAfter time.Time) *x509.Certificate {
	return &x509.Certificate{
		NotBefore: notBefore, NotAfter: notAfter,
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
}

// Each kind of bad CA material is named, with what to do (M15).
func TestCheckCA(t *testing.T) {
	now := time.Now()
	goodCert, goodKey := certPEM(t, caTemplate(now.Add(-time.Hour), now.Add(time.Hour*24*365)))
	_, otherKey := certPEM(t, caTemplate(now.Add(-time.Hour), now.Add(time.Hour)))
	expiredCert, expiredKey := certPEM(t, caTemplate(now.Add(-48*time.Hour), now.Add(-24*time.Hour)))
	futureCert, futureKey := certPEM(t, caTemplate(now.Add(24*time.Hour), now.Add(48*time.Hour)))
	leafCert, leafKey := certPEM(t, &x509.Certificate{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature})

	for _, tc := range []struct {
		name      string
		cert, key []byte
		want      string // empty: usable
	}{
		{"a CA that can sign", goodCert, goodKey, ""},
		{"key of another certificate", goodCert, otherKey, "does not match the certificate"},
		{"expired", expiredCert, expiredKey, "expired on"},
		{"not valid yet", futureCert, futureKey, "not valid before"},
		{"a leaf, not a CA", leafCert, leafKey, "is not a CA certificate"},
		{"no certificate", nil, goodKey, "has no tls.crt"},
		{"no key", goodCert, nil, "has no tls.key"},
		{"certificate that is not PEM", []byte("hello"), goodKey, "holds no PEM certificate"},
		{"key that is not PEM", goodCert, []byte("hello"), "tls.key cannot be used"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca, problem := clusterpki.CheckCA(tc.cert, tc.key, now)
			if tc.want == "" {
				if problem != "" || ca == nil {
					t.Fatalf("refused a usable CA: %s", problem)
				}
				return
			}
			if !strings.Contains(problem, tc.want) {
				t.Fatalf("problem %q does not say %q", problem, tc.want)
			}
			if strings.Contains(problem, "PRIVATE KEY") || strings.Contains(problem, "CERTIFICATE") {
				t.Errorf("the problem quotes key material: %q", problem)
			}
		})
	}
}

func newCluster(t *testing.T, ns string, caRef string) *clusterv1.Cluster {
	t.Helper()
	c := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: ns},
		Spec: clusterv1.ClusterSpec{ControlPlane: clusterv1.ControlPlaneSpec{
			Version: "v1.37.2", Replicas: 1,
			ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"2Gi"}}`)},
		}},
	}
	if caRef != "" {
		c.Spec.ControlPlane.CASecretRef = &clusterv1.SecretReference{Name: caRef}
	}
	if err := env.Client.Create(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	return c
}

func secretNames(t *testing.T, ns string) []string {
	t.Helper()
	list := &corev1.SecretList{}
	if err := env.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range list.Items {
		names = append(names, s.Name)
	}
	return names
}

// Reconciles racing on a new cluster make each CA exactly once, and all
// of them get the same one.
func TestEnsureMakesEachCAOnce(t *testing.T) {
	ns := env.Namespace(t)
	cluster := newCluster(t, ns, "")
	const racers = 6
	sets := make([]*clusterpki.Set, racers)
	errs := make([]error, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sets[i], errs[i] = clusterpki.Ensure(context.Background(), env.Client, env.Client, cluster, time.Now())
		}()
	}
	wg.Wait()
	for i := range racers {
		if errs[i] != nil {
			t.Fatalf("racer %d: %v", i, errs[i])
		}
		for name, pair := range map[string][2]*pki.KeyPair{
			"cluster CA": {sets[0].CA, sets[i].CA}, "etcd CA": {sets[0].Etcd, sets[i].Etcd}, "front-proxy CA": {sets[0].FrontProxy, sets[i].FrontProxy},
		} {
			if !bytes.Equal(pair[0].Cert.Raw, pair[1].Cert.Raw) {
				t.Errorf("racer %d got another %s than racer 0", i, name)
			}
		}
		if !bytes.Equal(sets[0].ServiceAccountPub, sets[i].ServiceAccountPub) {
			t.Errorf("racer %d got another service-account key than racer 0", i)
		}
	}
	names := secretNames(t, ns)
	if len(names) != 4 {
		t.Errorf("Secrets %v, want exactly c1-ca, c1-etcd, c1-proxy, c1-sa", names)
	}
	for _, purpose := range []string{clusterpki.ClusterCA, clusterpki.EtcdCA, clusterpki.FrontProxyCA, clusterpki.ServiceAccount} {
		s := &corev1.Secret{}
		if err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: clusterpki.SecretName("c1", purpose)}, s); err != nil {
			t.Fatal(err)
		}
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != cluster.UID {
			t.Errorf("Secret %s is not owned by its Cluster (deleted with it): %+v", s.Name, s.OwnerReferences)
		}
	}
}

// A user's CA is used as it is (M15); a bad one is reported, and nothing is
// made while it is bad.
func TestEnsureUsesTheUsersCAOrMakesNothing(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	goodCert, goodKey := certPEM(t, caTemplate(now.Add(-time.Hour), now.Add(24*time.Hour)))
	_, otherKey := certPEM(t, caTemplate(now.Add(-time.Hour), now.Add(time.Hour)))

	t.Run("usable", func(t *testing.T) {
		ns := env.Namespace(t)
		userSecret(t, ns, goodCert, goodKey)
		set, err := clusterpki.Ensure(ctx, env.Client, env.Client, newCluster(t, ns, "my-ca"), now)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(set.CA.CertPEM(), goodCert) {
			t.Error("the cluster CA is not the user's")
		}
		for _, name := range secretNames(t, ns) {
			if name == clusterpki.SecretName("c1", clusterpki.ClusterCA) {
				t.Error("a cluster CA was generated although the user brought one")
			}
		}
	})
	for _, tc := range []struct {
		name      string
		cert, key []byte
		want      string
	}{
		{"key of another certificate", goodCert, otherKey, "does not match"},
		{"missing", nil, nil, "does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := env.Namespace(t)
			if tc.cert != nil {
				userSecret(t, ns, tc.cert, tc.key)
			}
			_, err := clusterpki.Ensure(ctx, env.Client, env.Client, newCluster(t, ns, "my-ca"), now)
			var invalid *clusterpki.InvalidCAError
			if !errors.As(err, &invalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want an InvalidCAError saying %q", err, tc.want)
			}
			if names := secretNames(t, ns); len(names) > 1 || (len(names) == 1 && names[0] != "my-ca") {
				t.Errorf("Secrets were made for a cluster with a bad CA: %v", names)
			}
		})
	}
}

func userSecret(t *testing.T, ns string, cert, key []byte) {
	t.Helper()
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "my-ca", Namespace: ns},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: cert, corev1.TLSPrivateKeyKey: key},
	}
	if err := env.Client.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

// The admin kubeconfig is written once, left alone while right, and
// renewed before its client certificate expires or when the endpoint moves.
func TestAdminKubeconfigIsRenewedBeforeItExpires(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	cluster := newCluster(t, ns, "")
	now := time.Now()
	set, err := clusterpki.Ensure(ctx, env.Client, env.Client, cluster, now)
	if err != nil {
		t.Fatal(err)
	}
	const server = "https://127.0.0.10:6443"
	read := func() (*corev1.Secret, time.Time, string) {
		t.Helper()
		s := &corev1.Secret{}
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: remote.KubeconfigSecretName("c1")}, s); err != nil {
			t.Fatal(err)
		}
		cfg, err := clientcmd.RESTConfigFromKubeConfig(s.Data[remote.KubeconfigSecretKey])
		if err != nil {
			t.Fatalf("the Secret does not hold a kubeconfig: %v", err)
		}
		block, _ := pem.Decode(cfg.CertData)
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if err := cert.CheckSignatureFrom(set.CA.Cert); err != nil {
			t.Errorf("the client certificate is not from the cluster CA: %v", err)
		}
		if !bytes.Equal(cfg.CAData, set.CA.CertPEM()) {
			t.Error("the kubeconfig does not trust the cluster CA")
		}
		return s, cert.NotAfter, cfg.Host
	}

	if err := clusterpki.EnsureAdminKubeconfig(ctx, env.Client, cluster, set.CA, server, now); err != nil {
		t.Fatal(err)
	}
	first, expires, host := read()
	if host != server {
		t.Errorf("server %q, want %q", host, server)
	}
	if err := clusterpki.EnsureAdminKubeconfig(ctx, env.Client, cluster, set.CA, server, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if again, _, _ := read(); again.ResourceVersion != first.ResourceVersion {
		t.Error("a kubeconfig that was still right was rewritten")
	}
	if err := clusterpki.EnsureAdminKubeconfig(ctx, env.Client, cluster, set.CA, server, expires.Add(-24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if renewed, _, _ := read(); renewed.ResourceVersion == first.ResourceVersion {
		t.Error("a client certificate a day from expiry was not renewed")
	}
	if err := clusterpki.EnsureAdminKubeconfig(ctx, env.Client, cluster, set.CA, "https://127.0.0.11:6443", now); err != nil {
		t.Fatal(err)
	}
	if _, _, host := read(); host != "https://127.0.0.11:6443" {
		t.Errorf("the kubeconfig still points at %q after the endpoint moved", host)
	}
	if s, _, _ := read(); len(s.OwnerReferences) != 1 {
		t.Errorf("the kubeconfig Secret is not owned by its Cluster: %+v", s.OwnerReferences)
	}
}

// Issue 22 (finding 7): key material is made only before the control plane
// is initialised, and Load (a machine's bootstrap) never makes any: a CA
// made there or after initialisation is one the cluster does not trust.
func TestKeyMaterialIsMadeOnlyBeforeInitialisation(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	cluster := newCluster(t, ns, "")
	var lost *clusterpki.LostError
	if _, err := clusterpki.Load(ctx, env.Client, env.Client, cluster, time.Now()); !errors.As(err, &lost) {
		t.Fatalf("Load of a cluster with no key material: %v, want a *LostError", err)
	}
	if names := secretNames(t, ns); len(names) != 0 {
		t.Fatalf("Load made Secrets %v", names)
	}
	if _, err := clusterpki.Ensure(ctx, env.Client, env.Client, cluster, time.Now()); err != nil {
		t.Fatal(err)
	}
	meta.SetStatusCondition(&cluster.Status.Conditions, metav1.Condition{Type: clusterv1.ClusterControlPlaneInitializedCondition,
		Status: metav1.ConditionTrue, Reason: clusterv1.ClusterControlPlaneInitializedReason})
	for _, purpose := range []string{clusterpki.ClusterCA, clusterpki.EtcdCA, clusterpki.FrontProxyCA, clusterpki.ServiceAccount} {
		key := types.NamespacedName{Namespace: ns, Name: clusterpki.SecretName(cluster.Name, purpose)}
		saved := &corev1.Secret{}
		if err := env.Client.Get(ctx, key, saved); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Delete(ctx, saved); err != nil {
			t.Fatal(err)
		}
		_, err := clusterpki.Ensure(ctx, env.Client, env.Client, cluster, time.Now())
		if !errors.As(err, &lost) || lost.Secret != key.String() {
			t.Errorf("Ensure of an initialised cluster without %s: %v, want a *LostError naming it", key, err)
		}
		if err := env.Client.Get(ctx, key, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			t.Errorf("Secret %s after Ensure: %v, want it not made anew", key, err)
		}
		restored := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name}, Type: saved.Type, Data: saved.Data}
		if err := env.Client.Create(ctx, restored); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := clusterpki.Ensure(ctx, env.Client, env.Client, cluster, time.Now()); err != nil {
		t.Errorf("Ensure with every Secret restored: %v", err)
	}
}

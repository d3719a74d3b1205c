// Package clusterpki keeps a workload cluster's certificate authorities and
// service-account key pair in Secrets of the management plane, and the
// administrator's kubeconfig built from them (M15). It is what the cluster
// controller calls on every reconcile: each function converges and may run
// concurrently with itself, and a CA is created exactly once.
//
// Secrets, in the Cluster's namespace and owned by it (deleted with it):
//
//	<cluster>-ca          the cluster CA (tls.crt, tls.key), unless the user
//	                      brings one in spec.controlPlane.caSecretRef
//	<cluster>-etcd        the etcd CA
//	<cluster>-proxy       the front-proxy CA
//	<cluster>-sa          the service-account signing key pair (tls.key, tls.pub)
//	<cluster>-kubeconfig  the administrator's kubeconfig (key "value")
//
// Private keys live only in these Secrets (and, on a machine, in 0600
// files): never in logs, events, conditions or status. Errors name Secrets
// and keys, never their contents.
package clusterpki

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/pki"
)

// Purposes of a cluster's Secrets: the suffix of their names.
const (
	ClusterCA      = "ca"
	EtcdCA         = "etcd"
	FrontProxyCA   = "proxy"
	ServiceAccount = "sa"
)

// Keys of the Secrets.
const (
	// PublicKeyKey holds the service-account public key (PEM).
	PublicKeyKey = "tls.pub"
)

// SecretType marks the Secrets this package makes.
const SecretType corev1.SecretType = "cluster.marina.dev/pki"

// SecretName is the name of a cluster's Secret for purpose.
func SecretName(cluster, purpose string) string { return cluster + "-" + purpose }

// Set is a cluster's key material, loaded.
type Set struct {
	// CA signs the cluster's API server, kubelet and client certificates.
	CA *pki.KeyPair
	// Etcd signs etcd's server, peer and client certificates; nil with
	// external etcd.
	Etcd *pki.KeyPair
	// FrontProxy signs the API server's front-proxy client certificate.
	FrontProxy *pki.KeyPair
	// ServiceAccountKey signs service-account tokens (PEM, PKCS#8); secret.
	ServiceAccountKey []byte
	// ServiceAccountPub verifies them (PEM, PKIX).
	ServiceAccountPub []byte
}

// InvalidCAError says the user's CA cannot be used; retrying cannot fix it.
type InvalidCAError struct {
	// Secret is namespace/name of the user's Secret.
	Secret string
	// Problem says what is wrong and what to do.
	Problem string
}

func (e *InvalidCAError) Error() string {
	return fmt.Sprintf("the CA in Secret %s cannot be used: %s", e.Secret, e.Problem)
}

// LostError says that a Secret of key material was deleted after the
// cluster's control plane was initialised. Making a new one would break the
// cluster silently: its API servers, etcd members and kubelets hold
// certificates signed by the old CA, and its tokens are signed by the old
// service-account key. Retrying cannot fix it; restoring the Secret can.
type LostError struct {
	// Secret is namespace/name of the missing Secret.
	Secret string
}

func (e *LostError) Error() string {
	return fmt.Sprintf("Secret %s was deleted after the control plane was initialised, and marina makes no new one: "+
		"every certificate and token of the running cluster is signed by the old key. "+
		"Restore the Secret from a backup (kubectl apply it as it was), or delete the cluster and create it anew", e.Secret)
}

// CAExpiryWarning is how long before the cluster CA expires the cluster
// says so: a CA cannot be rotated in place yet, so its owner needs time to
// move workloads to a new cluster or to renew the CA keeping its key.
const CAExpiryWarning = 90 * 24 * time.Hour

// Initialized says whether the cluster's control plane was ever
// initialised: from then on its key material is in use and is never made
// anew.
func Initialized(cluster *clusterv1.Cluster) bool {
	return meta.IsStatusConditionTrue(cluster.Status.Conditions, clusterv1.ClusterControlPlaneInitializedCondition)
}

// Ensure loads the cluster's key material, creating what is missing while
// the control plane has never been initialised; after that, a missing
// Secret is a *LostError. With spec.controlPlane.caSecretRef, the user's CA
// is checked first and nothing is created when it is unusable (an
// *InvalidCAError).
func Ensure(ctx context.Context, c client.Client, live client.Reader, cluster *clusterv1.Cluster, now time.Time) (*Set, error) {
	return load(ctx, c, live, cluster, now, !Initialized(cluster))
}

// Load loads the cluster's key material and creates nothing: for callers
// that run after the cluster controller has made it (a machine's
// bootstrap), where a missing Secret is a *LostError.
func Load(ctx context.Context, c client.Client, live client.Reader, cluster *clusterv1.Cluster, now time.Time) (*Set, error) {
	return load(ctx, c, live, cluster, now, false)
}

func load(ctx context.Context, c client.Client, live client.Reader, cluster *clusterv1.Cluster, now time.Time, create bool) (*Set, error) {
	set := &Set{}
	var err error
	if ref := cluster.Spec.ControlPlane.CASecretRef; ref != nil {
		if set.CA, err = userCA(ctx, live, cluster.Namespace, ref.Name, now); err != nil {
			return nil, err
		}
	} else if set.CA, err = ensureCA(ctx, c, cluster, ClusterCA, "kubernetes", create); err != nil {
		return nil, err
	}
	// An external etcd has its own CA, named in its Secret.
	if cluster.Spec.ControlPlane.Etcd.Type != clusterv1.EtcdExternal {
		if set.Etcd, err = ensureCA(ctx, c, cluster, EtcdCA, "etcd-ca", create); err != nil {
			return nil, err
		}
	}
	if set.FrontProxy, err = ensureCA(ctx, c, cluster, FrontProxyCA, "front-proxy-ca", create); err != nil {
		return nil, err
	}
	secret, err := ensureSecret(ctx, c, cluster, ServiceAccount, create, newServiceAccountKey)
	if err != nil {
		return nil, err
	}
	set.ServiceAccountKey, set.ServiceAccountPub = secret.Data[corev1.TLSPrivateKeyKey], secret.Data[PublicKeyKey]
	if len(set.ServiceAccountKey) == 0 || len(set.ServiceAccountPub) == 0 {
		return nil, fmt.Errorf("secret %s/%s lacks %s or %s: delete it to have marina make a new service-account key (every token issued so far stops working)",
			cluster.Namespace, secret.Name, corev1.TLSPrivateKeyKey, PublicKeyKey)
	}
	return set, nil
}

// ensureCA loads the cluster's CA for purpose, generating it on first use
// when create is set.
func ensureCA(ctx context.Context, c client.Client, cluster *clusterv1.Cluster, purpose, commonName string, create bool) (*pki.KeyPair, error) {
	secret, err := ensureSecret(ctx, c, cluster, purpose, create, func() (map[string][]byte, error) {
		ca, err := pki.NewCA(commonName)
		if err != nil {
			return nil, err
		}
		return pairData(ca)
	})
	if err != nil {
		return nil, err
	}
	ca, err := pki.ParsePEM(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		// Never replace a CA silently: every certificate of the cluster
		// chains to it.
		return nil, fmt.Errorf("secret %s/%s does not hold a usable CA: %w", cluster.Namespace, secret.Name, err)
	}
	return ca, nil
}

// ensureSecret returns the cluster's Secret for purpose, creating it with
// data from make when it does not exist and create is set (else a
// *LostError). The name is fixed, so of two reconciles racing to create it
// one wins and the other reads the winner's: a CA is made exactly once.
func ensureSecret(ctx context.Context, c client.Client, cluster *clusterv1.Cluster, purpose string, create bool, make func() (map[string][]byte, error)) (*corev1.Secret, error) {
	key := types.NamespacedName{Namespace: cluster.Namespace, Name: SecretName(cluster.Name, purpose)}
	secret := &corev1.Secret{}
	err := c.Get(ctx, key, secret)
	if err == nil {
		return secret, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading Secret %s: %w", key, err)
	}
	if !create {
		return nil, &LostError{Secret: key.String()}
	}
	data, err := make()
	if err != nil {
		return nil, fmt.Errorf("making the key material of Secret %s: %w", key, err)
	}
	secret = &corev1.Secret{ObjectMeta: ownedMeta(cluster, key.Name), Type: SecretType, Data: data}
	err = c.Create(ctx, secret)
	if apierrors.IsAlreadyExists(err) {
		err = c.Get(ctx, key, secret)
	}
	if err != nil {
		return nil, fmt.Errorf("creating Secret %s: %w", key, err)
	}
	return secret, nil
}

// userCA reads and checks the user's CA Secret (M15), uncached through
// live: marina's cache holds only the Secrets it labels, and a user's
// Secret need not carry the label.
func userCA(ctx context.Context, c client.Reader, namespace, name string, now time.Time) (*pki.KeyPair, error) {
	secret := &corev1.Secret{}
	ref := namespace + "/" + name
	if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &InvalidCAError{Secret: ref, Problem: "the Secret does not exist: create it (type kubernetes.io/tls, keys tls.crt and tls.key) in the cluster's namespace"}
		}
		return nil, fmt.Errorf("reading Secret %s: %w", ref, err)
	}
	ca, problem := CheckCA(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey], now)
	if problem != "" {
		return nil, &InvalidCAError{Secret: ref, Problem: problem}
	}
	return ca, nil
}

// CheckCA checks that a certificate and key make a CA that can sign the
// cluster's certificates at now. problem is empty when they do; otherwise
// it says what is wrong and what to do, without quoting any key material.
func CheckCA(certPEM, keyPEM []byte, now time.Time) (ca *pki.KeyPair, problem string) {
	if len(certPEM) == 0 {
		return nil, "it has no tls.crt: put the CA certificate (PEM) there"
	}
	if len(keyPEM) == 0 {
		return nil, "it has no tls.key: put the CA's private key (PEM) there"
	}
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, "tls.crt holds no PEM certificate"
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, "tls.crt cannot be parsed as an X.509 certificate"
	}
	if !cert.IsCA || !cert.BasicConstraintsValid || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, "tls.crt is not a CA certificate (it needs basicConstraints CA:TRUE and keyUsage keyCertSign): use your signing CA, not a leaf certificate"
	}
	if now.After(cert.NotAfter) {
		return nil, fmt.Sprintf("the CA certificate expired on %s: renew it, keeping its key, or use another CA", cert.NotAfter.UTC().Format(time.RFC3339))
	}
	if now.Before(cert.NotBefore) {
		return nil, fmt.Sprintf("the CA certificate is not valid before %s: check the clock or the certificate", cert.NotBefore.UTC().Format(time.RFC3339))
	}
	ca, err = pki.ParsePEM(certPEM, keyPEM)
	if err != nil {
		if errors.Is(err, pki.ErrKeyMismatch) {
			return nil, "the private key in tls.key does not match the certificate in tls.crt: put the CA's own key there"
		}
		return nil, "tls.key cannot be used as the CA's private key: it must be a PEM RSA, ECDSA or Ed25519 key"
	}
	return ca, ""
}

func pairData(kp *pki.KeyPair) (map[string][]byte, error) {
	key, err := kp.KeyPEM()
	if err != nil {
		return nil, err
	}
	return map[string][]byte{corev1.TLSCertKey: kp.CertPEM(), corev1.TLSPrivateKeyKey: key}, nil
}

func newServiceAccountKey() (map[string][]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating the service-account key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
		PublicKeyKey:            pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
	}, nil
}

// ownedMeta names a Secret of the cluster, labelled with its name and owned
// by it, so that deleting the Cluster deletes the Secret.
func ownedMeta(cluster *clusterv1.Cluster, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace:       cluster.Namespace,
		Name:            name,
		Labels:          map[string]string{clusterv1.ClusterNameLabel: cluster.Name},
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cluster, clusterv1.GroupVersion.WithKind("Cluster"))},
	}
}

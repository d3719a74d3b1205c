package clusterpki

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/kubeconfig"
	"marina.dev/marina/internal/pki"
	"marina.dev/marina/internal/remote"
)

// KubeconfigSecretType marks a cluster's admin kubeconfig Secret.
const KubeconfigSecretType corev1.SecretType = "cluster.marina.dev/kubeconfig"

// adminCert is the identity of the admin kubeconfig: a cluster
// administrator through the system:masters group.
var adminCert = pki.CertSpec{CommonName: "marina-admin", Organizations: []string{"system:masters"}, Usage: pki.ClientAuth}

// EnsureAdminKubeconfig keeps the cluster's admin kubeconfig Secret
// (<cluster>-kubeconfig, read by internal/remote) pointing at server with a
// client certificate from ca. The certificate is reissued when it nears
// expiry, and the whole kubeconfig when the server or the CA changed; a
// kubeconfig that is still right is left alone (no write).
func EnsureAdminKubeconfig(ctx context.Context, c client.Client, cluster *clusterv1.Cluster, ca *pki.KeyPair, server string, now time.Time) error {
	key := types.NamespacedName{Namespace: cluster.Namespace, Name: remote.KubeconfigSecretName(cluster.Name)}
	secret := &corev1.Secret{}
	err := c.Get(ctx, key, secret)
	switch {
	case apierrors.IsNotFound(err):
		data, err := adminKubeconfig(cluster.Name, ca, server)
		if err != nil {
			return err
		}
		secret = &corev1.Secret{
			ObjectMeta: ownedMeta(cluster, key.Name),
			Type:       KubeconfigSecretType,
			Data:       map[string][]byte{remote.KubeconfigSecretKey: data},
		}
		if err := c.Create(ctx, secret); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating Secret %s: %w", key, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading Secret %s: %w", key, err)
	}
	if current(secret.Data[remote.KubeconfigSecretKey], ca, server, now) {
		return nil
	}
	data, err := adminKubeconfig(cluster.Name, ca, server)
	if err != nil {
		return err
	}
	secret.Data = map[string][]byte{remote.KubeconfigSecretKey: data}
	if err := c.Update(ctx, secret); err != nil {
		return fmt.Errorf("renewing the admin kubeconfig in Secret %s: %w", key, err)
	}
	return nil
}

// current reports whether a kubeconfig reaches server, trusts ca, and has
// a client certificate from ca that is not near expiry.
func current(data []byte, ca *pki.KeyPair, server string, now time.Time) bool {
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return false
	}
	ctx, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok {
		return false
	}
	cl, auth := cfg.Clusters[ctx.Cluster], cfg.AuthInfos[ctx.AuthInfo]
	if cl == nil || auth == nil || cl.Server != server || !bytes.Equal(cl.CertificateAuthorityData, ca.CertPEM()) {
		return false
	}
	block, _ := pem.Decode(auth.ClientCertificateData)
	if block == nil {
		return false
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	return err == nil && cert.CheckSignatureFrom(ca.Cert) == nil && !pki.NeedsRenewal(cert, now)
}

// adminKubeconfig builds a kubeconfig for the cluster's administrator.
func adminKubeconfig(cluster string, ca *pki.KeyPair, server string) ([]byte, error) {
	client, err := ca.Issue(adminCert)
	if err != nil {
		return nil, err
	}
	return kubeconfig.Encode(cluster, "marina-admin@"+cluster, server, ca.CertPEM(), client)
}

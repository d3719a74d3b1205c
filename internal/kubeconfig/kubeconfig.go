// Package kubeconfig writes the kubeconfigs marina hands out (one cluster,
// one user authenticated by a client certificate, everything embedded so the
// file works on its own) and reads the ones users give it, accepting only
// inline credentials. A kubeconfig holds a private key or a token: store it
// in a Secret or a 0600 file, never log it.
package kubeconfig

import (
	"fmt"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"marina.dev/marina/internal/pki"
)

// Encode returns a kubeconfig that reaches server, trusting caPEM, as the
// holder of client. cluster and user name its entries; its one context is
// the current one.
func Encode(cluster, user, server string, caPEM []byte, client *pki.KeyPair) ([]byte, error) {
	keyPEM, err := client.KeyPEM()
	if err != nil {
		return nil, err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[cluster] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: client.CertPEM(), ClientKeyData: keyPEM}
	cfg.Contexts[user] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: user}
	cfg.CurrentContext = user
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("encoding a kubeconfig for %s: %w", server, err)
	}
	return data, nil
}

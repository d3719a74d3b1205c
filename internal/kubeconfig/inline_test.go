package kubeconfig

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// A kubeconfig from a Secret may not make marina read a file of its host
// or run a program (docs/security.md); each refusal names the field.
func TestInlineRESTConfigRefusesWhatReadsAFileOrRunsAProgram(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*clientcmdapi.Cluster, *clientcmdapi.AuthInfo)
		field string
	}{
		{"exec plugin", func(_ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.Exec = &clientcmdapi.ExecConfig{Command: "/bin/sh", Args: []string{"-c", "touch /tmp/owned"}, APIVersion: "client.authentication.k8s.io/v1"}
		}, "users[u].user.exec (runs a program)"},
		{"auth provider", func(_ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.AuthProvider = &clientcmdapi.AuthProviderConfig{Name: "oidc"}
		}, "users[u].user.auth-provider (runs a plugin)"},
		{"token file", func(_ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.Token, u.TokenFile = "", "/var/run/secrets/kubernetes.io/serviceaccount/token"
		}, "users[u].user.tokenFile (a file; use token)"},
		{"client key file", func(_ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.Token, u.ClientKey = "", "/etc/marina/pki/ca.key"
		}, "users[u].user.client-key (a file; use client-key-data)"},
		{"client certificate file", func(_ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.Token, u.ClientCertificate = "", "/etc/marina/pki/ca.crt"
		}, "users[u].user.client-certificate (a file; use client-certificate-data)"},
		{"CA file", func(c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.CertificateAuthorityData, c.CertificateAuthority = nil, "/etc/ssl/ca.pem"
		}, "clusters[c].cluster.certificate-authority (a file; use certificate-authority-data)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cluster, user := inlineCluster(), &clientcmdapi.AuthInfo{Token: "abc"}
			tc.edit(cluster, user)
			_, err := InlineRESTConfig(write(t, cluster, user))
			if !errors.Is(err, ErrNotInline) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("InlineRESTConfig = %v, want ErrNotInline naming %s", err, tc.field)
			}
		})
	}
}

// A user that is not the current context's is checked too: a later
// context switch, by marina or by client-go's defaults, must not reach it.
func TestInlineRESTConfigChecksEveryUser(t *testing.T) {
	cfg := clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"c": inlineCluster()},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"u": {Token: "abc"}, "other": {TokenFile: "/etc/shadow"}},
		Contexts:       map[string]*clientcmdapi.Context{"c": {Cluster: "c", AuthInfo: "u"}},
		CurrentContext: "c",
	}
	data, err := clientcmd.Write(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := InlineRESTConfig(data); !errors.Is(err, ErrNotInline) || !strings.Contains(err.Error(), "users[other].user.tokenFile") {
		t.Errorf("InlineRESTConfig = %v, want the other user's tokenFile refused", err)
	}
}

func TestInlineRESTConfigAcceptsInlineCredentials(t *testing.T) {
	for _, user := range []*clientcmdapi.AuthInfo{
		{Token: "abc"},
		{ClientCertificateData: []byte("cert"), ClientKeyData: []byte("key")},
	} {
		cfg, err := InlineRESTConfig(write(t, inlineCluster(), user))
		if err != nil {
			t.Fatalf("inline credentials: %v", err)
		}
		if cfg.Host != "https://127.0.0.1:6443" || string(cfg.CAData) != "ca" || cfg.BearerToken != user.Token || string(cfg.KeyData) != string(user.ClientKeyData) {
			t.Errorf("config %+v does not carry the kubeconfig's server and credentials", cfg)
		}
	}
	if _, err := InlineRESTConfig([]byte("clusters: [")); err == nil || errors.Is(err, ErrNotInline) {
		t.Errorf("a kubeconfig that does not parse: %v, want a parse error", err)
	}
}

func inlineCluster() *clientcmdapi.Cluster {
	return &clientcmdapi.Cluster{Server: "https://127.0.0.1:6443", CertificateAuthorityData: []byte("ca")}
}

func write(t *testing.T, cluster *clientcmdapi.Cluster, user *clientcmdapi.AuthInfo) []byte {
	t.Helper()
	data, err := clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"c": cluster},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"u": user},
		Contexts:       map[string]*clientcmdapi.Context{"c": {Cluster: "c", AuthInfo: "u"}},
		CurrentContext: "c",
	})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

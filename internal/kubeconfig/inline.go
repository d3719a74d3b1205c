package kubeconfig

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ErrNotInline is wrapped by InlineRESTConfig's refusals.
var ErrNotInline = errors.New("a kubeconfig given to marina may hold only inline credentials")

// InlineRESTConfig is the client config of a kubeconfig that someone else
// wrote: a cluster's kubeconfig Secret, made by a user for a cluster run
// elsewhere (docs/security.md). client-go honours fields that read a file
// on the host (tokenFile, client-certificate, client-key,
// certificate-authority) or run a program (exec, auth-provider); from a
// Secret they would run commands as marina's controller or send its own
// service-account token to whoever wrote the server address. Every
// cluster and user in the file is checked, not only the current
// context's, and each refusal names the field.
func InlineRESTConfig(data []byte) (*rest.Config, error) {
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return nil, fmt.Errorf("parsing the kubeconfig: %w", err)
	}
	if refused := notInline(cfg); len(refused) > 0 {
		return nil, fmt.Errorf("%w; remove %s", ErrNotInline, strings.Join(refused, ", "))
	}
	return clientcmd.NewDefaultClientConfig(*cfg, &clientcmd.ConfigOverrides{}).ClientConfig()
}

// notInline names the fields of cfg that read a file or run a program, in
// the kubeconfig's own spelling, sorted.
func notInline(cfg *clientcmdapi.Config) []string {
	var out []string
	for name, c := range cfg.Clusters {
		if c.CertificateAuthority != "" {
			out = append(out, fmt.Sprintf("clusters[%s].cluster.certificate-authority (a file; use certificate-authority-data)", name))
		}
	}
	for name, u := range cfg.AuthInfos {
		field := func(f, why string) { out = append(out, fmt.Sprintf("users[%s].user.%s (%s)", name, f, why)) }
		if u.ClientCertificate != "" {
			field("client-certificate", "a file; use client-certificate-data")
		}
		if u.ClientKey != "" {
			field("client-key", "a file; use client-key-data")
		}
		if u.TokenFile != "" {
			field("tokenFile", "a file; use token")
		}
		if u.Exec != nil {
			field("exec", "runs a program")
		}
		if u.AuthProvider != nil {
			field("auth-provider", "runs a plugin")
		}
	}
	slices.Sort(out)
	return out
}

package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/clusterpki"
)

// probeTimeout bounds one look at the endpoint.
const probeTimeout = 2 * time.Second

// endpointReady reports whether the cluster's endpoint answers /readyz ok:
// the first API server is up and the endpoint sends to it. API servers
// serve /readyz to anyone (system:public-info-viewer), so no credential is
// sent; the server is verified with the cluster CA.
func endpointReady(ctx context.Context, cluster *clusterv1.Cluster, set *clusterpki.Set) bool {
	ep := cluster.Spec.ControlPlaneEndpoint
	if ep.Host == "" || set == nil || set.CA == nil {
		return false
	}
	pool := x509.NewCertPool()
	pool.AddCert(set.CA.Cert)
	client := &http.Client{
		Timeout:   probeTimeout,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true},
	}
	url := fmt.Sprintf("https://%s/readyz", net.JoinHostPort(ep.Host, strconv.Itoa(int(ep.Port))))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

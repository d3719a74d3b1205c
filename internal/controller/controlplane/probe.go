package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/bootstrap"
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
	url := fmt.Sprintf("https://%s/readyz", net.JoinHostPort(ep.Host, strconv.Itoa(int(ep.Port))))
	return answersOK(ctx, verifiedClient(set), url)
}

// verifiedClient checks servers with the cluster CA and keeps no
// connection open between looks.
func verifiedClient(set *clusterpki.Set) *http.Client {
	pool := x509.NewCertPool()
	if set != nil && set.CA != nil {
		pool.AddCert(set.CA.Cert)
	}
	return &http.Client{Timeout: probeTimeout, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true}}
}

// probeMachines checks every control-plane machine's components directly,
// not through the endpoint: its Node is Ready, its API server answers
// /readyz (verified with the cluster CA), its controller manager and
// scheduler answer /healthz. It returns why each unhealthy machine is
// unhealthy, "" for a healthy one. The controller manager and scheduler
// serve a self-signed certificate, as under kubeadm: those two probes do
// not verify it and send nothing but the path.
func probeMachines(ctx context.Context, set *clusterpki.Set, machines []clusterv1.Machine) map[string]string {
	verified := verifiedClient(set)
	selfSigned := &http.Client{Timeout: probeTimeout, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true}} //nolint:gosec // health paths only, no credential sent
	out := make(map[string]string, len(machines))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range machines {
		m := &machines[i]
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		wg.Go(func() {
			why := probeMachine(ctx, verified, selfSigned, m)
			mu.Lock()
			out[m.Name] = why
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

func probeMachine(ctx context.Context, verified, selfSigned *http.Client, m *clusterv1.Machine) string {
	ip := address(m)
	if ip == "" || !machineReady(m) {
		return "its Node is not Ready"
	}
	for _, p := range []struct {
		component string
		client    *http.Client
		port      int
		path      string
	}{
		{"kube-apiserver", verified, bootstrap.DefaultAPIServerPort, "/readyz"},
		{"kube-controller-manager", selfSigned, bootstrap.DefaultControllerManagerPort, "/healthz"},
		{"kube-scheduler", selfSigned, bootstrap.DefaultSchedulerPort, "/healthz"},
	} {
		if !answersOK(ctx, p.client, fmt.Sprintf("https://%s%s", net.JoinHostPort(ip, strconv.Itoa(p.port)), p.path)) {
			return p.component + " does not answer " + p.path
		}
	}
	return ""
}

func answersOK(ctx context.Context, c *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmanager "sigs.k8s.io/controller-runtime/pkg/manager"

	"marina.dev/marina/internal/manager"
	"marina.dev/marina/internal/plane"
	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/internal/webhook"
	"marina.dev/marina/provider"
)

func newControllerCommand() *cobra.Command {
	var kubeconfig, localDir, sshDir, binDir, webhookService, webhookHost, registryAddr string
	var endpointAddrs []string
	webhookPort := 9443
	// The serving key is kept in the state directory (mode 0700), never
	// under a fixed name in the shared /tmp, where another local user could
	// make the directory first and read or replace the key.
	certs := webhook.CertOptions{SecretName: "marina-webhook-tls", Dir: filepath.Join(envOr("MARINA_STATE_DIR", defaultStateDir()), "webhook-certs")}
	var externalKinds []string
	opts := manager.Options{
		LeaderElection:          true,
		LeaderElectionNamespace: "marina-system",
		MetricsAddr:             ":8443",
		SecureMetrics:           true,
		HealthAddr:              ":8081",
	}
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run marina's controllers against an existing Kubernetes cluster",
		Long: `controller runs the same controllers as marina up against any Kubernetes
cluster that has marina's CRDs installed (kubectl apply -k config/default).
Replicas elect a leader, so only one acts at a time. Without --kubeconfig it
uses the in-cluster configuration, as in the Deployment under config/.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkLoopback(opts.PprofAddr); err != nil {
				return fmt.Errorf("--pprof-bind-address: %w", err)
			}
			cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				return fmt.Errorf("loading kubeconfig: %w", err)
			}
			if localDir != "" {
				c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
				if err != nil {
					return fmt.Errorf("building client: %w", err)
				}
				planeID, err := plane.ID(cmd.Context(), c)
				if err != nil {
					return err
				}
				endpoints, err := parseEndpointAddresses(endpointAddrs)
				if err != nil {
					return err
				}
				local, err := newLocalProvider(localDir, binDir, planeID, endpoints, registryAddr)
				if err != nil {
					return err
				}
				opts.Providers = append(opts.Providers, local)
			}
			if sshDir != "" {
				hosts, err := newSSHProvider(sshDir, binDir)
				if err != nil {
					return err
				}
				opts.Providers = append(opts.Providers, hosts)
			}
			for _, k := range externalKinds {
				gvk, err := provider.ParseKind(k)
				if err != nil {
					return err
				}
				opts.ExternalKinds = append(opts.ExternalKinds, gvk)
			}
			ctx := ctrl.SetupSignalHandler()
			var renewer ctrlmanager.Runnable
			if webhookPort != 0 {
				if certs.Namespace, certs.Service, err = splitNamespacedName(webhookService); err != nil {
					return fmt.Errorf("--webhook-service: %w", err)
				}
				if webhookHost != "" {
					certs.Hosts = []string{webhookHost}
				}
				c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
				if err != nil {
					return fmt.Errorf("building client: %w", err)
				}
				if err := os.MkdirAll(certs.Dir, 0o700); err != nil {
					return fmt.Errorf("creating --webhook-cert-dir: %w", err)
				}
				if err := webhook.EnsureServingCert(ctx, c, certs, time.Now()); err != nil {
					return err
				}
				renewer = webhook.CertRenewer(c, certs, 12*time.Hour)
				opts.Webhook = &manager.WebhookOptions{Host: webhookHost, Port: webhookPort, CertDir: certs.Dir}
			}
			mgr, err := manager.New(ctx, cfg, opts)
			if err != nil {
				return err
			}
			if renewer != nil {
				if err := mgr.Add(renewer); err != nil {
					return err
				}
			}
			if opts.HealthAddr != "0" {
				if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
					return err
				}
				if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
					return err
				}
				if opts.Webhook != nil {
					if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
						return err
					}
				}
			}
			return mgr.Start(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the cluster to run against (default: in-cluster)")
	f.BoolVar(&opts.LeaderElection, "leader-elect", opts.LeaderElection, "elect a leader among replicas")
	f.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", opts.LeaderElectionNamespace, "namespace of the leader election Lease")
	f.StringVar(&localDir, "local-provider-dir", "", "run the local provider, keeping machine sandboxes in this directory (empty: no local provider)")
	f.StringSliceVar(&endpointAddrs, "endpoint-addresses", nil, endpointAddressesUsage)
	f.StringVar(&sshDir, "ssh-provider-dir", "", "run the SSH provider (kind SSHMachine), keeping its record of which host each machine holds in this directory (empty: no SSH provider)")
	f.StringVar(&binDir, "bin-dir", envOr("MARINA_BIN_DIR", defaultBinDir()), "directory holding the components make setup built: the control-plane versions the local provider can run and the SSH provider copies to hosts (env MARINA_BIN_DIR)")
	f.StringVar(&registryAddr, "registry", "", "host:port of the OCI registry (plain HTTP, on this host) the local provider's real machines pull their images from, such as the one marina up runs; without it no real machine can be made")
	f.DurationVar(&opts.OrphanGrace, "orphan-grace", 2*time.Minute, "how long a machine or endpoint of a provider that no object names is left before it is removed")
	f.BoolVar(&opts.ReportUnowned, "report-unowned", true, "report machines whose providerSpec kind no provider owns (leave it on in exactly one controller)")
	f.StringSliceVar(&externalKinds, "external-provider-kinds", nil, "providerSpec kinds owned by provider processes elsewhere, as group/version/Kind (not reported as unowned)")
	f.IntVar(&webhookPort, "webhook-port", webhookPort, "port of the admission webhook the API server calls to check marina's objects (0: serve none)")
	f.StringVar(&webhookHost, "webhook-host", "", "address the webhook listens on, also put in its serving certificate: for a controller outside the cluster, the host of marina init's --webhook-url (default: every address, for the Service)")
	f.StringVar(&webhookService, "webhook-service", "marina-system/marina-webhook", "namespace/name of the Service in front of the webhook; its serving certificate is issued for <name>.<namespace>.svc")
	f.StringVar(&certs.SecretName, "webhook-cert-secret", certs.SecretName, "Secret, in the webhook Service's namespace, that holds the webhook's own CA and serving certificate (created if missing)")
	f.StringVar(&certs.Dir, "webhook-cert-dir", certs.Dir, "directory the serving certificate is written to for the webhook server")
	f.StringVar(&opts.MetricsAddr, "metrics-bind-address", opts.MetricsAddr, `address of the metrics endpoint ("0" disables it)`)
	f.BoolVar(&opts.SecureMetrics, "metrics-secure", opts.SecureMetrics, "serve metrics over HTTPS, only to callers allowed to get /metrics (ClusterRole marina-metrics-reader)")
	f.StringVar(&opts.HealthAddr, "health-probe-bind-address", opts.HealthAddr, `address of /healthz and /readyz ("0" disables them)`)
	f.StringVar(&opts.PprofAddr, "pprof-bind-address", "", `address of Go's /debug/pprof profiles, unauthenticated: give a loopback one ("" disables it)`)
	return cmd
}

// splitNamespacedName splits "namespace/name".
func splitNamespacedName(s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(s, "/")
	if !ok || namespace == "" || name == "" {
		return "", "", fmt.Errorf("%q is not namespace/name", s)
	}
	return namespace, name, nil
}

// checkLoopback refuses an address that is not on a loopback interface:
// what is served there has no authentication. "" and "0" serve nothing.
func checkLoopback(addr string) error {
	if addr == "" || addr == "0" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("%s is not a loopback address: profiles are served without authentication", addr)
	}
	return nil
}

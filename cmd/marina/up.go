package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"marina.dev/marina/internal/capabilities"
	"marina.dev/marina/internal/crds"
	"marina.dev/marina/internal/manager"
	"marina.dev/marina/internal/plane"
	"marina.dev/marina/internal/registry"
	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/internal/webhook"
	"marina.dev/marina/provider"
	"marina.dev/marina/provider/local"
	sshprov "marina.dev/marina/provider/ssh"
	"marina.dev/marina/tools"
)

// upLogFile is where marina up writes its controllers' log without -v.
func upLogFile(stateDir string) string { return filepath.Join(stateDir, "logs", "marina.log") }

func newUpCommand() *cobra.Command {
	var logFile string // empty with -v: the log goes to stderr
	var machinesDir string
	var orphanGrace time.Duration
	var endpointAddrs []string
	pinned := tools.Pinned()
	opts := plane.Options{
		StateDir:    envOr("MARINA_STATE_DIR", defaultStateDir()),
		BinDir:      envOr("MARINA_BIN_DIR", defaultBinDir()),
		KubeVersion: pinned.NewestKube(),
		EtcdVersion: pinned.Etcd,
		APIPort:     plane.DefaultAPIPort,
		EtcdPort:    plane.DefaultEtcdPort,
		WebhookPort: plane.DefaultWebhookPort,
		// The real nodes' images (issue 32).
		RegistryPort:    registry.DefaultPort,
		RegistryVersion: pinned.Registry,
	}
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run the embedded management plane (etcd, kube-apiserver, controllers) until interrupted",
		Long: `up starts a real etcd and kube-apiserver on loopback from the binaries that
make setup built, installs marina's CRDs, and runs every marina controller in
this process. State, including every object, lives in the state directory and
survives a restart. Stop it with Ctrl-C (SIGINT) or SIGTERM.

It prints its progress and, once ready, how to reach it. The controllers log
to logs/marina.log in the state directory; with -v N they log to stderr
instead, at verbosity N (-v 0 included).`,
		Args: cobra.NoArgs,
		// Instead of the root's: the controllers' log goes to a file unless
		// -v asks for it, so that a person sees the progress and the banner.
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			v := cmd.Flags().Lookup("v")
			verbosity, _ := strconv.Atoi(v.Value.String())
			if v.Changed {
				setLogger(cmd.ErrOrStderr(), verbosity)
				return nil
			}
			logFile = upLogFile(opts.StateDir)
			if err := os.MkdirAll(filepath.Dir(logFile), 0o700); err != nil {
				return fmt.Errorf("creating the log directory: %w", err)
			}
			f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
			if err != nil {
				return fmt.Errorf("opening the controllers' log: %w", err)
			}
			// Open until the process ends: the controllers log until then.
			setLogger(f, verbosity)
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if machinesDir == "" {
				machinesDir = filepath.Join(opts.StateDir, "machines")
			}
			endpoints, err := parseEndpointAddresses(endpointAddrs)
			if err != nil {
				return err
			}
			return runUp(ctx, cmd, opts, logFile, machinesDir, orphanGrace, endpoints)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.StateDir, "state-dir", opts.StateDir, "directory holding the management plane's data, certificates and kubeconfig (env MARINA_STATE_DIR)")
	f.StringVar(&opts.BinDir, "bin-dir", opts.BinDir, "directory holding the components built by make setup (env MARINA_BIN_DIR)")
	f.StringVar(&opts.KubeVersion, "kube-version", opts.KubeVersion, fmt.Sprintf("Kubernetes release of the management plane, one of %v", pinned.Kube))
	f.IntVar(&opts.APIPort, "api-port", opts.APIPort, "kube-apiserver port on 127.0.0.1")
	f.IntVar(&opts.EtcdPort, "etcd-port", opts.EtcdPort, "etcd client port on 127.0.0.1 (the peer port is the next one)")
	f.IntVar(&opts.WebhookPort, "webhook-port", opts.WebhookPort, "port on 127.0.0.1 of marina's admission webhook, which the API server calls to check every marina object")
	f.IntVar(&opts.RegistryPort, "registry-port", opts.RegistryPort, "port on 127.0.0.1 of the OCI registry the real nodes pull their images from (make images' are pushed to it at start)")
	f.DurationVar(&orphanGrace, "orphan-grace", 2*time.Minute, "how long a machine sandbox or endpoint that no object names is left before it is removed")
	f.StringSliceVar(&endpointAddrs, "endpoint-addresses", nil, endpointAddressesUsage)
	f.StringVar(&machinesDir, "machines-dir", "", "directory holding the local provider's machine sandboxes (default: machines in the state directory); a target of marina move on this host uses the source's")
	return cmd
}

func runUp(ctx context.Context, cmd *cobra.Command, opts plane.Options, logFile, machinesDir string, orphanGrace time.Duration, endpoints []netip.Prefix) error {
	out := cmd.OutOrStdout()
	opts.Progress = out
	p, err := plane.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(out, "stopping the management plane")
		if err := p.Stop(); err != nil {
			fmt.Fprintln(cmd.ErrOrStderr(), "Error:", err)
		}
	}()

	c, err := client.New(p.Config(), client.Options{Scheme: scheme.New()})
	if err != nil {
		return fmt.Errorf("building client: %w", err)
	}
	if err := crds.Install(ctx, c); err != nil {
		return fmt.Errorf("installing marina's CRDs: %w", err)
	}
	// The controllers publish what they can run there (marina init makes
	// it for marina controller).
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: capabilities.Namespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", ns.Name, err)
	}
	planeID, err := plane.ID(ctx, c)
	if err != nil {
		return err
	}
	pushImages(ctx, out, p.RegistryAddress(), filepath.Join(opts.BinDir, "images"))
	local, err := newLocalProvider(machinesDir, opts.BinDir, planeID, endpoints, p.RegistryAddress())
	if err != nil {
		return err
	}
	hosts, err := newSSHProvider(filepath.Join(opts.StateDir, "ssh-machines"), opts.BinDir)
	if err != nil {
		return err
	}
	certDir, certName, keyName := p.WebhookCert()
	mgr, err := manager.New(ctx, p.Config(), manager.Options{
		MetricsAddr:   "0",
		HealthAddr:    "0",
		Providers:     []provider.Provider{local, hosts},
		ReportUnowned: true,
		OrphanGrace:   orphanGrace,
		Webhook: &manager.WebhookOptions{
			Host: "127.0.0.1", Port: opts.WebhookPort,
			CertDir: certDir, CertName: certName, KeyName: keyName,
		},
	})
	if err != nil {
		return err
	}
	mgrCtx, stopManager := context.WithCancel(ctx)
	defer stopManager()
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- mgr.Start(mgrCtx) }()
	if err := installWebhook(ctx, c, mgr, p, mgrDone); err != nil {
		return err
	}

	fmt.Fprintf(out, "\nThe marina management plane is up (Kubernetes %s).\n", opts.KubeVersion)
	fmt.Fprintf(out, "  export KUBECONFIG=%s\n", p.AdminKubeconfig())
	fmt.Fprintf(out, "  kubectl get marina\n")
	if logFile != "" {
		fmt.Fprintf(out, "The controllers log to %s (marina up -v 1 prints it here).\n", logFile)
	}
	fmt.Fprintf(out, "Press Ctrl-C to stop; everything is kept in %s.\n", opts.StateDir)

	select {
	case <-ctx.Done():
		stopManager()
		if err := <-mgrDone; err != nil {
			return fmt.Errorf("controllers: %w", err)
		}
		return nil
	case <-p.Failed():
		stopManager()
		<-mgrDone
		return fmt.Errorf("the management plane failed: %w", p.Err())
	case err := <-mgrDone:
		if err == nil {
			err = errors.New("stopped unexpectedly")
		}
		return fmt.Errorf("controllers: %w", err)
	}
}

// installWebhook waits until the in-process admission webhook answers, then
// points the API server at it. Until then, and whenever marina is down,
// writes of marina's kinds are refused (failure policy Fail): nothing
// unchecked is stored.
func installWebhook(ctx context.Context, c client.Client, mgr ctrl.Manager, p *plane.Plane, mgrDone <-chan error) error {
	started := mgr.GetWebhookServer().StartedChecker()
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		select {
		case err := <-mgrDone:
			return false, fmt.Errorf("controllers stopped before the webhook started: %w", err)
		default:
		}
		return started(nil) == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the admission webhook on %s: %w", p.WebhookURL(), err)
	}
	cfg, err := webhook.Configuration(p.WebhookURL(), p.CAData())
	if err != nil {
		return err
	}
	return webhook.Install(ctx, c, cfg)
}

// pushImages pushes make images' tarballs (the pause image, CoreDNS's,
// the test images) to the registry at addr. Without them no real node's
// pod can start, but a simulated fleet needs none: marina up says so and
// goes on.
func pushImages(ctx context.Context, out io.Writer, addr, dir string) {
	start := time.Now()
	pushed, err := registry.PushDir(ctx, addr, dir)
	if err != nil {
		fmt.Fprintf(out, "warning: the real nodes' images are not all in the registry at %s, so their pods cannot start: %v\n", addr, err)
		return
	}
	fmt.Fprintf(out, "the registry at %s serves %s (%s)\n", addr, strings.Join(pushed, ", "), time.Since(start).Round(10*time.Millisecond))
}

// newLocalProvider keeps sandboxes under root and starts their agents with
// this very binary (marina node-agent). binDir holds the control-plane
// versions it can run; the real machines pull their images from the
// registry at registryAddr.
func newLocalProvider(root, binDir, planeID string, endpoints []netip.Prefix, registryAddr string) (*local.Provider, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the marina binary for node agents: %w", err)
	}
	realOpts := local.RealOptions{ContainerdVersion: tools.Pinned().Containerd, Registry: registryAddr}
	return local.New(local.Options{Root: root, AgentCommand: []string{exe, "node-agent"}, LoadBalancerCommand: []string{exe, "load-balancer"},
		BinDir: binDir, Plane: planeID, EndpointAddresses: endpoints, Real: realOpts})
}

// newSSHProvider keeps its records of machines under stateDir and copies
// this very binary to hosts as their node agent; binDir holds the
// control-plane components it copies.
func newSSHProvider(stateDir, binDir string) (*sshprov.Provider, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the marina binary for node agents: %w", err)
	}
	return sshprov.New(sshprov.Options{StateDir: stateDir, AgentBinary: exe, BinDir: binDir})
}

// endpointAddressesUsage is the --endpoint-addresses flag's help, the same
// for marina up and marina controller.
const endpointAddressesUsage = "addresses of this host (IPs or CIDRs, e.g. the host's end of a bridge to servers) where a Cluster's own spec.controlPlaneEndpoint may make the local provider listen; a Cluster that sets it at another address of this host is refused (default: none)"

// parseEndpointAddresses reads --endpoint-addresses: IPs or CIDRs.
func parseEndpointAddresses(in []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(in))
	for _, s := range in {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("--endpoint-addresses: %q is neither an IP address nor a CIDR", s)
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

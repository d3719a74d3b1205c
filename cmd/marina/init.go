package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"marina.dev/marina/internal/install"
	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/internal/version"
)

func newInitCommand() *cobra.Command {
	var kf kubeconfigFlags
	var output string
	var dryRun bool
	timeout := 5 * time.Minute
	opts := install.Options{Image: version.Get().Image, Replicas: 2}
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Install marina's CRDs, RBAC, admission checks and controller into an existing cluster, and check that they work",
		Long: `init installs marina into the cluster every marina command finds (see
marina --help): the CRDs, least-privilege RBAC, the admission webhook and
tenancy policy, and the controller Deployment. It applies them server-side,
so running it again changes nothing, and a newer marina upgrades in place.

It then waits until these post-conditions hold (M18), and prints each:
  - every CRD is established;
  - the tenancy admission policy is bound;
  - the controller Deployment has rolled out (not with --webhook-url);
  - a controller replica holds the leader Lease and renews it;
  - the admission webhook answers (a dry-run Machine it must refuse).

With --webhook-url the controller runs outside the cluster, on a host the API
server can reach: start it there with
  marina controller --kubeconfig PATH --webhook-host HOST --webhook-port PORT`,
		Example: `  # into the cluster of the current kubectl context
  marina init --image registry.example.com/marina:v0.1.0

  # the controller runs on this host, next to the API server
  marina init --kubeconfig admin.kubeconfig --webhook-url https://127.0.0.1:9443 &
  marina controller --kubeconfig admin.kubeconfig --webhook-host 127.0.0.1 --webhook-port 9443

  # only print what would be applied
  marina init --dry-run -o yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			objs, err := install.Objects(opts)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if dryRun {
				return printObjects(out, output, objs)
			}
			cfg, err := kf.restConfig(kf.clientConfig())
			if err != nil {
				return err
			}
			c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
			if err != nil {
				return fmt.Errorf("connecting to %s: %w", cfg.Host, err)
			}
			// The checks' probe draws the webhook's warnings about its
			// made-up cluster: they would only confuse.
			checkCfg := rest.CopyConfig(cfg)
			checkCfg.WarningHandler = rest.NoWarnings{}
			checker, err := client.New(checkCfg, client.Options{Scheme: scheme.New()})
			if err != nil {
				return fmt.Errorf("connecting to %s: %w", cfg.Host, err)
			}
			return runInit(cmd.Context(), out, c, checker, cfg.Host, opts, objs, timeout)
		},
	}
	f := cmd.Flags()
	kf.add(f)
	f.StringVar(&opts.Image, "image", opts.Image, "image of the controller Deployment (default: the image of this marina's version, make image; its entry point is /marina)")
	f.Int32Var(&opts.Replicas, "replicas", opts.Replicas, "controller replicas; one leads, the others stand by and serve the webhook")
	f.StringVar(&opts.WebhookURL, "webhook-url", "", "https URL of a controller running outside the cluster: install no Deployment and send admission checks there")
	f.DurationVar(&timeout, "timeout", timeout, "how long to wait for the post-conditions")
	f.BoolVar(&dryRun, "dry-run", false, "print the objects instead of applying them")
	f.StringVarP(&output, "output", "o", "yaml", "format of --dry-run: yaml or json")
	return cmd
}

func runInit(ctx context.Context, out io.Writer, c, checker client.Client, host string, opts install.Options, objs []*unstructured.Unstructured, timeout time.Duration) error {
	start := time.Now()
	fmt.Fprintf(out, "installing marina into %s\n", host)
	results, err := install.Apply(ctx, c, objs)
	for _, r := range results {
		fmt.Fprintf(out, "  %s\n", r)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "post-conditions (up to %s):\n", timeout)
	waitCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err = install.Wait(waitCtx, checker, install.Checks(opts, objs, time.Now), 500*time.Millisecond, func(ch install.Check) {
		fmt.Fprintf(out, "  ✓ %s (%s)\n", ch.Name, time.Since(start).Round(100*time.Millisecond))
	})
	if err != nil {
		if opts.InCluster() {
			return fmt.Errorf("%w: see kubectl -n %s get pods,events", err, install.Namespace)
		}
		return fmt.Errorf("%w: is marina controller running against this cluster and reachable at %s?", err, opts.WebhookURL)
	}
	fmt.Fprintf(out, "marina is installed: %d objects applied, every post-condition holds (%s)\n", len(results), time.Since(start).Round(100*time.Millisecond))
	return nil
}

// printObjects writes objs as one YAML stream or a JSON list.
func printObjects(w io.Writer, format string, objs []*unstructured.Unstructured) error {
	switch format {
	case "yaml":
		for _, obj := range objs {
			data, err := yaml.Marshal(obj.Object)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "---\n%s", data)
		}
		return nil
	case "json":
		list := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "v1", "kind": "List"}}
		for _, obj := range objs {
			list.Items = append(list.Items, *obj)
		}
		data, err := list.MarshalJSON()
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", data)
		return err
	}
	return fmt.Errorf("-o %q: want yaml or json", format)
}

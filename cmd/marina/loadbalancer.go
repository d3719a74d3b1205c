package main

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"marina.dev/marina/internal/loadbalancer"
)

func newLoadBalancerCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "load-balancer --dir DIR",
		Short: "Run a cluster's control-plane endpoint (started by the local provider)",
		Long: `load-balancer is the control-plane endpoint of one local cluster: a TCP load
balancer that passes connections, TLS untouched, to the cluster's API servers
that answer /readyz. marina starts it, detached, in its own directory, and it
reads only that directory: config.json (listen address, backends, health-check
periods), ca.pem and, optionally, client.pem and client-key.pem (mode 0600)
for the checks. It applies changes to those files within a second. One
balancer runs per directory: a second one exits at once. SIGTERM or Ctrl-C
stops it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ctx = klog.NewContext(ctx, klog.Background().WithName("load-balancer"))
			return loadbalancer.RunDir(ctx, dir)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the load balancer's directory, holding config.json")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}

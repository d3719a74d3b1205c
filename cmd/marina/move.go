package main

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"marina.dev/marina/internal/move"
	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/provider/ssh"
)

// stopAfterWritesEnv, for tests only, ends marina move after that many
// writes, as if it were killed there.
const stopAfterWritesEnv = "MARINA_MOVE_STOP_AFTER_WRITES"

func newMoveCommand() *cobra.Command {
	var mf managementFlags
	var toKubeconfig, toContext string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "move --to-kubeconfig PATH",
		Short: "Hand every cluster of a namespace to another management plane, machines running on",
		Long: `move hands the namespace's clusters, with their machines, sets, deployments,
health checks, and the Secrets, ConfigMaps and MachineClasses they use, to
another management plane where marina's CRDs are installed (marina init) and
marina's controller runs. It pauses the source, waits until its controllers
stopped acting, creates the objects paused on the target (owners first,
owner references rebuilt, status copied), unpauses them, waits until the
target's controllers took them over, and deletes them from the source last
without running their deletion: no machine is made, deleted or restarted.

Killed or failed at any point, run it again: it finds what it did on both
planes and finishes. Machines on SSH hosts are refused, named, before
anything is paused: their provider's records of which host each holds stay
in the source plane's state directory. For the local provider the target must run on the same
host over the same machine directory (marina up --machines-dir, or marina
controller --local-provider-dir), see docs/cli.md.`,
		Example: `  marina up --state-dir ~/mgmt2 --api-port 7443 --etcd-port 7379 --webhook-port 7444 --machines-dir ~/.local/state/marina/machines &
  marina move --to-kubeconfig ~/mgmt2/admin.kubeconfig -n default`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			source, err := mf.client()
			if err != nil {
				return err
			}
			rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: toKubeconfig}
			cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: toContext}).ClientConfig()
			if err != nil {
				return fmt.Errorf("loading the target's kubeconfig %s: %w", toKubeconfig, err)
			}
			if cfg.Host == mf.config.Host {
				return fmt.Errorf("the target %s is the source: pass the other management plane's kubeconfig", cfg.Host)
			}
			target, err := client.New(cfg, client.Options{Scheme: scheme.New()})
			if err != nil {
				return fmt.Errorf("connecting to the target: %w", err)
			}
			opts := move.Options{Source: source, Target: target, Namespace: mf.namespace, Out: cmd.OutOrStdout(), Timeout: timeout,
				Providers: move.Providers{ssh.GroupVersion.WithKind(ssh.Kind): ssh.Moving}}
			if v := os.Getenv(stopAfterWritesEnv); v != "" {
				if opts.StopAfterWrites, err = strconv.Atoi(v); err != nil {
					return fmt.Errorf("%s: %w", stopAfterWritesEnv, err)
				}
			}
			return move.Run(cmd.Context(), opts)
		},
	}
	mf.add(cmd)
	f := cmd.Flags()
	f.StringVar(&toKubeconfig, "to-kubeconfig", "", "kubeconfig of the target management plane (required)")
	f.StringVar(&toContext, "to-context", "", "context of --to-kubeconfig to use (default: its current context)")
	f.DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for each plane's controllers (the source's to stop, the target's to take over)")
	_ = cmd.MarkFlagRequired("to-kubeconfig")
	return cmd
}

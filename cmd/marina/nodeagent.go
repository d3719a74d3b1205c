package main

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"marina.dev/marina/internal/nodeagent"
)

func newNodeAgentCommand() *cobra.Command {
	var dir, pool string
	cmd := &cobra.Command{
		Use:   "node-agent --sandbox DIR | --pool DIR",
		Short: "Run the simulated kubelet of a local machine (started by the local provider)",
		Long: `node-agent is the agent of one local machine: the local provider starts it,
detached, in the machine's sandbox directory. It reads only that directory
(bootstrap.json), registers the machine's Node in its workload cluster with the
bootstrap token, keeps the Node's Lease and Ready condition fresh and reports
the pods bound to the Node as running. One agent runs per sandbox: a second
one exits at once. SIGTERM or Ctrl-C stops it.

With --pool it runs the agents of many worker sandboxes of one cluster in one
process (LocalMachine spec.agent: Pooled): the local provider lists them as
files in DIR/members, and each keeps its own sandbox, lock, credential, Node,
Lease and log.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if pool != "" {
				return nodeagent.RunPool(ctx, pool)
			}
			return nodeagent.Run(ctx, dir)
		},
	}
	cmd.Flags().StringVar(&dir, "sandbox", "", "the machine's sandbox directory, holding bootstrap.json")
	cmd.Flags().StringVar(&pool, "pool", "", "a pool's directory: run the agents of the sandboxes its members directory lists")
	cmd.MarkFlagsOneRequired("sandbox", "pool")
	cmd.MarkFlagsMutuallyExclusive("sandbox", "pool")
	return cmd
}

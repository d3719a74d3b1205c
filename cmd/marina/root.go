package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"

	"marina.dev/marina/internal/version"
	"marina.dev/marina/tools"
)

func newRootCommand() *cobra.Command {
	verbosity := 0
	root := &cobra.Command{
		Use:           "marina",
		Short:         "marina declares Kubernetes clusters and machines as objects and makes them real",
		Long:          "marina declares Kubernetes clusters and machines as objects and makes them real.\n\n" + kubeconfigHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRun: func(cmd *cobra.Command, _ []string) {
			setLogger(cmd.ErrOrStderr(), verbosity)
		},
	}
	root.PersistentFlags().IntVarP(&verbosity, "v", "v", 0, "log verbosity")
	root.AddCommand(newUpCommand(), newControllerCommand(), newVersionCommand())
	root.AddCommand(newNodeAgentCommand())
	root.AddCommand(newLoadBalancerCommand())
	root.AddCommand(newUpgradeCommand(), newDescribeCommand(), newKubeconfigCommand(), newCreateCommand(), newDeleteCommand(), newInitCommand(), newRolloutCommand(), newMoveCommand())
	return root
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print marina's version, source revision and controller image, and its pinned components",
		Long: `version prints marina's version and the source revision it was built from,
the controller image of this version (what marina init installs unless
--image says otherwise), and the versions of the components make setup
builds.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			i := version.Get()
			v := tools.Pinned()
			revision := i.Revision
			if revision == "" {
				revision = "unknown"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "marina %s\nrevision %s\nimage %s\netcd %s\nkubernetes %s\n",
				i.Version, revision, i.Image, v.Etcd, strings.Join(v.Kube, " "))
			return nil
		},
	}
}

// setLogger sends the log of controller-runtime and klog to w. The
// controller-runtime logger can be set only once in a process.
func setLogger(w io.Writer, verbosity int) {
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(verbosity), textlogger.Output(w)))
	ctrl.SetLogger(logger)
	klog.SetLogger(logger)
}

// envOr returns the environment variable's value, or def when it is unset.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// defaultStateDir follows the XDG base directory convention:
// $XDG_STATE_HOME/marina, else ~/.local/state/marina.
func defaultStateDir() string {
	if dir := os.Getenv("XDG_STATE_HOME"); dir != "" {
		return filepath.Join(dir, "marina")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "marina-state")
	}
	return filepath.Join(home, ".local", "state", "marina")
}

// defaultBinDir is the directory of the marina executable: make build puts
// marina into bin/ beside the components make setup builds.
func defaultBinDir() string {
	exe, err := os.Executable()
	if err != nil {
		return "bin"
	}
	if resolved, err := filepath.EvalSymlinks(exe); err == nil {
		exe = resolved
	}
	return filepath.Dir(exe)
}

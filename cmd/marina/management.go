package main

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/plane"
	"marina.dev/marina/internal/scheme"
)

// kubeconfigHelp is how every verb finds the management plane; marina
// --help states it once.
const kubeconfigHelp = `Every command that talks to a management plane finds it as kubectl does:
--kubeconfig, else $KUBECONFIG (a list of files, merged), else the
kubeconfig of marina up while one runs on the state directory
($MARINA_STATE_DIR, else $XDG_STATE_HOME/marina, else ~/.local/state/marina),
else ~/.kube/config. --context, --cluster and --user pick from it, and the
namespace defaults to the context's (else "default").`

// kubeconfigFlags find the management plane (see kubeconfigHelp): client-go's
// loading rules and overrides, with marina up's kubeconfig in the chain.
type kubeconfigFlags struct {
	kubeconfig string
	overrides  clientcmd.ConfigOverrides
}

func (f *kubeconfigFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the management plane (default: $KUBECONFIG, else marina up's while it runs, else ~/.kube/config)")
	fs.StringVar(&f.overrides.CurrentContext, "context", "", "kubeconfig context to use (default: its current context)")
	fs.StringVar(&f.overrides.Context.Cluster, "cluster", "", "kubeconfig cluster to use (default: the context's)")
	fs.StringVar(&f.overrides.Context.AuthInfo, "user", "", "kubeconfig user to use (default: the context's)")
}

// clientConfig is the kubeconfig the flags select, loaded lazily.
func (f *kubeconfigFlags) clientConfig() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	if f.kubeconfig == "" && os.Getenv(clientcmd.RecommendedConfigPathEnvVar) == "" {
		dir := envOr("MARINA_STATE_DIR", defaultStateDir())
		if running, err := plane.Running(dir); err == nil && running {
			rules.ExplicitPath = plane.AdminKubeconfig(dir)
		}
	}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &f.overrides)
}

// restConfig reaches the management plane.
func (f *kubeconfigFlags) restConfig(cc clientcmd.ClientConfig) (*rest.Config, error) {
	cfg, err := cc.ClientConfig()
	if err != nil {
		from := f.kubeconfig
		if from == "" {
			from = strings.Join(cc.ConfigAccess().GetLoadingPrecedence(), string(os.PathListSeparator))
		}
		return nil, fmt.Errorf("loading kubeconfig %s: %w (pass --kubeconfig, set KUBECONFIG, or start marina up)", from, err)
	}
	return cfg, nil
}

// managementFlags are kubeconfigFlags and -n, for the verbs that act on
// marina's objects.
type managementFlags struct {
	kubeconfigFlags
	// namespace is -n until client resolves it: the context's namespace
	// when -n is not given.
	namespace string
	config    *rest.Config
}

func (f *managementFlags) add(cmd *cobra.Command) {
	f.kubeconfigFlags.add(cmd.PersistentFlags())
	cmd.PersistentFlags().StringVarP(&f.namespace, "namespace", "n", "", "namespace of the object (default: the context's, else default)")
}

// client connects to the management plane and resolves the namespace.
func (f *managementFlags) client() (client.Client, error) {
	cc := f.clientConfig()
	cfg, err := f.restConfig(cc)
	if err != nil {
		return nil, err
	}
	if f.namespace == "" {
		if f.namespace, _, err = cc.Namespace(); err != nil {
			return nil, fmt.Errorf("reading the context's namespace: %w", err)
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return nil, fmt.Errorf("connecting to the management plane: %w", err)
	}
	f.config = cfg
	return c, nil
}

// get reads the object called name in the namespace of -n, with an error
// naming it.
func (f *managementFlags) get(ctx context.Context, c client.Client, name string, obj client.Object) error {
	if err := c.Get(ctx, types.NamespacedName{Namespace: f.namespace, Name: name}, obj); err != nil {
		kind := strings.ToLower(reflect.TypeOf(obj).Elem().Name())
		return fmt.Errorf("reading %s %s/%s: %w", kind, f.namespace, name, err)
	}
	return nil
}

// completeClusters completes a cluster name from the management plane.
func (f *managementFlags) completeClusters(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, err := f.client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var list clusterv1.ClusterList
	if err := c.List(cmd.Context(), &list, client.InNamespace(f.namespace)); err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	names := make([]string, 0, len(list.Items))
	for _, cl := range list.Items {
		names = append(names, cl.Name)
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/scheme"
)

// managementFlags find the management plane as kubectl does (--kubeconfig,
// --context, -n), except that without --kubeconfig and $KUBECONFIG they
// use marina up's admin kubeconfig: the embedded management plane is the
// default one.
type managementFlags struct {
	kubeconfig, context, namespace string
}

func (f *managementFlags) add(cmd *cobra.Command) {
	def := os.Getenv("KUBECONFIG")
	if def == "" {
		def = filepath.Join(envOr("MARINA_STATE_DIR", defaultStateDir()), "admin.kubeconfig")
	}
	cmd.PersistentFlags().StringVar(&f.kubeconfig, "kubeconfig", def, "kubeconfig of the management plane (default $KUBECONFIG, else marina up's)")
	cmd.PersistentFlags().StringVar(&f.context, "context", "", "kubeconfig context to use (default: its current context)")
	cmd.PersistentFlags().StringVarP(&f.namespace, "namespace", "n", "default", "namespace of the object")
}

func (f *managementFlags) client() (client.Client, error) {
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: f.kubeconfig}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: f.context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w (start the management plane with marina up, or pass --kubeconfig)", f.kubeconfig, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return nil, fmt.Errorf("connecting to the management plane: %w", err)
	}
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

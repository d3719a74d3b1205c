package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/class"
	"marina.dev/marina/internal/describe"
	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/remote"
)

func newDescribeCommand() *cobra.Command {
	var mf managementFlags
	var output, showConditions string
	cmd := &cobra.Command{
		Use:   "describe",
		Short: "Show a cluster as a tree of its objects, or one machine",
	}
	mf.add(cmd)
	cmd.PersistentFlags().StringVarP(&output, "output", "o", "", "json or yaml for scripts; a tree when empty")

	clusterCmd := &cobra.Command{
		Use:   "cluster NAME",
		Short: "Draw a cluster as a tree: control plane, machine deployments, sets and machines, each with its state",
		Example: `  marina describe cluster ha
  marina describe cluster ha --show-conditions all
  marina describe cluster ha -o yaml`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: mf.completeClusters,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := mf.client()
			if err != nil {
				return err
			}
			objs, err := clusterObjects(cmd.Context(), c, mf.namespace, args[0])
			if err != nil {
				return err
			}
			tree := describe.Cluster(objs, time.Now())
			if output != "" {
				return printAs(cmd.OutOrStdout(), output, tree)
			}
			if showConditions != "" && showConditions != "all" {
				return fmt.Errorf("--show-conditions takes all, not %q", showConditions)
			}
			return describe.Render(cmd.OutOrStdout(), tree, describe.Options{Color: isTerminal(cmd.OutOrStdout()), AllConditions: showConditions == "all"})
		},
	}
	clusterCmd.Flags().StringVar(&showConditions, "show-conditions", "", "all: list every condition of every object")

	machineCmd := &cobra.Command{
		Use:     "machine NAME",
		Short:   "Show a machine, its class and its merged provider configuration",
		Example: `  marina describe machine ha-cp-0 -n default`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := mf.client()
			if err != nil {
				return err
			}
			m := &clusterv1.Machine{}
			if err := mf.get(cmd.Context(), c, args[0], m); err != nil {
				return err
			}
			view := describe.MachineView{Machine: m}
			var mc *clusterv1.MachineClass
			if ref := m.Spec.ClassRef; ref != nil {
				view.Class = ref.Name
				mc = &clusterv1.MachineClass{}
				switch err := c.Get(cmd.Context(), types.NamespacedName{Name: ref.Name}, mc); {
				case apierrors.IsNotFound(err):
					// The machine runs on; what its class gave it cannot be shown.
					mc, view.ClassGone = nil, true
				case err != nil:
					return fmt.Errorf("reading machine class %s: %w", ref.Name, err)
				}
			}
			resolved, err := class.Merge(mc, &m.Spec)
			if err != nil {
				view.MergeError = err.Error()
			} else {
				view.ProviderSpec = json.RawMessage(resolved.ProviderSpec.Raw)
				view.NodeLabels, view.NodeTaints = resolved.Labels, resolved.Taints
			}
			if output != "" {
				return printAs(cmd.OutOrStdout(), output, view)
			}
			return describe.PrintMachine(cmd.OutOrStdout(), view, time.Now(), describe.Options{Color: isTerminal(cmd.OutOrStdout()), AllConditions: true})
		},
	}
	cmd.AddCommand(clusterCmd, machineCmd)
	return cmd
}

func newKubeconfigCommand() *cobra.Command {
	var mf managementFlags
	var outputFile string
	cmd := &cobra.Command{
		Use:   "kubeconfig CLUSTER",
		Short: "Print a workload cluster's admin kubeconfig, or write it to a file (mode 0600)",
		Example: `  marina kubeconfig minimal > minimal.kubeconfig
  marina kubeconfig minimal --output-file ~/.kube/minimal && kubectl --kubeconfig ~/.kube/minimal get nodes`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: mf.completeClusters,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := mf.client()
			if err != nil {
				return err
			}
			secret := &corev1.Secret{}
			key := types.NamespacedName{Namespace: mf.namespace, Name: remote.KubeconfigSecretName(args[0])}
			if err := c.Get(cmd.Context(), key, secret); err != nil {
				return fmt.Errorf("reading the kubeconfig of cluster %s/%s (Secret %s): %w; is the cluster made yet? marina describe cluster %s says",
					mf.namespace, args[0], key.Name, err, args[0])
			}
			data := secret.Data[remote.KubeconfigSecretKey]
			if len(data) == 0 {
				return fmt.Errorf("secret %s has no key %q", key.Name, remote.KubeconfigSecretKey)
			}
			if outputFile == "" {
				_, err := cmd.OutOrStdout().Write(data)
				return err
			}
			if err := os.MkdirAll(filepath.Dir(outputFile), 0o700); err != nil {
				return err
			}
			if err := files.WriteAtomic(outputFile, data, 0o600); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "Wrote the admin kubeconfig of %s to %s (mode 0600).\n", args[0], outputFile)
			return nil
		},
	}
	mf.add(cmd)
	cmd.Flags().StringVar(&outputFile, "output-file", "", "write the kubeconfig here (mode 0600) instead of printing it")
	return cmd
}

// clusterObjects lists a cluster and everything of it.
func clusterObjects(ctx context.Context, c client.Client, namespace, name string) (describe.Objects, error) {
	o := describe.Objects{Cluster: &clusterv1.Cluster{}}
	if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, o.Cluster); err != nil {
		return o, fmt.Errorf("reading cluster %s/%s: %w", namespace, name, err)
	}
	// Every machine, set and deployment names its cluster in spec.clusterName.
	var ms clusterv1.MachineList
	var sets clusterv1.MachineSetList
	var mds clusterv1.MachineDeploymentList
	for _, list := range []client.ObjectList{&ms, &sets, &mds} {
		if err := c.List(ctx, list, client.InNamespace(namespace)); err != nil {
			return o, fmt.Errorf("listing %T: %w", list, err)
		}
	}
	o.Machines = slices.DeleteFunc(ms.Items, func(m clusterv1.Machine) bool { return m.Spec.ClusterName != name })
	o.MachineSets = slices.DeleteFunc(sets.Items, func(s clusterv1.MachineSet) bool { return s.Spec.ClusterName != name })
	o.MachineDeployments = slices.DeleteFunc(mds.Items, func(d clusterv1.MachineDeployment) bool { return d.Spec.ClusterName != name })
	return o, nil
}

func printAs(w io.Writer, format string, v any) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		data, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(data)
		return err
	}
	return fmt.Errorf("-o takes json or yaml, not %q", format)
}

// isTerminal: w is a terminal (colour), not a pipe or a file.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

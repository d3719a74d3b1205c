package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/describe"
	"marina.dev/marina/internal/names"
)

// defaultLocalMachine is the providerSpec of machines made without --class.
const defaultLocalMachine = `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","pods":110}}`

type createOptions struct {
	controlPlanes, workers int32
	version, class         string
	wait, dryRun           bool
	output                 string
	timeout                time.Duration
}

func newCreateCommand() *cobra.Command {
	var mf managementFlags
	var o createOptions
	cmd := &cobra.Command{Use: "create", Short: "Create a cluster"}
	mf.add(cmd)
	clusterCmd := &cobra.Command{
		Use:   "cluster NAME",
		Short: "Create a cluster: its control plane and a MachineDeployment of workers",
		Example: `  marina create cluster dev --control-planes 1 --workers 2 --wait
  marina create cluster ha --control-planes 3 --workers 3 --version v1.36.3 --class ha-standard
  marina create cluster dev --dry-run -o yaml | kubectl apply -f -`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.dryRun {
				// As kubectl create --dry-run: the namespace only when -n names one.
				return printManifests(cmd.OutOrStdout(), o.output, clusterManifests(args[0], mf.namespace, o))
			}
			c, err := mf.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if err := createAll(ctx, cmd.OutOrStdout(), c, mf.config, clusterManifests(args[0], mf.namespace, o)); err != nil {
				return err
			}
			if !o.wait {
				fmt.Fprintf(cmd.OutOrStdout(), "Follow it with: marina describe cluster %s -n %s\n", args[0], mf.namespace)
				return nil
			}
			return follow(ctx, cmd.OutOrStdout(), o.timeout, func(ctx context.Context) ([]describe.Stage, string, error) {
				objs, err := clusterObjects(ctx, c, mf.namespace, args[0])
				if err != nil {
					return nil, "", err
				}
				return describe.Creation(objs), describe.Failed(objs), nil
			})
		},
	}
	f := clusterCmd.Flags()
	f.Int32Var(&o.controlPlanes, "control-planes", 1, "control-plane machines (1, 3 or 5)")
	f.Int32Var(&o.workers, "workers", 2, "worker machines (a MachineDeployment NAME-workers; 0 for none)")
	f.StringVar(&o.version, "version", "v1.37.2", "Kubernetes version")
	f.StringVar(&o.class, "class", "", "MachineClass of every machine (default: a local machine of 2 CPUs and 4Gi)")
	f.BoolVar(&o.wait, "wait", false, "show progress until the cluster is Ready; exit non-zero if it fails or --timeout passes")
	f.DurationVar(&o.timeout, "timeout", 15*time.Minute, "with --wait, how long to wait")
	f.BoolVar(&o.dryRun, "dry-run", false, "print the objects instead of creating them")
	f.StringVarP(&o.output, "output", "o", "yaml", "with --dry-run: yaml or json")
	cmd.AddCommand(clusterCmd)
	return cmd
}

// clusterManifests are the objects marina create cluster makes.
func clusterManifests(name, namespace string, o createOptions) []client.Object {
	cluster := &clusterv1.Cluster{
		TypeMeta:   metav1.TypeMeta{APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: clusterv1.ClusterSpec{ControlPlane: clusterv1.ControlPlaneSpec{
			Version: clusterv1.KubernetesVersion(o.version), Replicas: o.controlPlanes,
		}},
	}
	machine := clusterv1.MachineSpec{ClusterName: name, Roles: []clusterv1.MachineRole{clusterv1.WorkerRole},
		Versions: clusterv1.MachineVersions{Kubelet: clusterv1.KubernetesVersion(o.version)}}
	if o.class != "" {
		cluster.Spec.ControlPlane.ClassRef = &clusterv1.MachineClassReference{Name: o.class}
		machine.ClassRef = &clusterv1.MachineClassReference{Name: o.class}
	} else {
		cluster.Spec.ControlPlane.ProviderSpec = &runtime.RawExtension{Raw: []byte(defaultLocalMachine)}
		machine.ProviderSpec = &runtime.RawExtension{Raw: []byte(defaultLocalMachine)}
	}
	objs := []client.Object{cluster}
	if o.workers > 0 {
		workers := workersName(name)
		labels := map[string]string{"marina.dev/pool": workers}
		n := o.workers
		objs = append(objs, &clusterv1.MachineDeployment{
			TypeMeta:   metav1.TypeMeta{APIVersion: clusterv1.GroupVersion.String(), Kind: "MachineDeployment"},
			ObjectMeta: metav1.ObjectMeta{Name: workers, Namespace: namespace},
			Spec: clusterv1.MachineDeploymentSpec{
				ClusterName: name, Replicas: &n,
				Selector: metav1.LabelSelector{MatchLabels: labels},
				Template: clusterv1.MachineTemplateSpec{ObjectMeta: clusterv1.MachineTemplateMeta{Labels: labels}, Spec: machine},
			},
		})
	}
	return objs
}

// maxWorkersName is the longest name of the workers' MachineDeployment
// whose machines' names stay DNS labels (at most 63 characters: a machine's
// name is its Node's, and the Node's kubernetes.io/hostname label): a machine
// is named <deployment>-<template hash, up to 10>-<5 random>.
const maxWorkersName = validation.DNS1123LabelMaxLength - 1 - 10 - 1 - 5

// workersName is the name of the cluster's workers' MachineDeployment,
// which is also the value of its marina.dev/pool label: NAME-workers, or,
// when that is too long, a prefix of NAME and a hash of the whole, so that
// two long names sharing a prefix still differ.
func workersName(cluster string) string {
	return names.Fit(cluster, "-workers", maxWorkersName)
}

// createAll creates objs, but first sends each to the API server as a
// server-side dry run (schema, admission webhook, quotas), so that an
// object the server refuses, or one that exists already, stops the
// command before it has created anything.
func createAll(ctx context.Context, out io.Writer, c client.Client, cfg *rest.Config, objs []client.Object) error {
	// The webhook warns that the workers' Cluster does not exist yet: it is
	// what a dry run before the creation means, and the creation itself
	// shows the warnings that matter.
	quiet := rest.CopyConfig(cfg)
	quiet.WarningHandler = rest.NoWarnings{}
	dry, err := client.New(quiet, client.Options{Scheme: c.Scheme()})
	if err != nil {
		return fmt.Errorf("connecting to the management plane: %w", err)
	}
	for _, obj := range objs {
		kind := obj.GetObjectKind().GroupVersionKind().Kind
		if err := dry.Create(ctx, obj.DeepCopyObject().(client.Object), client.DryRunAll); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("%s %s/%s exists already; nothing was created: delete it first, or choose another name", kind, obj.GetNamespace(), obj.GetName())
			}
			return fmt.Errorf("checking %s %s/%s (server-side dry run); nothing was created: %w", kind, obj.GetNamespace(), obj.GetName(), err)
		}
	}
	for _, obj := range objs {
		kind := obj.GetObjectKind().GroupVersionKind().Kind // Create clears it
		if err := c.Create(ctx, obj); err != nil {
			return fmt.Errorf("creating %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
		}
		fmt.Fprintf(out, "created %s/%s\n", kind, obj.GetName())
	}
	return nil
}

// printManifests prints objs as a user would write them: YAML documents,
// or in JSON, as kubectl create --dry-run=client -o json does, the object
// alone or a List of them.
func printManifests(w io.Writer, format string, objs []client.Object) error {
	if format != "yaml" && format != "json" {
		return fmt.Errorf("-o takes yaml or json, not %q", format)
	}
	items := make([]any, 0, len(objs))
	for _, o := range objs {
		// What a user would write: no status, no empty fields.
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			return err
		}
		delete(obj, "status")
		pruneEmpty(obj)
		items = append(items, obj)
	}
	if format == "json" {
		if len(items) == 1 {
			return printAs(w, "json", items[0])
		}
		return printAs(w, "json", map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	}
	for i, obj := range items {
		if i > 0 {
			fmt.Fprintln(w, "---")
		}
		if err := printAs(w, "yaml", obj); err != nil {
			return err
		}
	}
	return nil
}

// pruneEmpty removes empty maps from m, depth first.
func pruneEmpty(m map[string]any) {
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			pruneEmpty(sub)
			if len(sub) == 0 {
				delete(m, k)
			}
		}
	}
}

func newDeleteCommand() *cobra.Command {
	var mf managementFlags
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{Use: "delete", Short: "Delete a cluster"}
	mf.add(cmd)
	clusterCmd := &cobra.Command{
		Use:               "cluster NAME",
		Short:             "Delete a cluster and everything of it: machines, processes, endpoint",
		Example:           `  marina delete cluster dev --wait`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: mf.completeClusters,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := mf.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			key := types.NamespacedName{Namespace: mf.namespace, Name: args[0]}
			objs, err := clusterObjects(ctx, c, mf.namespace, args[0])
			if err != nil {
				return err
			}
			total := len(objs.Machines)
			if err := c.Delete(ctx, objs.Cluster); err != nil {
				return fmt.Errorf("deleting cluster %s: %w", key, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleting cluster %s with its %d machines\n", key, total)
			if !wait {
				return nil
			}
			return follow(ctx, cmd.OutOrStdout(), timeout, func(ctx context.Context) ([]describe.Stage, string, error) {
				objs, err := clusterObjects(ctx, c, mf.namespace, args[0])
				if apierrors.IsNotFound(errors.Unwrap(err)) {
					return []describe.Stage{{Name: "machines deleted", Count: total, Total: total, Done: true}, {Name: "cluster gone", Done: true}}, "", nil
				}
				if err != nil {
					return nil, "", err
				}
				left := len(objs.Machines)
				return []describe.Stage{{Name: "machines deleted", Count: total - left, Total: total, Done: left == 0}, {Name: "cluster gone"}}, "", nil
			})
		},
	}
	clusterCmd.Flags().BoolVar(&wait, "wait", false, "show progress until the cluster is gone")
	clusterCmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "with --wait, how long to wait")
	cmd.AddCommand(clusterCmd)
	return cmd
}

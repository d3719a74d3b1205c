package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/capabilities"
	"marina.dev/marina/internal/controller/controlplane"
	"marina.dev/marina/internal/upgrade"
	"marina.dev/marina/provider"
)

func newUpgradeCommand() *cobra.Command {
	var mf managementFlags
	cmd := &cobra.Command{
		Use:   "upgrade",
		Short: "Plan, follow and roll back a cluster's control-plane upgrade",
		Long: `An upgrade starts when spec.controlPlane.version of a Cluster changes
(kubectl patch or apply). These commands show what it will do and how far
it has come, and roll back a step that failed.`,
	}
	mf.add(cmd)

	var to string
	plan := &cobra.Command{
		Use:   "plan CLUSTER --to VERSION",
		Short: "Print the steps an upgrade to VERSION would take; changes nothing",
		Long: `plan prints the steps an upgrade to VERSION would take, and refuses what
the version rules refuse and a version the controller cannot run: it asks
the running controller (ConfigMap marina-system/marina-capabilities, which
marina up and marina controller keep current), not the host the command
runs on. It changes nothing.`,
		Example:           `  marina upgrade plan upgrade --to v1.37.2`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: mf.completeClusters,
		RunE: func(cmd *cobra.Command, args []string) error {
			if to == "" {
				return fmt.Errorf("--to is required: the version to upgrade to, e.g. --to v1.37.2")
			}
			ctx := cmd.Context()
			o, err := observe(ctx, &mf, args[0])
			if err != nil {
				return err
			}
			prov, err := controlPlaneProvider(ctx, o.client, o.cluster)
			if err != nil {
				return err
			}
			return printPlan(cmd.OutOrStdout(), o, to, prov)
		},
	}
	plan.Flags().StringVar(&to, "to", "", "the version to upgrade to, e.g. v1.37.2")
	plan.Flags().String("bin-dir", "", "ignored")
	_ = plan.Flags().MarkDeprecated("bin-dir", "ignored: the versions come from the controller (ConfigMap "+capabilities.Namespace+"/"+capabilities.Name+")")

	status := &cobra.Command{
		Use:               "status CLUSTER",
		Short:             "Print the versions each control-plane machine's components run, and the upgrade's state",
		Example:           `  watch marina upgrade status upgrade`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: mf.completeClusters,
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := observe(cmd.Context(), &mf, args[0])
			if err != nil {
				return err
			}
			printStatus(cmd.OutOrStdout(), o)
			return nil
		},
	}

	rollback := &cobra.Command{
		Use:   "rollback CLUSTER",
		Short: "Return the current or failed upgrade step to its previous version",
		Long: `Rollback returns the step the upgrade is on (usually one that halted
with StepTimeout) to the version it came from, and holds the upgrade
until the Cluster's spec changes: fix what failed, or choose another
version, and it goes on.`,
		Example: `  marina upgrade rollback upgrade
  kubectl patch cluster upgrade --type=merge -p '{"spec":{"controlPlane":{"components":{"apiServer":{"extraArgs":null}}}}}'`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: mf.completeClusters,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := mf.client()
			if err != nil {
				return err
			}
			cluster := &clusterv1.Cluster{}
			if err := mf.get(cmd.Context(), c, args[0], cluster); err != nil {
				return err
			}
			st := cluster.Status.Upgrade
			if st == nil || st.CompletedAt != nil || st.Current == nil {
				return fmt.Errorf("cluster %s has no upgrade step under way to roll back", args[0])
			}
			patch := client.MergeFrom(cluster.DeepCopy())
			if cluster.Annotations == nil {
				cluster.Annotations = map[string]string{}
			}
			cluster.Annotations[clusterv1.UpgradeRollbackAnnotation] = strconv.FormatInt(cluster.Generation, 10)
			if err := c.Patch(cmd.Context(), cluster, patch); err != nil {
				return fmt.Errorf("asking for the rollback: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Rolling back %s to %s; follow it with: marina upgrade status %s\n",
				stepName(st.Current), st.Current.From, args[0])
			return nil
		},
	}
	cmd.AddCommand(plan, status, rollback)
	return cmd
}

// observed is a cluster with its control-plane machines and workers.
type observed struct {
	client   client.Client
	cluster  *clusterv1.Cluster
	machines []clusterv1.Machine
	workers  map[string]string
	deploys  []clusterv1.MachineDeployment
}

func observe(ctx context.Context, mf *managementFlags, name string) (*observed, error) {
	c, err := mf.client()
	if err != nil {
		return nil, err
	}
	o := &observed{client: c, cluster: &clusterv1.Cluster{}}
	if err := mf.get(ctx, c, name, o.cluster); err != nil {
		return nil, err
	}
	if o.machines, err = (&controlplane.ControlPlane{Live: c}).Machines(ctx, o.cluster); err != nil {
		return nil, err
	}
	if o.workers, o.deploys, err = controlplane.Workers(ctx, c, o.cluster, false); err != nil {
		return nil, err
	}
	return o, nil
}

// controlPlaneProvider is what the controller's provider of the cluster's
// control plane can run, as the controller published it.
func controlPlaneProvider(ctx context.Context, c client.Client, cluster *clusterv1.Cluster) (capabilities.Provider, error) {
	caps, err := capabilities.Read(ctx, c)
	if err != nil {
		return capabilities.Provider{}, err
	}
	spec := cluster.Spec.ControlPlane
	var raw []byte
	if spec.ProviderSpec != nil {
		raw = spec.ProviderSpec.Raw
	}
	kind := kindOf(raw)
	if kind.Kind == "" && spec.ClassRef != nil {
		mc := &clusterv1.MachineClass{}
		if err := c.Get(ctx, types.NamespacedName{Name: spec.ClassRef.Name}, mc); err != nil {
			return capabilities.Provider{}, fmt.Errorf("reading MachineClass %s of cluster %s's control plane: %w", spec.ClassRef.Name, cluster.Name, err)
		}
		kind = kindOf(mc.Spec.ProviderSpec.Raw)
	}
	if kind.Kind == "" {
		return capabilities.Provider{}, fmt.Errorf("cluster %s: its control plane names no providerSpec kind (spec.controlPlane.providerSpec or classRef): the controller cannot make it either", cluster.Name)
	}
	prov, ok := caps.For(kind)
	if !ok {
		running := []string{"none"}
		if len(caps.Providers) > 0 {
			running = nil
		}
		for _, p := range caps.Providers {
			running = append(running, fmt.Sprintf("%s (%s)", p.Name, strings.Join(p.Kinds, ", ")))
		}
		return capabilities.Provider{}, fmt.Errorf("cluster %s: no provider in the marina controller runs the control plane's providerSpec kind %q; it runs %s",
			cluster.Name, provider.FormatKind(kind), strings.Join(running, "; "))
	}
	return prov, nil
}

// kindOf reads apiVersion and kind of a providerSpec; empty when it has
// none.
func kindOf(raw []byte) schema.GroupVersionKind {
	var tm metav1.TypeMeta
	if len(raw) == 0 || json.Unmarshal(raw, &tm) != nil {
		return schema.GroupVersionKind{}
	}
	return tm.GroupVersionKind()
}

// printPlan prints the steps of an upgrade of o to version, assuming every
// machine stays healthy; it refuses what the version rules refuse (M19),
// then a version prov, the controller's provider of the control plane,
// cannot run.
func printPlan(w io.Writer, o *observed, version string, prov capabilities.Provider) error {
	from, all := controlplane.OldestAPIServer(o.machines)
	if !all {
		return fmt.Errorf("cluster %s: a control-plane machine has not reported its API server's version yet (it is being made): try again when marina describe cluster %s shows every machine Running", o.cluster.Name, o.cluster.Name)
	}
	if err := upgrade.Check(from, version, nil); err != nil {
		return fmt.Errorf("cluster %s cannot be upgraded to %s: %w", o.cluster.Name, version, err)
	}
	if !prov.CanRun(version) {
		return fmt.Errorf("cluster %s cannot be upgraded to %s: the controller's provider %s cannot run it; it can run %s (build %s where the controller runs: make setup)",
			o.cluster.Name, version, prov.Name, strings.Join(prov.KubernetesVersions, ", "), version)
	}
	in := controlplane.UpgradeInput(o.cluster, version, o.machines, nil, o.workers)
	if !upgrade.Needed(in) {
		fmt.Fprintf(w, "Cluster %s runs %s already: nothing to do.\n", o.cluster.Name, version)
		return nil
	}
	var todo []upgrade.Step
	for _, s := range upgrade.Steps(in) {
		if s.Kind != upgrade.SetComponent || s.From != s.To {
			todo = append(todo, s)
		}
	}
	fmt.Fprintf(w, "Upgrade of cluster %s/%s from %s to %s (%s): %d steps, each once the step before is healthy.\n",
		o.cluster.Namespace, o.cluster.Name, from, version, in.Strategy, len(todo))
	for i, s := range todo {
		line := s.String()
		if s.Kind == upgrade.RollWorkers {
			var names []string
			for _, d := range o.deploys {
				names = append(names, d.Name)
			}
			line += " (MachineDeployments " + strings.Join(names, ", ") + ", within their maxSurge and maxUnavailable)"
		}
		fmt.Fprintf(w, "%3d  %s\n", i+1, line)
	}
	fmt.Fprintf(w, "Nothing was changed. To start: kubectl patch cluster %s -n %s --type=merge -p '{\"spec\":{\"controlPlane\":{\"version\":%q}}}'\n",
		o.cluster.Name, o.cluster.Namespace, version)
	return nil
}

// printStatus prints the upgrade's state and a table of machines ×
// components × versions, as the components report them.
func printStatus(w io.Writer, o *observed) {
	c := o.cluster
	fmt.Fprintf(w, "Cluster %s/%s: spec version %s", c.Namespace, c.Name, c.Spec.ControlPlane.Version)
	if cond := meta.FindStatusCondition(c.Status.Conditions, clusterv1.ClusterUpgradeProgressingCondition); cond != nil {
		fmt.Fprintf(w, "; UpgradeProgressing=%s (%s)", cond.Status, cond.Reason)
		if cond.Message != "" {
			fmt.Fprintf(w, ": %s", cond.Message)
		}
	}
	fmt.Fprintln(w)
	if st := c.Status.Upgrade; st != nil {
		done := 0
		for _, s := range st.Steps {
			if s.State == clusterv1.UpgradeStepDone {
				done++
			}
		}
		fmt.Fprintf(w, "Upgrade %s → %s (%s): %d of %d steps done", st.From, st.To, st.Strategy, done, len(st.Steps))
		if st.Current != nil {
			fmt.Fprintf(w, "; current: %s, %s", stepName(st.Current), st.Current.State)
		}
		fmt.Fprintln(w)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MACHINE\tKUBE-APISERVER\tKUBE-CONTROLLER-MANAGER\tKUBE-SCHEDULER\tETCD\tKUBELET\tENDPOINT")
	for i := range o.machines {
		m := &o.machines[i]
		v := m.Status.Versions.ControlPlane
		if v == nil {
			v = &clusterv1.ComponentVersions{}
		}
		endpoint := "in"
		if controlplane.Drained(m) {
			endpoint = "out (upgrading)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Name, dash(v.APIServer), dash(v.ControllerManager), dash(v.Scheduler),
			dash(v.Etcd), dash(m.Status.Versions.Kubelet), endpoint)
	}
	tw.Flush()
	counts := map[string]int{}
	n := 0
	for name, v := range o.workers {
		if !strings.HasPrefix(name, "deployment/") {
			counts[dash(v)]++
			n++
		}
	}
	if n > 0 {
		var parts []string
		for v, k := range counts {
			parts = append(parts, fmt.Sprintf("%d at %s", k, v))
		}
		sort.Strings(parts)
		fmt.Fprintf(w, "Workers: %d, %s\n", n, strings.Join(parts, ", "))
	}
}

func stepName(s *clusterv1.UpgradeStep) string {
	if s.Component != "" {
		return fmt.Sprintf("%s on %s", s.Component, s.Machine)
	}
	if s.Machine != "" {
		return fmt.Sprintf("%s %s", s.Action, s.Machine)
	}
	return s.Action
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

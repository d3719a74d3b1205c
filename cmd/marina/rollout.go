package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// restartedAtAnnotation on a MachineDeployment's template is set by marina
// rollout restart: the changed template replaces every machine, as
// kubectl.kubernetes.io/restartedAt does for a Deployment's pods.
const restartedAtAnnotation = clusterv1.GroupName + "/restartedAt"

func newRolloutCommand() *cobra.Command {
	var mf managementFlags
	cmd := &cobra.Command{
		Use:   "rollout",
		Short: "Follow, pause, resume, undo or restart the rollout of a MachineDeployment, as kubectl rollout does for a Deployment",
		Long: `rollout acts on a MachineDeployment, named md/NAME (or
machinedeployment/NAME), as kubectl rollout acts on a Deployment.

pause sets the cluster.marina.dev/paused annotation: unlike a paused
Deployment, a paused MachineDeployment is not scaled either, until resume.`,
	}
	mf.add(cmd)

	var timeout time.Duration
	var watch bool
	status := &cobra.Command{
		Use:   "status md/NAME",
		Short: "Show the rollout's progress and wait until it is complete",
		Example: `  marina rollout status md/dev-workers
  marina rollout status md/dev-workers --watch=false`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDeployment(cmd, &mf, args, func(ctx context.Context, c client.Client, md *clusterv1.MachineDeployment) error {
				return rolloutStatus(ctx, cmd.OutOrStdout(), c, md, watch, timeout)
			})
		},
	}
	status.Flags().BoolVarP(&watch, "watch", "w", true, "wait until the rollout is complete")
	status.Flags().DurationVar(&timeout, "timeout", 0, "with --watch, how long to wait (0: no limit)")

	pause := &cobra.Command{
		Use:   "pause md/NAME",
		Short: "Stop the controller from rolling or scaling the deployment until resume",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDeployment(cmd, &mf, args, func(ctx context.Context, c client.Client, md *clusterv1.MachineDeployment) error {
				if _, ok := md.Annotations[clusterv1.PausedAnnotation]; ok {
					return fmt.Errorf("machinedeployment %s is already paused", md.Name)
				}
				return patchDeployment(ctx, cmd.OutOrStdout(), c, md, "paused", func(md *clusterv1.MachineDeployment) {
					if md.Annotations == nil {
						md.Annotations = map[string]string{}
					}
					md.Annotations[clusterv1.PausedAnnotation] = "marina rollout pause"
				})
			})
		},
	}
	resume := &cobra.Command{
		Use:   "resume md/NAME",
		Short: "Let the controller roll and scale a paused deployment again",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDeployment(cmd, &mf, args, func(ctx context.Context, c client.Client, md *clusterv1.MachineDeployment) error {
				if _, ok := md.Annotations[clusterv1.PausedAnnotation]; !ok {
					return fmt.Errorf("machinedeployment %s is not paused", md.Name)
				}
				return patchDeployment(ctx, cmd.OutOrStdout(), c, md, "resumed", func(md *clusterv1.MachineDeployment) {
					delete(md.Annotations, clusterv1.PausedAnnotation)
				})
			})
		},
	}
	var toRevision int64
	undo := &cobra.Command{
		Use:   "undo md/NAME",
		Short: "Roll the deployment back to its previous template, or to --to-revision",
		Example: `  marina rollout undo md/dev-workers
  marina rollout undo md/dev-workers --to-revision 2`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if toRevision < 0 {
				return fmt.Errorf("--to-revision is %d: give a revision number, or 0 for the previous one", toRevision)
			}
			return withDeployment(cmd, &mf, args, func(ctx context.Context, c client.Client, md *clusterv1.MachineDeployment) error {
				// The controller copies the revision's template and removes
				// the annotation (internal/controller/machinedeployment).
				did := fmt.Sprintf("rolling back to revision %d; marina rollout status md/%s follows it", toRevision, md.Name)
				if toRevision == 0 {
					did = fmt.Sprintf("rolling back to the previous revision; marina rollout status md/%s follows it", md.Name)
				}
				return patchDeployment(ctx, cmd.OutOrStdout(), c, md, did, func(md *clusterv1.MachineDeployment) {
					if md.Annotations == nil {
						md.Annotations = map[string]string{}
					}
					md.Annotations[clusterv1.RollbackToRevisionAnnotation] = strconv.FormatInt(toRevision, 10)
				})
			})
		},
	}
	undo.Flags().Int64Var(&toRevision, "to-revision", 0, "the revision to roll back to (0: the previous one)")
	restart := &cobra.Command{
		Use:   "restart md/NAME",
		Short: "Replace every machine of the deployment, within its rolling-update bounds",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDeployment(cmd, &mf, args, func(ctx context.Context, c client.Client, md *clusterv1.MachineDeployment) error {
				if _, ok := md.Annotations[clusterv1.PausedAnnotation]; ok {
					return fmt.Errorf("machinedeployment %s is paused: run marina rollout resume md/%s first", md.Name, md.Name)
				}
				return patchDeployment(ctx, cmd.OutOrStdout(), c, md, "restarted", func(md *clusterv1.MachineDeployment) {
					if md.Spec.Template.ObjectMeta.Annotations == nil {
						md.Spec.Template.ObjectMeta.Annotations = map[string]string{}
					}
					md.Spec.Template.ObjectMeta.Annotations[restartedAtAnnotation] = time.Now().UTC().Format(time.RFC3339)
				})
			})
		},
	}
	for _, sub := range []*cobra.Command{status, pause, resume, undo, restart} {
		sub.ValidArgsFunction = cobra.NoFileCompletions
		cmd.AddCommand(sub)
	}
	return cmd
}

// deploymentName reads md/NAME, machinedeployment/NAME or TYPE NAME, as
// kubectl reads its resources.
func deploymentName(args []string) (string, error) {
	typ, name, ok := strings.Cut(args[0], "/")
	if len(args) == 2 {
		if ok {
			return "", fmt.Errorf("give md/NAME or md NAME, not %s", strings.Join(args, " "))
		}
		typ, name, ok = args[0], args[1], true
	}
	if !ok || name == "" {
		return "", fmt.Errorf("give the deployment as md/NAME, not %q", args[0])
	}
	switch strings.ToLower(typ) {
	case "md", "machinedeployment", "machinedeployments", "machinedeployment.cluster.marina.dev", "machinedeployments.cluster.marina.dev":
		return name, nil
	}
	return "", fmt.Errorf("marina rollout acts on MachineDeployments (md/NAME), not %q", typ)
}

func withDeployment(cmd *cobra.Command, mf *managementFlags, args []string, do func(context.Context, client.Client, *clusterv1.MachineDeployment) error) error {
	name, err := deploymentName(args)
	if err != nil {
		return err
	}
	c, err := mf.client()
	if err != nil {
		return err
	}
	md := &clusterv1.MachineDeployment{}
	if err := mf.get(cmd.Context(), c, name, md); err != nil {
		return err
	}
	return do(cmd.Context(), c, md)
}

// patchDeployment changes md with a merge patch that carries its
// resourceVersion, so that a change made since it was read is not undone.
func patchDeployment(ctx context.Context, out io.Writer, c client.Client, md *clusterv1.MachineDeployment, did string, change func(*clusterv1.MachineDeployment)) error {
	before := md.DeepCopy()
	change(md)
	if err := c.Patch(ctx, md, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("updating machinedeployment %s/%s: %w", md.Namespace, md.Name, err)
	}
	fmt.Fprintf(out, "machinedeployment/%s %s\n", md.Name, did)
	return nil
}

// errRolloutStuck: the rollout cannot finish by waiting.
var errRolloutStuck = errors.New("the rollout cannot finish")

// rolloutProgress says, as kubectl rollout status does, where md's rollout
// is: a line to print, whether it is complete, and an error wrapping
// errRolloutStuck when waiting will not complete it.
func rolloutProgress(md *clusterv1.MachineDeployment) (line string, done bool, err error) {
	if _, ok := md.Annotations[clusterv1.PausedAnnotation]; ok {
		return "", false, fmt.Errorf("%w: machinedeployment %q is paused: marina rollout resume md/%s", errRolloutStuck, md.Name, md.Name)
	}
	if md.Status.ObservedGeneration < md.Generation {
		return "Waiting for machinedeployment spec update to be observed...", false, nil
	}
	if c := meta.FindStatusCondition(md.Status.Conditions, clusterv1.ProgressingCondition); c != nil {
		switch c.Reason {
		case clusterv1.ProgressDeadlineExceededReason:
			return "", false, fmt.Errorf("%w: machinedeployment %q exceeded its progress deadline: %s", errRolloutStuck, md.Name, c.Message)
		case clusterv1.RollbackFailedReason:
			return "", false, fmt.Errorf("%w: machinedeployment %q cannot roll back: %s", errRolloutStuck, md.Name, c.Message)
		}
	}
	want := int32(1)
	if md.Spec.Replicas != nil {
		want = *md.Spec.Replicas
	}
	s := md.Status
	switch {
	case s.UpdatedReplicas < want:
		return fmt.Sprintf("Waiting for machinedeployment %q rollout to finish: %d out of %d new machines have been updated...", md.Name, s.UpdatedReplicas, want), false, nil
	case s.Replicas > s.UpdatedReplicas:
		return fmt.Sprintf("Waiting for machinedeployment %q rollout to finish: %d old machines are pending termination...", md.Name, s.Replicas-s.UpdatedReplicas), false, nil
	case s.AvailableReplicas < s.UpdatedReplicas:
		return fmt.Sprintf("Waiting for machinedeployment %q rollout to finish: %d of %d updated machines are available...", md.Name, s.AvailableReplicas, s.UpdatedReplicas), false, nil
	}
	return fmt.Sprintf("machinedeployment %q successfully rolled out", md.Name), true, nil
}

// rolloutStatus prints md's progress, each line once, until the rollout is
// complete (or once, without watch).
func rolloutStatus(ctx context.Context, out io.Writer, c client.Client, md *clusterv1.MachineDeployment, watch bool, timeout time.Duration) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	last := ""
	for {
		line, done, err := rolloutProgress(md)
		if err != nil {
			return err
		}
		if line != last {
			fmt.Fprintln(out, line)
			last = line
		}
		if done || !watch {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the rollout of machinedeployment %s: %w", md.Name, ctx.Err())
		case <-time.After(time.Second):
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(md), md); err != nil {
			return fmt.Errorf("reading machinedeployment %s/%s: %w", md.Namespace, md.Name, err)
		}
	}
}

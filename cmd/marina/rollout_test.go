package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

func TestDeploymentName(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    string
		wantErr string
	}{
		{[]string{"md/dev-workers"}, "dev-workers", ""},
		{[]string{"machinedeployment/dev-workers"}, "dev-workers", ""},
		{[]string{"machinedeployments.cluster.marina.dev/dev-workers"}, "dev-workers", ""},
		{[]string{"md", "dev-workers"}, "dev-workers", ""},
		{[]string{"dev-workers"}, "", "md/NAME"},
		{[]string{"deployment/web"}, "", "not \"deployment\""},
		{[]string{"md/"}, "", "md/NAME"},
		{[]string{"md/a", "b"}, "", "not md/a b"},
	} {
		got, err := deploymentName(tc.args)
		switch {
		case tc.wantErr == "" && (err != nil || got != tc.want):
			t.Errorf("deploymentName(%q) = %q, %v; want %q", tc.args, got, err, tc.want)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("deploymentName(%q): got error %v, want one containing %q", tc.args, err, tc.wantErr)
		}
	}
}

// rolloutProgress says what kubectl rollout status says of a Deployment.
func TestRolloutProgress(t *testing.T) {
	md := func(gen, observed int64, replicas, current, updated, available int32, mutate ...func(*clusterv1.MachineDeployment)) *clusterv1.MachineDeployment {
		d := &clusterv1.MachineDeployment{
			ObjectMeta: metav1.ObjectMeta{Name: "w", Generation: gen},
			Spec:       clusterv1.MachineDeploymentSpec{Replicas: ptr.To(replicas)},
			Status: clusterv1.MachineDeploymentStatus{ObservedGeneration: observed, Replicas: current,
				UpdatedReplicas: updated, AvailableReplicas: available},
		}
		for _, m := range mutate {
			m(d)
		}
		return d
	}
	progressing := func(reason string) func(*clusterv1.MachineDeployment) {
		return func(d *clusterv1.MachineDeployment) {
			d.Status.Conditions = []metav1.Condition{{Type: clusterv1.ProgressingCondition, Status: metav1.ConditionFalse, Reason: reason, Message: "look at the new machines"}}
		}
	}
	for _, tc := range []struct {
		name  string
		md    *clusterv1.MachineDeployment
		line  string
		done  bool
		stuck string
	}{
		{"not observed", md(2, 1, 3, 3, 3, 3), "Waiting for machinedeployment spec update to be observed...", false, ""},
		{"updating", md(2, 2, 3, 4, 1, 1), `Waiting for machinedeployment "w" rollout to finish: 1 out of 3 new machines have been updated...`, false, ""},
		{"old ones going", md(2, 2, 3, 4, 3, 3), `Waiting for machinedeployment "w" rollout to finish: 1 old machines are pending termination...`, false, ""},
		{"not yet available", md(2, 2, 3, 3, 3, 2), `Waiting for machinedeployment "w" rollout to finish: 2 of 3 updated machines are available...`, false, ""},
		{"complete", md(2, 2, 3, 3, 3, 3), `machinedeployment "w" successfully rolled out`, true, ""},
		{"scaled to zero", md(2, 2, 0, 0, 0, 0), `machinedeployment "w" successfully rolled out`, true, ""},
		{"deadline exceeded", md(2, 2, 3, 4, 1, 0, progressing(clusterv1.ProgressDeadlineExceededReason)), "", false, "exceeded its progress deadline: look at the new machines"},
		{"rollback failed", md(2, 2, 3, 3, 3, 3, progressing(clusterv1.RollbackFailedReason)), "", false, "cannot roll back"},
		{"paused", md(2, 2, 3, 3, 1, 1, func(d *clusterv1.MachineDeployment) {
			d.Annotations = map[string]string{clusterv1.PausedAnnotation: ""}
		}), "", false, "marina rollout resume md/w"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line, done, err := rolloutProgress(tc.md)
			if tc.stuck != "" {
				if !errors.Is(err, errRolloutStuck) || !strings.Contains(err.Error(), tc.stuck) {
					t.Errorf("got error %v, want one saying %q", err, tc.stuck)
				}
				return
			}
			if err != nil || line != tc.line || done != tc.done {
				t.Errorf("got %q, done %v, %v; want %q, done %v", line, done, err, tc.line, tc.done)
			}
		})
	}
}

// pause, resume, restart and undo change the deployment as the
// controller expects; status reads it.
func TestRolloutVerbs(t *testing.T) {
	env := managementPlane(t)
	isolate(t)
	ns := env.Namespace(t)
	path := writeKubeconfig(t, envKubeconfig(t, env, ns))
	ctx := context.Background()
	objs := clusterManifests("dev", ns, createOptions{controlPlanes: 1, workers: 2, version: "v1.37.2"})
	for _, obj := range objs {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	key := types.NamespacedName{Namespace: ns, Name: "dev-workers"}
	read := func() *clusterv1.MachineDeployment {
		t.Helper()
		md := &clusterv1.MachineDeployment{}
		if err := env.Client.Get(ctx, key, md); err != nil {
			t.Fatal(err)
		}
		return md
	}
	rollout := func(args ...string) (string, error) {
		t.Helper()
		out, _, err := marina(t, append(append([]string{"rollout"}, args...), "--kubeconfig", path, "-n", ns)...)
		return out, err
	}

	if out, err := rollout("pause", "md/dev-workers"); err != nil || out != "machinedeployment/dev-workers paused\n" {
		t.Fatalf("pause: %q, %v", out, err)
	}
	if _, ok := read().Annotations[clusterv1.PausedAnnotation]; !ok {
		t.Error("pause did not set the paused annotation")
	}
	if _, err := rollout("pause", "md/dev-workers"); err == nil || !strings.Contains(err.Error(), "already paused") {
		t.Errorf("pause of a paused deployment: %v", err)
	}
	if _, err := rollout("restart", "md/dev-workers"); err == nil || !strings.Contains(err.Error(), "resume") {
		t.Errorf("restart of a paused deployment: %v", err)
	}
	if _, err := rollout("status", "md/dev-workers"); err == nil || !strings.Contains(err.Error(), "is paused") {
		t.Errorf("status of a paused deployment: %v", err)
	}
	if out, err := rollout("resume", "machinedeployment/dev-workers"); err != nil || out != "machinedeployment/dev-workers resumed\n" {
		t.Fatalf("resume: %q, %v", out, err)
	}
	if _, ok := read().Annotations[clusterv1.PausedAnnotation]; ok {
		t.Error("resume did not remove the paused annotation")
	}
	if _, err := rollout("resume", "md/dev-workers"); err == nil || !strings.Contains(err.Error(), "not paused") {
		t.Errorf("resume of a deployment not paused: %v", err)
	}

	before := read()
	if out, err := rollout("restart", "md", "dev-workers"); err != nil || out != "machinedeployment/dev-workers restarted\n" {
		t.Fatalf("restart: %q, %v", out, err)
	}
	after := read()
	if after.Spec.Template.ObjectMeta.Annotations[restartedAtAnnotation] == "" || after.Generation == before.Generation {
		t.Errorf("restart did not change the template (generation %d → %d, annotations %v)", before.Generation, after.Generation, after.Spec.Template.ObjectMeta.Annotations)
	}

	if _, err := rollout("undo", "md/dev-workers", "--to-revision", "2"); err != nil {
		t.Fatalf("undo: %v", err)
	}
	if got := read().Annotations[clusterv1.RollbackToRevisionAnnotation]; got != "2" {
		t.Errorf("undo --to-revision 2 set the rollback annotation to %q", got)
	}

	// No controller runs here: the status is written as it would.
	if out, err := rollout("status", "md/dev-workers", "--watch=false"); err != nil || !strings.Contains(out, "spec update to be observed") {
		t.Errorf("status before the controller saw the deployment: %q, %v", out, err)
	}
	md := read()
	md.Status = clusterv1.MachineDeploymentStatus{ObservedGeneration: md.Generation, Replicas: 2, UpdatedReplicas: 2, ReadyReplicas: 2, AvailableReplicas: 2}
	if err := env.Client.Status().Update(ctx, md); err != nil {
		t.Fatal(err)
	}
	if out, err := rollout("status", "md/dev-workers"); err != nil || out != "machinedeployment \"dev-workers\" successfully rolled out\n" {
		t.Errorf("status of a complete rollout: %q, %v", out, err)
	}
	if _, err := rollout("status", "md/nothing"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("status of a deployment that does not exist: %v", err)
	}
}

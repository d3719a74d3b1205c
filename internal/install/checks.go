package install

import (
	"context"
	"fmt"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/manager"
)

// A Check is one of the post-conditions marina init states (M18): when
// they all hold, marina works in the cluster.
type Check struct {
	Name string
	// Run returns nil when the condition holds, or what is still missing.
	Run func(ctx context.Context, c client.Client) error
}

// Checks are the post-conditions of installing objs with o.
func Checks(o Options, objs []*unstructured.Unstructured, now func() time.Time) []Check {
	var crds []string
	for _, obj := range objs {
		if obj.GetKind() == "CustomResourceDefinition" {
			crds = append(crds, obj.GetName())
		}
	}
	checks := []Check{
		{Name: fmt.Sprintf("CRDs established (%d)", len(crds)), Run: func(ctx context.Context, c client.Client) error {
			return crdsEstablished(ctx, c, crds)
		}},
		{Name: "tenancy policy bound (M6)", Run: policyBound},
	}
	if o.InCluster() {
		checks = append(checks, Check{Name: "controller Deployment available", Run: deploymentAvailable})
	}
	return append(checks,
		Check{Name: "controller leader elected", Run: func(ctx context.Context, c client.Client) error {
			return leaderElected(ctx, c, now())
		}},
		Check{Name: "admission webhook answering", Run: webhookAnswers},
	)
}

func crdsEstablished(ctx context.Context, c client.Client, names []string) error {
	for _, name := range names {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(ctx, types.NamespacedName{Name: name}, crd); err != nil {
			return fmt.Errorf("reading CRD %s: %w", name, err)
		}
		established := false
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.NamesAccepted && cond.Status == apiextensionsv1.ConditionFalse {
				return fmt.Errorf("CRD %s: names not accepted: %s", name, cond.Message)
			}
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				established = true
			}
		}
		if !established {
			return fmt.Errorf("CRD %s is not established yet", name)
		}
	}
	return nil
}

const policyName = "marina-tenant-machines"

func policyBound(ctx context.Context, c client.Client) error {
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{}
	if err := c.Get(ctx, types.NamespacedName{Name: policyName}, policy); err != nil {
		return fmt.Errorf("reading ValidatingAdmissionPolicy %s: %w", policyName, err)
	}
	// The type checker (kube-controller-manager) reports expressions that
	// do not fit the kinds they match: such a policy would refuse wrongly.
	if tc := policy.Status.TypeChecking; tc != nil && len(tc.ExpressionWarnings) > 0 {
		w := tc.ExpressionWarnings[0]
		return fmt.Errorf("ValidatingAdmissionPolicy %s: %s: %s", policyName, w.FieldRef, w.Warning)
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	if err := c.Get(ctx, types.NamespacedName{Name: policyName}, binding); err != nil {
		return fmt.Errorf("reading ValidatingAdmissionPolicyBinding %s: %w", policyName, err)
	}
	if binding.Spec.PolicyName != policyName {
		return fmt.Errorf("ValidatingAdmissionPolicyBinding %s binds %q, not %s", policyName, binding.Spec.PolicyName, policyName)
	}
	return nil
}

const deploymentName = "marina-controller"

// deploymentAvailable: the rollout of the applied spec has finished, so a
// re-run that changed the image waits for the new replicas, not the old.
func deploymentAvailable(ctx context.Context, c client.Client) error {
	d := &appsv1.Deployment{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: Namespace, Name: deploymentName}, d); err != nil {
		return fmt.Errorf("reading Deployment %s/%s: %w", Namespace, deploymentName, err)
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	// kubectl rollout status's rules: every replica is of the applied spec,
	// none of an older one is left, and all of them are available.
	if s.ObservedGeneration < d.Generation || s.UpdatedReplicas < want || s.Replicas > s.UpdatedReplicas || s.AvailableReplicas < s.UpdatedReplicas {
		return fmt.Errorf("Deployment %s/%s: %d of %d replicas updated, %d available, %d in all (kubectl -n %s describe deployment %s)",
			Namespace, deploymentName, s.UpdatedReplicas, want, s.AvailableReplicas, s.Replicas, Namespace, deploymentName)
	}
	return nil
}

// leaderElected: a replica holds the controllers' Lease and renews it.
func leaderElected(ctx context.Context, c client.Client, now time.Time) error {
	lease := &coordinationv1.Lease{}
	key := types.NamespacedName{Namespace: Namespace, Name: manager.LeaderElectionID}
	if err := c.Get(ctx, key, lease); err != nil {
		return fmt.Errorf("no controller has taken Lease %s yet: %w", key, err)
	}
	s := lease.Spec
	if s.HolderIdentity == nil || *s.HolderIdentity == "" || s.RenewTime == nil || s.LeaseDurationSeconds == nil {
		return fmt.Errorf("Lease %s has no holder", key)
	}
	if expiry := s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds) * time.Second); now.After(expiry) {
		return fmt.Errorf("Lease %s: holder %s last renewed at %s and has lapsed", key, *s.HolderIdentity, s.RenewTime.Format(time.RFC3339))
	}
	return nil
}

// webhookAnswers sends a Machine whose class does not exist, as a dry run:
// its webhook (failure policy Fail) must answer, and refuse it. Any other
// error, such as the API server failing to call it, means it is not
// answering.
func webhookAnswers(ctx context.Context, c client.Client) error {
	probe := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "marina-init-probe"},
		Spec: clusterv1.MachineSpec{
			ClusterName: "marina-init-probe",
			Roles:       []clusterv1.MachineRole{clusterv1.WorkerRole},
			ClassRef:    &clusterv1.MachineClassReference{Name: "marina-init-probe-no-such-class"},
			Versions:    clusterv1.MachineVersions{Kubelet: "v1.37.2"},
		},
	}
	err := c.Create(ctx, probe, client.DryRunAll)
	switch {
	case err == nil:
		return fmt.Errorf("a Machine with a missing MachineClass was admitted: the webhook is not installed as it should be")
	case strings.Contains(err.Error(), "denied the request") && strings.Contains(err.Error(), "marina-init-probe-no-such-class"):
		return nil
	}
	return fmt.Errorf("the webhook did not answer: %w", err)
}

// Wait runs the checks every interval until all hold or ctx ends, calling
// held once for each as it first holds. When ctx ends first, the error
// names every check that does not hold, with what it last found.
func Wait(ctx context.Context, c client.Client, checks []Check, interval time.Duration, held func(Check)) error {
	done := make([]bool, len(checks))
	last := make([]error, len(checks))
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		pending := 0
		for i, ch := range checks {
			if done[i] {
				continue
			}
			err := ch.Run(ctx, c)
			if err == nil {
				done[i] = true
				held(ch)
				continue
			}
			// A check cut short by the deadline keeps what it found before.
			if ctx.Err() == nil || last[i] == nil {
				last[i] = err
			}
			pending++
		}
		if pending == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			var failed []string
			for i, ch := range checks {
				if !done[i] {
					failed = append(failed, fmt.Sprintf("%s: %v", ch.Name, last[i]))
				}
			}
			return fmt.Errorf("%d post-condition(s) do not hold: %s", len(failed), strings.Join(failed, "; "))
		case <-ticker.C:
		}
	}
}

package machinedeployment

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/controller/machine"
	"marina.dev/marina/internal/controller/machineset"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/internal/testenv/localenv"
	"marina.dev/marina/provider"
)

var (
	suite          *localenv.Suite
	mgmt, workload *testenv.Env
)

func TestMain(m *testing.M) {
	localenv.Main(m, "marina-machinedeployment-", func(s *localenv.Suite) { suite, mgmt, workload = s, s.Mgmt, s.Workload })
}

// start runs the machine, MachineSet and MachineDeployment controllers
// with the fixture's local provider until the test ends.
func start(f *localenv.Fixture) {
	localenv.StartManager(f.T, mgmt.Config, f.NS, func(ctx context.Context, mgr ctrl.Manager) error {
		reg, err := provider.NewRegistry(f.Provider)
		if err != nil {
			return err
		}
		if _, err := machine.SetupWithManager(ctx, mgr, machine.Options{Providers: reg, MaxConcurrentReconciles: 8}); err != nil {
			return err
		}
		if _, err := machineset.SetupWithManager(mgr, machineset.Options{MaxConcurrentReconciles: 2}); err != nil {
			return err
		}
		_, err = SetupWithManager(mgr, Options{MaxConcurrentReconciles: 2})
		return err
	})
}

func newDeployment(f *localenv.Fixture, name string, replicas int32, surge, unavailable int) *clusterv1.MachineDeployment {
	labels := map[string]string{"pool": name}
	s, u := intstr.FromInt32(int32(surge)), intstr.FromInt32(int32(unavailable))
	return &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.NS},
		Spec: clusterv1.MachineDeploymentSpec{
			ClusterName: f.Cluster,
			Replicas:    &replicas,
			Selector:    metav1.LabelSelector{MatchLabels: labels},
			Strategy: &clusterv1.MachineDeploymentStrategy{
				Type:          clusterv1.RollingUpdateStrategy,
				RollingUpdate: &clusterv1.MachineRollingUpdate{MaxSurge: &s, MaxUnavailable: &u},
			},
			Template: clusterv1.MachineTemplateSpec{
				ObjectMeta: clusterv1.MachineTemplateMeta{Labels: labels},
				Spec: clusterv1.MachineSpec{
					ClusterName:  f.Cluster,
					Roles:        []clusterv1.MachineRole{clusterv1.WorkerRole},
					Versions:     clusterv1.MachineVersions{Kubelet: "v1.37.2"},
					Labels:       map[string]string{"tier": "v1"},
					ProviderSpec: &runtime.RawExtension{Raw: []byte(localenv.LocalMachineBlob)},
				},
			},
		},
	}
}

func create(t *testing.T, o client.Object) {
	t.Helper()
	if err := mgmt.Client.Create(context.Background(), o); err != nil {
		t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
	}
}

func get[T client.Object](t *testing.T, o T) T {
	t.Helper()
	if err := mgmt.Client.Get(context.Background(), client.ObjectKeyFromObject(o), o); err != nil {
		t.Fatal(err)
	}
	return o
}

// update applies change to a fresh copy of o with a merge patch.
func update[T client.Object](t *testing.T, o T, change func(T)) {
	t.Helper()
	o = get(t, o)
	before := o.DeepCopyObject().(T)
	change(o)
	if err := mgmt.Client.Patch(context.Background(), o, client.MergeFrom(before)); err != nil {
		t.Fatalf("patching %s: %v", o.GetName(), err)
	}
}

func machinesIn(t *testing.T, ns string) []clusterv1.Machine {
	t.Helper()
	list := &clusterv1.MachineList{}
	if err := mgmt.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func setsOf(t *testing.T, md *clusterv1.MachineDeployment) []clusterv1.MachineSet {
	t.Helper()
	list := &clusterv1.MachineSetList{}
	if err := mgmt.Client.List(context.Background(), list, client.InNamespace(md.Namespace)); err != nil {
		t.Fatal(err)
	}
	var out []clusterv1.MachineSet
	for _, ms := range list.Items {
		if ref := metav1.GetControllerOf(&ms); ref != nil && ref.UID == md.UID {
			out = append(out, ms)
		}
	}
	return out
}

func condition(conds []metav1.Condition, t string) string {
	if c := meta.FindStatusCondition(conds, t); c != nil {
		return fmt.Sprintf("%s/%s: %s", c.Status, c.Reason, c.Message)
	}
	return "absent"
}

// waitSettled waits until the deployment has exactly replicas machines, all
// from its current template, available, and its rollout complete, with
// every machine's Node label tier as given.
func waitSettled(t *testing.T, md *clusterv1.MachineDeployment, replicas int32, tier string, timeout time.Duration) *clusterv1.MachineDeployment {
	t.Helper()
	var got *clusterv1.MachineDeployment
	testenv.Eventually(t, timeout, fmt.Sprintf("%s to settle at %d machines with tier %s", md.Name, replicas, tier), func() error {
		got = get(t, md.DeepCopy())
		st := got.Status
		if st.ObservedGeneration != got.Generation || st.Replicas != replicas || st.UpdatedReplicas != replicas ||
			st.AvailableReplicas != replicas || !strings.HasPrefix(condition(st.Conditions, clusterv1.RollingOutCondition), "False") {
			return fmt.Errorf("status %+v", st)
		}
		machines := machinesIn(t, md.Namespace)
		if len(machines) != int(replicas) {
			return fmt.Errorf("%d machines", len(machines))
		}
		for _, m := range machines {
			if m.Spec.Labels["tier"] != tier {
				return fmt.Errorf("machine %s has tier %q", m.Name, m.Spec.Labels["tier"])
			}
		}
		return nil
	})
	return got
}

// scaleTo writes spec.replicas through the scale subresource.
func scaleTo(t *testing.T, o client.Object, replicas int32) {
	t.Helper()
	s := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: replicas}}
	if err := mgmt.Client.SubResource("scale").Update(context.Background(), o, client.WithSubResourceBody(s)); err != nil {
		t.Fatalf("scaling %s to %d: %v", o.GetName(), replicas, err)
	}
}

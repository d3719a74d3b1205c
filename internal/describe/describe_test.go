package describe

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite the golden files from the output")

var now = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }

func cond(t, status, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: t, Status: metav1.ConditionStatus(status), Reason: reason, Message: msg}
}

func cluster(phase clusterv1.ClusterPhase, ready int32, conds ...metav1.Condition) *clusterv1.Cluster {
	c := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "ha", Namespace: "default", UID: "ha-uid", CreationTimestamp: ago(10 * time.Minute)}}
	c.Spec.ControlPlane.Version = "v1.37.2"
	c.Spec.ControlPlane.Replicas = 3
	c.Status.Phase = phase
	c.Status.ControlPlane.ReadyReplicas = ready
	c.Status.Conditions = conds
	return c
}

func cpMachine(name string, phase clusterv1.MachinePhase, versions bool, conds ...metav1.Condition) clusterv1.Machine {
	m := clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: ago(9 * time.Minute),
		Labels:          map[string]string{clusterv1.ControlPlaneLabel: ""},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: "ha", UID: "ha-uid", Controller: ptr.To(true)}}}}
	m.Spec.Versions.Kubelet = "v1.37.2"
	m.Status.Phase = phase
	m.Status.Conditions = conds
	if versions {
		m.Status.Versions.Kubelet = "v1.37.2"
		m.Status.Versions.ControlPlane = &clusterv1.ComponentVersions{APIServer: "v1.37.2", ControllerManager: "v1.37.2", Scheduler: "v1.37.2", Etcd: "v3.6.16"}
	}
	return m
}

func worker(name, set string, phase clusterv1.MachinePhase, conds ...metav1.Condition) clusterv1.Machine {
	m := clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: ago(5 * time.Minute)}}
	if set != "" {
		m.OwnerReferences = []metav1.OwnerReference{{Kind: "MachineSet", Name: set}}
	}
	m.Spec.Versions.Kubelet = "v1.37.2"
	m.Status.Phase = phase
	m.Status.Conditions = conds
	if phase == clusterv1.MachinePhaseRunning {
		m.Status.Versions.Kubelet = "v1.37.2"
	}
	return m
}

func fleet(ready int32) ([]clusterv1.MachineDeployment, []clusterv1.MachineSet) {
	n := int32(2)
	d := clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Name: "ha-workers", CreationTimestamp: ago(10 * time.Minute)}}
	d.Spec.Replicas = &n
	d.Spec.Template.Spec.Versions.Kubelet = "v1.37.2"
	d.Status.ReadyReplicas = ready
	s := clusterv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Name: "ha-workers-7d9f", CreationTimestamp: ago(10 * time.Minute),
		OwnerReferences: []metav1.OwnerReference{{Kind: "MachineDeployment", Name: "ha-workers"}}}}
	s.Spec.Replicas = &n
	s.Spec.Template.Spec.Versions.Kubelet = "v1.37.2"
	s.Status.ReadyReplicas = ready
	if ready == n {
		d.Status.Conditions = []metav1.Condition{cond(clusterv1.MachinesReadyCondition, "True", clusterv1.MachinesReadyReason, ""),
			cond(clusterv1.ScalingUpCondition, "False", clusterv1.NotScalingReason, "")}
		s.Status.Conditions = d.Status.Conditions
	} else {
		d.Status.Conditions = []metav1.Condition{cond(clusterv1.MachinesReadyCondition, "False", clusterv1.MachinesNotReadyReason, "1 of 2 machines are not Ready")}
		s.Status.Conditions = d.Status.Conditions
	}
	return []clusterv1.MachineDeployment{d}, []clusterv1.MachineSet{s}
}

var (
	ready      = cond(clusterv1.ReadyCondition, "True", "Ready", "")
	nodeReady  = cond(clusterv1.MachineNodeReadyCondition, "True", clusterv1.MachineNodeReadyReason, "")
	cpReady    = cond(clusterv1.ClusterControlPlaneReadyCondition, "True", clusterv1.ClusterControlPlaneReadyReason, "")
	etcdHealth = cond(clusterv1.ClusterEtcdHealthyCondition, "True", clusterv1.ClusterEtcdHealthyReason, "3 of 3 etcd members are healthy")
)

func TestDescribeClusterGolden(t *testing.T) {
	healthyDeploys, healthySets := fleet(2)
	halfDeploys, halfSets := fleet(1)
	cases := map[string]Objects{
		"healthy": {
			Cluster: cluster(clusterv1.ClusterPhaseProvisioned, 3, ready, cpReady, etcdHealth),
			Machines: []clusterv1.Machine{
				cpMachine("ha-cp-0", clusterv1.MachinePhaseRunning, true, ready, nodeReady),
				cpMachine("ha-cp-1", clusterv1.MachinePhaseRunning, true, ready, nodeReady),
				cpMachine("ha-cp-2", clusterv1.MachinePhaseRunning, true, ready, nodeReady),
				worker("ha-workers-7d9f-a", "ha-workers-7d9f", clusterv1.MachinePhaseRunning, ready, nodeReady),
				worker("ha-workers-7d9f-b", "ha-workers-7d9f", clusterv1.MachinePhaseRunning, ready, nodeReady),
				worker("ha-gpu-0", "", clusterv1.MachinePhaseRunning, ready, nodeReady),
			},
			MachineDeployments: healthyDeploys, MachineSets: healthySets,
		},
		"creating": {
			Cluster: cluster(clusterv1.ClusterPhaseProvisioning, 1,
				cond(clusterv1.ReadyCondition, "False", clusterv1.ClusterControlPlaneScalingReason, "1 of 3 control-plane machines ready"),
				cond(clusterv1.ClusterControlPlaneReadyCondition, "False", clusterv1.ClusterControlPlaneScalingReason, "1 of 3 control-plane machines ready")),
			Machines: []clusterv1.Machine{
				cpMachine("ha-cp-0", clusterv1.MachinePhaseRunning, true, ready, nodeReady),
				cpMachine("ha-cp-1", clusterv1.MachinePhaseProvisioning, false,
					cond(clusterv1.ReadyCondition, "False", clusterv1.MachineNodeNotFoundReason, "waiting for a Node with spec.providerID local://x to register")),
				worker("ha-workers-7d9f-a", "ha-workers-7d9f", clusterv1.MachinePhaseRunning, ready, nodeReady),
				worker("ha-workers-7d9f-b", "ha-workers-7d9f", clusterv1.MachinePhasePending,
					cond(clusterv1.ReadyCondition, "False", clusterv1.MachineWaitingForControlPlaneReason, "waiting until the cluster's control plane answers")),
			},
			MachineDeployments: halfDeploys, MachineSets: halfSets,
		},
		// Issue 25: a worker whose provider reports it stopped reads
		// Stopped, with why, though its phase still says Running.
		"stopped-machine": {
			Cluster: cluster(clusterv1.ClusterPhaseProvisioned, 3, ready, cpReady, etcdHealth),
			Machines: []clusterv1.Machine{
				cpMachine("ha-cp-0", clusterv1.MachinePhaseRunning, true, ready, nodeReady),
				worker("ha-gpu-0", "", clusterv1.MachinePhaseRunning,
					cond(clusterv1.ReadyCondition, "False", clusterv1.MachineStoppedReason, "the machine stopped (its host rebooted, or its process was killed): starting it again with its disk, data and certificates"),
					cond(clusterv1.MachineInstanceRunningCondition, "False", clusterv1.MachineStoppedReason, "the machine stopped (its host rebooted, or its process was killed): starting it again with its disk, data and certificates"),
					nodeReady),
			},
		},
		"failed-machine": {
			Cluster: cluster(clusterv1.ClusterPhaseProvisioned, 3, ready, cpReady, etcdHealth),
			Machines: []clusterv1.Machine{
				cpMachine("ha-cp-0", clusterv1.MachinePhaseRunning, true, ready, nodeReady),
				cpMachine("ha-cp-1", clusterv1.MachinePhaseRunning, true, ready, nodeReady),
				cpMachine("ha-cp-2", clusterv1.MachinePhaseRunning, true, ready, nodeReady),
				func() clusterv1.Machine {
					m := worker("ha-gpu-0", "", clusterv1.MachinePhaseFailed, cond(clusterv1.ReadyCondition, "False", clusterv1.MachineInvalidProviderSpecReason, "invalid"))
					m.Status.FailureReason = clusterv1.MachineInvalidProviderSpecReason
					m.Status.FailureMessage = "invalid providerSpec field spec.memroy: unknown field; did you mean spec.memory?"
					return m
				}(),
			},
		},
	}
	for name, objects := range cases {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			if err := Render(&out, Cluster(objects, now), Options{}); err != nil {
				t.Fatal(err)
			}
			checkGolden(t, name, out.Bytes())
		})
	}
}

// describe machine, in plain mode: a failed worker of a class, with its
// merged provider configuration, labels and taints; and one whose
// configuration cannot be merged.
func TestDescribeMachineGolden(t *testing.T) {
	failed := worker("ha-gpu-0", "", clusterv1.MachinePhaseFailed,
		cond(clusterv1.ReadyCondition, "False", clusterv1.MachineInvalidProviderSpecReason, "invalid"),
		cond(clusterv1.MachineProvisionedCondition, "False", clusterv1.MachineInvalidProviderSpecReason, "spec.memroy: unknown field"))
	failed.Namespace = "default"
	failed.Spec.ClusterName = "ha"
	failed.Spec.Roles = []clusterv1.MachineRole{clusterv1.WorkerRole}
	cases := map[string]MachineView{
		"machine": {
			Machine:      &failed,
			Class:        "gpu",
			ProviderSpec: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":4,"gpus":1,"memory":"8Gi"}}`),
			NodeLabels:   map[string]string{"marina.dev/class": "gpu"},
			NodeTaints:   []corev1.Taint{{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule}},
		},
		"machine-unmerged": {Machine: &failed, Class: "gpu", MergeError: `override of spec.gpus is not allowed by class "gpu"`},
	}
	for name, view := range cases {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			if err := PrintMachine(&out, view, now, Options{AllConditions: true}); err != nil {
				t.Fatal(err)
			}
			checkGolden(t, name, out.Bytes())
		})
	}
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	golden := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/describe -update to write it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("describe %s:\n%s\nwant (%s):\n%s", name, got, golden, want)
	}
}

// A machine labelled as the control plane that the Cluster does not own is
// no member of it (issue 24): shown with the loose machines, not under the
// control plane, and the control plane shows the condition naming it.
func TestUnownedControlPlaneMachineIsNotShownAsAMember(t *testing.T) {
	owned := cpMachine("ha-cp-0", clusterv1.MachinePhaseRunning, true)
	intruder := cpMachine("intruder", clusterv1.MachinePhaseRunning, true)
	intruder.OwnerReferences[0].Controller = nil
	c := cluster(clusterv1.ClusterPhaseProvisioned, 1, cond(clusterv1.ClusterControlPlaneMachinesOwnedCondition, "False",
		clusterv1.ClusterUnownedControlPlaneMachineReason, "machines intruder carry the labels"))
	root := Cluster(Objects{Cluster: c, Machines: []clusterv1.Machine{owned, intruder}}, now)
	var cp, loose *Node
	for _, n := range root.Children {
		switch n.Kind {
		case "ControlPlane":
			cp = n
		case "Workers":
			loose = n
		}
	}
	if cp == nil || len(cp.Children) != 1 || cp.Children[0].Name != "ha-cp-0" {
		t.Fatalf("control plane %+v; want ha-cp-0 alone", cp)
	}
	if loose == nil || len(loose.Children) != 1 || loose.Children[0].Name != "intruder" {
		t.Errorf("loose machines %+v; want intruder", loose)
	}
	found := false
	for _, cd := range cp.Conditions {
		found = found || cd.Reason == clusterv1.ClusterUnownedControlPlaneMachineReason
	}
	if !found {
		t.Errorf("the control plane's conditions %+v do not name the unowned machine", cp.Conditions)
	}
}

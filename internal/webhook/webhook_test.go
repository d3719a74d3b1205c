package webhook_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider/local"
	"marina.dev/marina/tools"
)

var env *testenv.Env

// The webhook runs with the local provider, as in marina up: its Validate
// checks LocalMachine blobs, and bin/ holds the versions it can run.
func TestMain(m *testing.M) {
	root, err := os.MkdirTemp("", "marina-webhook-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir, err := testenv.BinDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	prov, err := local.New(local.Options{Root: root, AgentCommand: []string{"/bin/false"}, BinDir: binDir})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// os.Exit runs no deferred call: the directory goes first.
	code := testenv.RunWithWebhook(m, &env, prov)
	os.RemoveAll(root)
	os.Exit(code)
}

var newest = clusterv1.KubernetesVersion(tools.Pinned().NewestKube())

const localSpec = `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"2Gi"}}`

func raw(s string) *runtime.RawExtension { return &runtime.RawExtension{Raw: []byte(s)} }

func newCluster(ns string) *clusterv1.Cluster {
	return &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: "prod", Namespace: ns},
		Spec: clusterv1.ClusterSpec{
			ControlPlane: clusterv1.ControlPlaneSpec{Version: newest, Replicas: 1, ProviderSpec: raw(localSpec)},
		},
	}
}

func newClass(name string) *clusterv1.MachineClass {
	return &clusterv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: clusterv1.MachineClassSpec{
			ProviderSpec:     *raw(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":4,"memory":"8Gi"}}`),
			AllowedOverrides: []string{"spec.diskSize"},
		},
	}
}

func newWorker(ns, name string) *clusterv1.Machine {
	return &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: clusterv1.MachineSpec{
			ClusterName:  "prod",
			Roles:        []clusterv1.MachineRole{clusterv1.WorkerRole},
			Versions:     clusterv1.MachineVersions{Kubelet: newest},
			ProviderSpec: raw(localSpec),
		},
	}
}

func newMachineSet(ns string, template clusterv1.MachineSpec) *clusterv1.MachineSet {
	return &clusterv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns},
		Spec: clusterv1.MachineSetSpec{
			ClusterName: "prod",
			Selector:    metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}},
			Template: clusterv1.MachineTemplateSpec{
				ObjectMeta: clusterv1.MachineTemplateMeta{Labels: map[string]string{"pool": "a"}},
				Spec:       template,
			},
		},
	}
}

func create(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, obj := range objs {
		if err := env.Client.Create(context.Background(), obj); err != nil {
			t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
		}
	}
}

// class makes a cluster-scoped MachineClass with a name unique to the test,
// deleted when the test ends.
func class(t *testing.T) *clusterv1.MachineClass {
	t.Helper()
	mc := newClass(strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())))
	create(t, mc)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), mc) })
	return mc
}

// refused asserts that creating obj fails as invalid, naming field with a
// message containing want, and that nothing was stored.
func refused(t *testing.T, obj client.Object, field, want string) {
	t.Helper()
	err := env.Client.Create(context.Background(), obj)
	if err == nil {
		t.Fatalf("%T %s was accepted; want it refused at %s", obj, obj.GetName(), field)
	}
	assertInvalid(t, err, field, want)
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); !apierrors.IsNotFound(err) {
		t.Errorf("refused %T %s was stored anyway (get: %v)", obj, obj.GetName(), err)
	}
}

func assertInvalid(t *testing.T, err error, field, want string) {
	t.Helper()
	if !apierrors.IsInvalid(err) {
		t.Fatalf("error is not Invalid: %v", err)
	}
	var causes []string
	for _, c := range err.(apierrors.APIStatus).Status().Details.Causes {
		causes = append(causes, c.Field+": "+c.Message)
		if c.Field == field && strings.Contains(c.Message, want) {
			return
		}
	}
	t.Fatalf("no cause at %s containing %q; causes:\n  %s", field, want, strings.Join(causes, "\n  "))
}

// Each rule that needs another object to judge refuses at apply time,
// naming the field to fix.
func TestRefusesWhatTheControllersWouldRefuseLater(t *testing.T) {
	ns := env.Namespace(t)
	mc := class(t)
	create(t, newCluster(ns))

	t.Run("class that does not exist", func(t *testing.T) {
		m := newWorker(ns, "no-class")
		m.Spec.ProviderSpec = nil
		m.Spec.ClassRef = &clusterv1.MachineClassReference{Name: "no-such-class"}
		refused(t, m, "spec.classRef.name", "no such MachineClass")
	})
	t.Run("override the class does not allow", func(t *testing.T) {
		m := newWorker(ns, "override")
		m.Spec.ClassRef = &clusterv1.MachineClassReference{Name: mc.Name}
		m.Spec.ProviderSpec = raw(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":64}}`)
		refused(t, m, "spec.providerSpec.spec.cpu", "does not allow overriding this field")
	})
	t.Run("typo in providerSpec", func(t *testing.T) {
		m := newWorker(ns, "typo")
		m.Spec.ProviderSpec = raw(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"2Gi","memroy":"4Gi"}}`)
		refused(t, m, "spec.providerSpec.spec.memroy", "unknown field")
	})
	t.Run("providerSpec missing a required field", func(t *testing.T) {
		m := newWorker(ns, "no-memory")
		m.Spec.ProviderSpec = raw(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2}}`)
		refused(t, m, "spec.providerSpec.spec.memory", "is required")
	})
	t.Run("kubelet newer than the cluster's control plane", func(t *testing.T) {
		m := newWorker(ns, "skew")
		m.Spec.Versions.Kubelet = "v1.99.0"
		refused(t, m, "spec.versions.kubelet", "must not be newer than the cluster's control plane ("+string(newest)+")")
	})
	t.Run("set template kubelet newer than the control plane", func(t *testing.T) {
		tmpl := newWorker(ns, "").Spec
		tmpl.Versions.Kubelet = "v1.99.0"
		refused(t, newMachineSet(ns, tmpl), "spec.template.spec.versions.kubelet", "must not be newer than the cluster's control plane")
	})
	t.Run("set template naming a missing class", func(t *testing.T) {
		tmpl := newWorker(ns, "").Spec
		tmpl.ProviderSpec = nil
		tmpl.ClassRef = &clusterv1.MachineClassReference{Name: "no-such-class"}
		refused(t, newMachineSet(ns, tmpl), "spec.template.spec.classRef.name", "no such MachineClass")
	})
	t.Run("class with a typo in its providerSpec", func(t *testing.T) {
		bad := newClass("typo-" + ns)
		bad.Spec.ProviderSpec = *raw(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"2Gi","gpu":1}}`)
		refused(t, bad, "spec.providerSpec.spec.gpu", "unknown field")
	})
	t.Run("control-plane version make setup did not build", func(t *testing.T) {
		c := newCluster(ns)
		c.Name = "old"
		c.Spec.ControlPlane.Version = "v1.20.0"
		refused(t, c, "spec.controlPlane.version", string(newest))
	})
	t.Run("control-plane providerSpec typo", func(t *testing.T) {
		c := newCluster(ns)
		c.Name = "typo"
		c.Spec.ControlPlane.ProviderSpec = raw(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpus":2,"memory":"2Gi"}}`)
		refused(t, c, "spec.controlPlane.providerSpec.spec.cpus", "unknown field")
	})
}

// Objects that are right are accepted, whatever the order they arrive in,
// and a kind owned by a provider elsewhere gets a warning, not a refusal.
func TestAcceptsValidObjectsOfEveryKind(t *testing.T) {
	ns := env.Namespace(t)
	mc := class(t)
	fromClass := newWorker(ns, "from-class")
	fromClass.Spec.ClassRef = &clusterv1.MachineClassReference{Name: mc.Name}
	fromClass.Spec.ProviderSpec = raw(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"diskSize":"40Gi"}}`)
	md := &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns},
		Spec: clusterv1.MachineDeploymentSpec{
			ClusterName: "prod",
			Selector:    metav1.LabelSelector{MatchLabels: map[string]string{"pool": "b"}},
			Template: clusterv1.MachineTemplateSpec{
				ObjectMeta: clusterv1.MachineTemplateMeta{Labels: map[string]string{"pool": "b"}},
				Spec:       fromClass.Spec,
			},
		},
	}
	mhc := &clusterv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns},
		Spec: clusterv1.MachineHealthCheckSpec{
			ClusterName: "prod",
			Selector:    metav1.LabelSelector{MatchLabels: map[string]string{"pool": "b"}},
			UnhealthyConditions: []clusterv1.UnhealthyCondition{
				{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Timeout: metav1.Duration{Duration: 5 * time.Minute}},
			},
		},
	}
	// A machine may arrive before its Cluster (its skew is then not checked).
	create(t, newWorker(ns, "early"), newCluster(ns), fromClass, newMachineSet(ns, newWorker(ns, "").Spec), md, mhc)

	var warnings []string
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandlerWithContext = warningRecorder(func(w string) { warnings = append(warnings, w) })
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := newWorker(ns, "elsewhere")
	elsewhere.Spec.ProviderSpec = raw(`{"apiVersion":"gce.example.com/v1","kind":"GCEMachine","spec":{"zone":"x"}}`)
	if err := c.Create(context.Background(), elsewhere); err != nil {
		t.Fatalf("a machine of a kind no provider here owns was refused: %v", err)
	}
	if !slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, "GCEMachine") }) {
		t.Errorf("no warning names the unowned kind GCEMachine; warnings: %q", warnings)
	}
}

type warningRecorder func(string)

func (r warningRecorder) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, text string) {
	r(text)
}

// An update is refused only for what it breaks: a machine whose class was
// deleted since can still be relabelled and have its finalizer removed, but
// not be given a new mistake.
func TestUpdatesAreJudgedOnWhatTheyChange(t *testing.T) {
	ns := env.Namespace(t)
	ctx := context.Background()
	mc := class(t)
	create(t, newCluster(ns))
	m := newWorker(ns, "orphan")
	m.Spec.ProviderSpec = nil
	m.Spec.ClassRef = &clusterv1.MachineClassReference{Name: mc.Name}
	m.Finalizers = []string{clusterv1.MachineFinalizer}
	create(t, m)
	if err := env.Client.Delete(ctx, mc); err != nil {
		t.Fatal(err)
	}

	m.Labels = map[string]string{"team": "a"}
	if err := env.Client.Update(ctx, m); err != nil {
		t.Fatalf("relabelling a machine whose class is gone was refused: %v", err)
	}
	m.Spec.Versions.Kubelet = nextMinor(newest) // one minor up passes the schema's transition rule
	err := env.Client.Update(ctx, m)
	if err == nil {
		t.Fatal("an update that makes the kubelet newer than the control plane was accepted")
	}
	assertInvalid(t, err, "spec.versions.kubelet", "must not be newer")

	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
		t.Fatal(err)
	}
	m.Finalizers = nil
	if err := env.Client.Update(ctx, m); err != nil {
		t.Fatalf("removing the finalizer of a machine being deleted was refused: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, "the machine is gone", func() error {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (get: %v)", err)
	})
}

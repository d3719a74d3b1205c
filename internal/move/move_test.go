package move

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
)

// source and target are two management planes (real kube-apiservers with
// marina's CRDs). No controller runs on either: these tests check the
// move's API traffic (SkipControllerWaits); the e2e suite checks it with
// both planes' controllers and running machines.
var source, target *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(func() int {
		var err error
		if source, err = testenv.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer func() { _ = source.Stop() }()
		if target, err = testenv.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer func() { _ = target.Stop() }()
		return m.Run()
	}())
}

// world is one namespace's clusters on the source, as marina made them.
type world struct {
	ns       string
	uids     map[string]types.UID // "Kind name" -> source UID
	userCA   *corev1.Secret
	machines []string
}

func mustCreate(t *testing.T, c client.Client, o client.Object) {
	t.Helper()
	if err := c.Create(context.Background(), o); err != nil {
		t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
	}
}

func newWorld(t *testing.T) *world {
	t.Helper()
	ctx := context.Background()
	ns := source.Namespace(t)
	tns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	mustCreate(t, target.Client, tns)
	t.Cleanup(func() { _ = target.Client.Delete(ctx, tns) })
	w := &world{ns: ns, uids: map[string]types.UID{}}
	ctrlRef := func(o client.Object, kind string) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: clusterv1.GroupVersion.String(), Kind: kind, Name: o.GetName(), UID: o.GetUID(), Controller: ptr(true), BlockOwnerDeletion: ptr(true)}
	}
	blob := &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"2Gi"}}`)}

	class := &clusterv1.MachineClass{ObjectMeta: metav1.ObjectMeta{Name: "move-test-worker"}, Spec: clusterv1.MachineClassSpec{ProviderSpec: *blob}}
	if err := source.Client.Create(ctx, class); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	w.userCA = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "users-ca", Namespace: ns}, Data: map[string][]byte{"tls.crt": []byte("x")}}
	mustCreate(t, source.Client, w.userCA)
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: ns, Finalizers: []string{clusterv1.ClusterFinalizer}},
		Spec: clusterv1.ClusterSpec{ControlPlane: clusterv1.ControlPlaneSpec{
			Version: "v1.37.2", Replicas: 1, ProviderSpec: blob, CASecretRef: &clusterv1.SecretReference{Name: "users-ca"},
		}},
	}
	mustCreate(t, source.Client, cluster)
	cluster.Status.ObservedGeneration = cluster.Generation
	cluster.Status.Phase = clusterv1.ClusterPhaseProvisioned
	if err := source.Client.Status().Update(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	w.uids["Cluster c1"] = cluster.UID
	kubeconfig := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "c1-kubeconfig", Namespace: ns, OwnerReferences: []metav1.OwnerReference{ctrlRef(cluster, "Cluster")}}}
	mustCreate(t, source.Client, kubeconfig)
	w.uids["Secret c1-kubeconfig"] = kubeconfig.UID

	labels := map[string]string{"pool": "workers"}
	template := clusterv1.MachineTemplateSpec{
		ObjectMeta: clusterv1.MachineTemplateMeta{Labels: labels},
		Spec: clusterv1.MachineSpec{ClusterName: "c1", Roles: []clusterv1.MachineRole{clusterv1.WorkerRole},
			Versions: clusterv1.MachineVersions{Kubelet: "v1.37.2"}, ClassRef: &clusterv1.MachineClassReference{Name: class.Name}},
	}
	md := &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Name: "workers", Namespace: ns},
		Spec:       clusterv1.MachineDeploymentSpec{ClusterName: "c1", Replicas: ptr(int32(2)), Selector: metav1.LabelSelector{MatchLabels: labels}, Template: template},
	}
	mustCreate(t, source.Client, md)
	w.uids["MachineDeployment workers"] = md.UID
	ms := &clusterv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Name: "workers-abc", Namespace: ns, Labels: labels, OwnerReferences: []metav1.OwnerReference{ctrlRef(md, "MachineDeployment")}},
		Spec:       clusterv1.MachineSetSpec{ClusterName: "c1", Replicas: ptr(int32(2)), Selector: metav1.LabelSelector{MatchLabels: labels}, Template: template},
	}
	mustCreate(t, source.Client, ms)
	w.uids["MachineSet workers-abc"] = ms.UID
	for i := range 2 {
		m := &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("workers-abc-%d", i), Namespace: ns, Labels: labels,
				Finalizers: []string{clusterv1.MachineFinalizer}, OwnerReferences: []metav1.OwnerReference{ctrlRef(ms, "MachineSet")}},
			Spec: template.Spec,
		}
		mustCreate(t, source.Client, m)
		m.Status.ProviderID = "local://" + string(m.UID)
		m.Status.Phase = clusterv1.MachinePhaseRunning
		if err := source.Client.Status().Update(ctx, m); err != nil {
			t.Fatal(err)
		}
		w.uids["Machine "+m.Name] = m.UID
		w.machines = append(w.machines, m.Name)
	}
	return w
}

// check asserts what a finished move leaves: nothing of marina's on the
// source, every object once on the target, unpaused, owned by the
// target's copies of its owners, machines keyed by their first UID.
func (w *world) check(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	in := client.InNamespace(w.ns)
	for _, l := range []client.ObjectList{&clusterv1.ClusterList{}, &clusterv1.MachineDeploymentList{}, &clusterv1.MachineSetList{}, &clusterv1.MachineList{}} {
		if err := source.Client.List(ctx, l, in); err != nil {
			t.Fatal(err)
		}
		if n := len(itemsOf(l)); n != 0 {
			t.Errorf("%d %T left on the source", n, l)
		}
	}
	if err := source.Client.Get(ctx, client.ObjectKeyFromObject(w.userCA), &corev1.Secret{}); err != nil {
		t.Errorf("the user's CA Secret was taken from the source: %v", err)
	}
	if err := source.Client.Get(ctx, types.NamespacedName{Namespace: w.ns, Name: "c1-kubeconfig"}, &corev1.Secret{}); err == nil {
		t.Error("the cluster's own Secret is still on the source")
	}

	tgt := map[string]client.Object{} // "Kind name" -> target object
	cl := &clusterv1.Cluster{}
	kc, ca := &corev1.Secret{}, &corev1.Secret{}
	md, ms := &clusterv1.MachineDeployment{}, &clusterv1.MachineSet{}
	for key, o := range map[string]client.Object{"Cluster c1": cl, "Secret c1-kubeconfig": kc, "MachineDeployment workers": md, "MachineSet workers-abc": ms} {
		name := strings.Fields(key)[1]
		if err := target.Client.Get(ctx, types.NamespacedName{Namespace: w.ns, Name: name}, o); err != nil {
			t.Fatalf("%s on the target: %v", key, err)
		}
		tgt[key] = o
	}
	if err := target.Client.Get(ctx, client.ObjectKeyFromObject(w.userCA), ca); err != nil {
		t.Errorf("the user's CA Secret was not copied: %v", err)
	}
	var machines clusterv1.MachineList
	if err := target.Client.List(ctx, &machines, in); err != nil {
		t.Fatal(err)
	}
	if len(machines.Items) != len(w.machines) {
		t.Fatalf("%d machines on the target, want %d", len(machines.Items), len(w.machines))
	}
	for i := range machines.Items {
		m := &machines.Items[i]
		tgt["Machine "+m.Name] = m
		if got, want := clusterv1.InstanceKey(m), w.uids["Machine "+m.Name]; got != want {
			t.Errorf("machine %s: instance key %s, want its first UID %s", m.Name, got, want)
		}
		if m.Status.ProviderID != "local://"+string(w.uids["Machine "+m.Name]) || m.Status.Phase != clusterv1.MachinePhaseRunning {
			t.Errorf("machine %s: status not copied: %+v", m.Name, m.Status)
		}
	}
	if clusterv1.InstanceKey(cl) != w.uids["Cluster c1"] || cl.Status.Phase != clusterv1.ClusterPhaseProvisioned {
		t.Errorf("cluster: instance key %s, phase %q", clusterv1.InstanceKey(cl), cl.Status.Phase)
	}
	owner := map[string]string{"Secret c1-kubeconfig": "Cluster c1", "MachineSet workers-abc": "MachineDeployment workers"}
	for _, name := range w.machines {
		owner["Machine "+name] = "MachineSet workers-abc"
	}
	for key, o := range tgt {
		if got := o.GetAnnotations()[clusterv1.MovedFromAnnotation]; got != string(w.uids[key]) {
			t.Errorf("%s: moved-from %q, want %q", key, got, w.uids[key])
		}
		if v, ok := o.GetAnnotations()[clusterv1.PausedAnnotation]; ok {
			t.Errorf("%s still paused on the target (%q)", key, v)
		}
		if want := owner[key]; want != "" {
			refs := o.GetOwnerReferences()
			if len(refs) != 1 || refs[0].UID != tgt[want].GetUID() {
				t.Errorf("%s: owner references %v, want %s's target UID %s", key, refs, want, tgt[want].GetUID())
			}
		}
	}
}

func itemsOf(l client.ObjectList) []any {
	switch l := l.(type) {
	case *clusterv1.ClusterList:
		return make([]any, len(l.Items))
	case *clusterv1.MachineDeploymentList:
		return make([]any, len(l.Items))
	case *clusterv1.MachineSetList:
		return make([]any, len(l.Items))
	case *clusterv1.MachineList:
		return make([]any, len(l.Items))
	}
	return nil
}

func opts(ns string) Options {
	return Options{Source: source.Client, Target: target.Client, Namespace: ns, SkipControllerWaits: true}
}

func TestMoveMovesEverything(t *testing.T) {
	w := newWorld(t)
	if err := Run(context.Background(), opts(w.ns)); err != nil {
		t.Fatal(err)
	}
	w.check(t)
	// Run again: nothing left to do, nothing done twice.
	if err := Run(context.Background(), opts(w.ns)); err != nil {
		t.Fatal(err)
	}
	w.check(t)
}

// The move stopped after each of its writes in turn, as a kill would,
// and run again finishes with the same result: nothing lost, nothing made
// twice, no name conflict with its own copies.
func TestMoveStoppedAtEachWriteFinishes(t *testing.T) {
	for k := 1; ; k++ {
		var stopped bool
		t.Run(fmt.Sprintf("after %d writes", k), func(t *testing.T) {
			w := newWorld(t)
			o := opts(w.ns)
			o.StopAfterWrites = k
			err := Run(context.Background(), o)
			if err != nil && !errors.Is(err, ErrStopped) {
				t.Fatalf("first run: %v", err)
			}
			stopped = err != nil
			if err := Run(context.Background(), opts(w.ns)); err != nil {
				t.Fatalf("second run: %v", err)
			}
			w.check(t)
		})
		if !stopped || t.Failed() {
			t.Logf("a move takes %d writes", k-1)
			return
		}
	}
}

func TestMoveRefusesWhatItCannotDo(t *testing.T) {
	ctx := context.Background()
	t.Run("a target without marina's CRDs", func(t *testing.T) {
		bare, err := testenv.StartWorkload()
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = bare.Stop() }()
		o := opts("default")
		o.Target = bare.Client
		if err := Run(ctx, o); err == nil || !strings.Contains(err.Error(), "run marina init there") {
			t.Fatalf("error %v, want one saying to run marina init there", err)
		}
	})
	t.Run("a name the target holds for something else", func(t *testing.T) {
		w := newWorld(t)
		mustCreate(t, target.Client, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "c1-kubeconfig", Namespace: w.ns}})
		err := Run(ctx, opts(w.ns))
		if err == nil || !strings.Contains(err.Error(), "Secret "+w.ns+"/c1-kubeconfig") {
			t.Fatalf("error %v, want one naming the Secret", err)
		}
		// Nothing was paused or written.
		var cl clusterv1.Cluster
		if err := source.Client.Get(ctx, types.NamespacedName{Namespace: w.ns, Name: "c1"}, &cl); err != nil || cl.Annotations[clusterv1.PausedAnnotation] != "" {
			t.Errorf("the source was touched: %v %v", err, cl.Annotations)
		}
	})
}

// Issue 36, finding 5: a Machine its MachineSet makes between the move's
// list and the pause is listed again once the controllers stopped, paused
// and moved with the rest: it ends on the target, and the source keeps no
// Machine for garbage collection to delete there.
func TestMoveCarriesAMachineMadeBeforeThePause(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	o := opts(w.ns)
	var late *clusterv1.Machine
	o.afterList = func() {
		var ms clusterv1.MachineSet
		if err := source.Client.Get(ctx, types.NamespacedName{Namespace: w.ns, Name: "workers-abc"}, &ms); err != nil {
			t.Fatal(err)
		}
		late = &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: "workers-abc-late", Namespace: w.ns, Labels: ms.Spec.Template.ObjectMeta.Labels, Finalizers: []string{clusterv1.MachineFinalizer},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "MachineSet", Name: ms.Name, UID: ms.UID, Controller: ptr(true)}}},
			Spec: ms.Spec.Template.Spec,
		}
		mustCreate(t, source.Client, late)
		late.Status.ProviderID = "local://" + string(late.UID)
		late.Status.Phase = clusterv1.MachinePhaseRunning
		if err := source.Client.Status().Update(ctx, late); err != nil {
			t.Fatal(err)
		}
	}
	var out strings.Builder
	o.Out = &out
	if err := Run(ctx, o); err != nil {
		t.Fatal(err)
	}
	w.uids["Machine "+late.Name] = late.UID
	w.machines = append(w.machines, late.Name)
	w.check(t)
	if !strings.Contains(out.String(), "Found 1 objects made before the pause: Machine "+w.ns+"/workers-abc-late") {
		t.Errorf("the move did not say it found the late machine:\n%s", out.String())
	}
}

// Issue 36, finding 1: machines whose provider keeps records the move
// cannot carry (SSH hosts) are refused, named, with nothing paused.
func TestMoveRefusesMachinesItsProviderCannotMove(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	o := opts(w.ns)
	local := schema.GroupVersionKind{Group: "local.marina.dev", Version: "v1alpha1", Kind: "LocalMachine"}
	o.Providers = Providers{local: {Refusal: "its records stay on the source"}}
	err := Run(ctx, o)
	if !errors.Is(err, ErrCannotMove) || !strings.Contains(err.Error(), "Cluster "+w.ns+"/c1 (LocalMachine)") ||
		!strings.Contains(err.Error(), "Machine "+w.ns+"/workers-abc-0 (LocalMachine)") || !strings.Contains(err.Error(), "its records stay on the source") {
		t.Fatalf("error %v, want ErrCannotMove naming the cluster and the machines", err)
	}
	var machines clusterv1.MachineList
	if err := source.Client.List(ctx, &machines, client.InNamespace(w.ns)); err != nil {
		t.Fatal(err)
	}
	for _, m := range machines.Items {
		if _, paused := m.Annotations[clusterv1.PausedAnnotation]; paused {
			t.Errorf("machine %s was paused although the move was refused", m.Name)
		}
	}
}

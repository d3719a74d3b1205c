package webhook_test

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/webhook"
)

// The attacks of issue 24 on admission, each made by whoever may edit a
// Cluster or create a Machine: each is refused with a message that says
// what is wrong, and the stored object is left as it was.

// nextMinor is v's next minor release, vX.(Y+1).0.
func nextMinor(v clusterv1.KubernetesVersion) clusterv1.KubernetesVersion {
	p := version.MustParseSemantic(string(v))
	return clusterv1.KubernetesVersion(fmt.Sprintf("v%d.%d.0", p.Major(), p.Minor()+1))
}

// minorsBack is v's release n minors earlier, vX.(Y-n).0.
func minorsBack(v clusterv1.KubernetesVersion, n uint) clusterv1.KubernetesVersion {
	p := version.MustParseSemantic(string(v))
	return clusterv1.KubernetesVersion(fmt.Sprintf("v%d.%d.0", p.Major(), p.Minor()-n))
}

// unchanged asserts that obj is stored as it was before a refused write.
func unchanged(t *testing.T, before client.Object) {
	t.Helper()
	after := before.DeepCopyObject().(client.Object)
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(before), after); err != nil {
		t.Fatal(err)
	}
	if after.GetResourceVersion() != before.GetResourceVersion() {
		t.Errorf("%T %s changed (resourceVersion %s -> %s) although the write was refused",
			before, before.GetName(), before.GetResourceVersion(), after.GetResourceVersion())
	}
}

// patchRefused sends a patch and asserts it is refused as invalid at field
// with a message containing want, the object unchanged.
func patchRefused(t *testing.T, c client.Client, obj client.Object, patch client.Patch, field, want string) {
	t.Helper()
	before := obj.DeepCopyObject().(client.Object)
	err := c.Patch(context.Background(), obj.DeepCopyObject().(client.Object), patch)
	if err == nil {
		t.Fatalf("patch of %T %s was accepted; want it refused at %s", obj, obj.GetName(), field)
	}
	assertInvalid(t, err, field, want)
	unchanged(t, before)
}

func mergePatch(s string) client.Patch { return client.RawPatch(types.MergePatchType, []byte(s)) }

// tenant is a client that acts as alice of group tenants, who may write
// marina's kinds (RBAC) but is not an administrator.
func tenant(t *testing.T) client.Client {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "attack-tenant"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{clusterv1.GroupVersion.Group}, Resources: []string{"*"}, Verbs: []string{"*"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "attack-tenant"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "tenants"}},
	}
	for _, obj := range []client.Object{role, binding} {
		if err := env.Client.Create(ctx, obj); client.IgnoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "alice", Groups: []string{"tenants"}}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Finding 1: extraArgs that would rewire a component on the management
// host are refused on create and on update, with the field and the reason.
func TestAttackExtraArgsRewiring(t *testing.T) {
	ns := env.Namespace(t)
	stored := newCluster(ns)
	create(t, stored)
	for _, tc := range []struct {
		component, flag, value, want string
	}{
		{"apiServer", "bind-address", "0.0.0.0", "kube-apiserver --bind-address is owned by marina: it sets an address or port"},
		{"apiServer", "authorization-mode", "AlwaysAllow", "(authorization and admission)"},
		{"apiServer", "etcd-servers", "https://127.0.0.1:2379", "it wires the API server to etcd"},
		{"controllerManager", "cluster-signing-cert-file", "/state/pki/ca.crt", "it names service-account or signing keys"},
		{"controllerManager", "cluster-signing-key-file", "/state/pki/ca.key", "it names service-account or signing keys"},
		{"scheduler", "kubeconfig", "/state/admin.kubeconfig", "it names a file or directory"},
	} {
		t.Run(tc.component+" "+tc.flag, func(t *testing.T) {
			field := fmt.Sprintf("spec.controlPlane.components.%s.extraArgs[%s]", tc.component, tc.flag)
			c := newCluster(ns)
			c.Name = "new-" + strings.ReplaceAll(tc.flag, "-", "")[:8]
			settings := clusterv1.ComponentSettings{ExtraArgs: map[string]string{tc.flag: tc.value}}
			switch tc.component {
			case "apiServer":
				c.Spec.ControlPlane.Components.APIServer = settings
			case "controllerManager":
				c.Spec.ControlPlane.Components.ControllerManager = settings
			case "scheduler":
				c.Spec.ControlPlane.Components.Scheduler = settings
			}
			refused(t, c, field, tc.want)
			patchRefused(t, env.Client, stored, mergePatch(fmt.Sprintf(
				`{"spec":{"controlPlane":{"components":{%q:{"extraArgs":{%q:%q}}}}}}`, tc.component, tc.flag, tc.value)), field, tc.want)
		})
	}
}

// Finding 4: a stored error is forgiven only where the update leaves the
// value alone. A worker made before its Cluster, its kubelet a minor above
// the control plane, may be relabelled, but its kubelet not moved to
// another version the control plane cannot serve.
func TestAttackKubeletEditedToAnotherBadVersion(t *testing.T) {
	ns := env.Namespace(t)
	m := newWorker(ns, "ahead")
	m.Spec.Versions.Kubelet = nextMinor(newest)
	create(t, m) // no Cluster yet: not checked
	create(t, newCluster(ns))

	bumped := nextMinor(newest)[:len(nextMinor(newest))-1] + "1" // vX.Y+1.1
	patchRefused(t, env.Client, m, mergePatch(fmt.Sprintf(`{"spec":{"versions":{"kubelet":%q}}}`, bumped)),
		"spec.versions.kubelet", "must not be newer than the cluster's control plane ("+string(newest)+")")
	// v1.38 -> v1.45: the schema refuses a kubelet that skips minors.
	far := nextMinor(nextMinor(nextMinor(nextMinor(nextMinor(nextMinor(nextMinor(nextMinor(newest))))))))
	patchRefused(t, env.Client, m, mergePatch(fmt.Sprintf(`{"spec":{"versions":{"kubelet":%q}}}`, far)),
		"spec.versions.kubelet", "may go up by at most one minor version at a time")

	if err := env.Client.Patch(context.Background(), m, mergePatch(`{"metadata":{"labels":{"team":"a"}}}`)); err != nil {
		t.Errorf("relabelling the machine (its kubelet untouched) was refused: %v", err)
	}
}

// Version skew on update: a worker's kubelet never goes down a minor, nor
// up two; a template's likewise.
func TestAttackKubeletSkipsOrGoesDownAMinor(t *testing.T) {
	ns := env.Namespace(t)
	create(t, newCluster(ns))
	m := newWorker(ns, "w")
	create(t, m)
	patchRefused(t, env.Client, m, mergePatch(fmt.Sprintf(`{"spec":{"versions":{"kubelet":%q}}}`, minorsBack(newest, 1))),
		"spec.versions.kubelet", "never down a minor version")
	set := newMachineSet(ns, newWorker(ns, "").Spec)
	create(t, set)
	patchRefused(t, env.Client, set, mergePatch(fmt.Sprintf(`{"spec":{"template":{"spec":{"versions":{"kubelet":%q}}}}}`, minorsBack(newest, 1))),
		"spec.template.spec.versions.kubelet", "never down a minor version")
}

// The skew policy against what the API servers run: a worker's kubelet is
// not newer than the oldest API server, and at most three minors older
// than the control plane.
func TestAttackKubeletAgainstTheRunningAPIServers(t *testing.T) {
	ns := env.Namespace(t)
	cl := newCluster(ns)
	create(t, cl)
	cl.Status.ControlPlane.Components.APIServer = string(minorsBack(newest, 1))
	if err := env.Client.Status().Update(context.Background(), cl); err != nil {
		t.Fatal(err)
	}
	refused(t, newWorker(ns, "ahead-of-running"), "spec.versions.kubelet",
		"must not be newer than the oldest API server the cluster runs ("+string(minorsBack(newest, 1)))
	old := newWorker(ns, "too-old")
	old.Spec.Versions.Kubelet = minorsBack(newest, 4)
	refused(t, old, "spec.versions.kubelet", "must be at most 3 minor versions older than the cluster's control plane")
}

// Finding 5: once set, the endpoint cannot be removed, by a JSON patch of
// the endpoint or of its host, nor changed.
func TestAttackEndpointRemoval(t *testing.T) {
	ns := env.Namespace(t)
	c := newCluster(ns)
	c.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: "127.0.0.50", Port: 6443}
	create(t, c)
	const want = "controlPlaneEndpoint cannot be removed or changed once set"
	for _, patch := range []string{
		`[{"op":"remove","path":"/spec/controlPlaneEndpoint"}]`,
		`[{"op":"remove","path":"/spec/controlPlaneEndpoint/host"}]`,
		`[{"op":"replace","path":"/spec/controlPlaneEndpoint","value":{}}]`,
	} {
		patchRefused(t, env.Client, c, client.RawPatch(types.JSONPatchType, []byte(patch)), "spec.controlPlaneEndpoint", want)
	}
	got := &clusterv1.Cluster{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(c), got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Spec.ControlPlaneEndpoint, c.Spec.ControlPlaneEndpoint) {
		t.Errorf("endpoint is %+v, want %+v", got.Spec.ControlPlaneEndpoint, c.Spec.ControlPlaneEndpoint)
	}
	// An endpoint not yet set may still be set (by marina or the user).
	unset := newCluster(ns)
	unset.Name = "unset"
	create(t, unset)
	if err := env.Client.Patch(context.Background(), unset, mergePatch(`{"spec":{"controlPlaneEndpoint":{"host":"127.0.0.51","port":6443}}}`)); err != nil {
		t.Errorf("setting an endpoint that was empty was refused: %v", err)
	}
}

// Finding 3: a tenant's machine cannot claim a control plane, another
// cluster, or a deployment; only marina's controllers and administrators
// set those labels.
func TestAttackTenantClaimsMembership(t *testing.T) {
	ns := env.Namespace(t)
	create(t, newCluster(ns))
	victim := newCluster(ns)
	victim.Name = "victim"
	create(t, victim)
	alice := tenant(t)
	ctx := context.Background()

	claim := newWorker(ns, "claim-cp")
	claim.Labels = map[string]string{clusterv1.ClusterNameLabel: "prod", clusterv1.ControlPlaneLabel: ""}
	err := alice.Create(ctx, claim)
	if err == nil {
		t.Fatal("a tenant's worker labelled control-plane was accepted")
	}
	assertInvalid(t, err, "metadata.labels[cluster.marina.dev/control-plane]", "only marina's controllers and administrators")
	assertInvalid(t, err, "metadata.labels[cluster.marina.dev/control-plane]", "have the ControlPlane role")

	other := newWorker(ns, "claim-victim")
	other.Labels = map[string]string{clusterv1.ClusterNameLabel: "victim"}
	if err := alice.Create(ctx, other); err == nil {
		t.Error("a tenant's worker of prod labelled as victim's was accepted")
	} else {
		assertInvalid(t, err, "metadata.labels[cluster.marina.dev/cluster-name]", `must be the machine's spec.clusterName ("prod")`)
	}

	// Labelled rightly, the tenant's worker is accepted; relabelling it
	// into a control plane or a deployment is not.
	mine := newWorker(ns, "mine")
	mine.Labels = map[string]string{clusterv1.ClusterNameLabel: "prod"}
	if err := alice.Create(ctx, mine); err != nil {
		t.Fatalf("a tenant's worker labelled with its own cluster was refused: %v", err)
	}
	patchRefused(t, alice, mine, mergePatch(`{"metadata":{"labels":{"cluster.x-k8s.io/deployment-name":"pool"}}}`),
		"metadata.labels[cluster.x-k8s.io/deployment-name]", "only marina's controllers and administrators")
	set := newMachineSet(ns, newWorker(ns, "").Spec)
	set.Spec.Template.ObjectMeta.Labels[clusterv1.MachineTemplateHashLabel] = "abc"
	if err := alice.Create(ctx, set); err == nil {
		t.Error("a tenant's set whose template carries a revision's hash was accepted")
	} else {
		assertInvalid(t, err, "spec.template.metadata.labels[cluster.marina.dev/machine-template-hash]", "only marina's controllers and administrators")
	}

	// marina's controllers and administrators may.
	if err := env.Client.Patch(ctx, mine, mergePatch(`{"metadata":{"labels":{"cluster.x-k8s.io/deployment-name":"pool"}}}`)); err != nil {
		t.Errorf("an administrator's label change was refused: %v", err)
	}
	if webhook.ControllerUser != "system:serviceaccount:marina-system:marina-controller" {
		t.Errorf("the webhook exempts %s; config/tenancy exempts marina-system/marina-controller", webhook.ControllerUser)
	}
}

// marina move's instance key names the real machine a Machine acts on: a
// tenant who set it to another machine's key, on a Machine or in a set's
// template, could delete or take over that machine. Only marina's
// controllers and administrators may set it.
func TestAttackTenantPointsAMachineAtAnotherOnesSandbox(t *testing.T) {
	ns := env.Namespace(t)
	create(t, newCluster(ns))
	alice := tenant(t)
	ctx := context.Background()
	victim := newWorker(ns, "victim")
	create(t, victim)

	thief := newWorker(ns, "thief")
	thief.Annotations = map[string]string{clusterv1.InstanceKeyAnnotation: string(victim.UID)}
	if err := alice.Create(ctx, thief); err == nil {
		t.Fatal("a tenant's machine naming another machine's instance key was accepted")
	} else {
		assertInvalid(t, err, "metadata.annotations[cluster.marina.dev/instance-key]", "only marina's controllers and administrators")
	}
	mine := newWorker(ns, "mine")
	if err := alice.Create(ctx, mine); err != nil {
		t.Fatalf("a tenant's plain machine was refused: %v", err)
	}
	patchRefused(t, alice, mine, mergePatch(`{"metadata":{"annotations":{"cluster.marina.dev/instance-key":"`+string(victim.UID)+`"}}}`),
		"metadata.annotations[cluster.marina.dev/instance-key]", "only marina's controllers and administrators")
	set := newMachineSet(ns, newWorker(ns, "").Spec)
	set.Spec.Template.ObjectMeta.Annotations = map[string]string{clusterv1.InstanceKeyAnnotation: string(victim.UID)}
	if err := alice.Create(ctx, set); err == nil {
		t.Error("a tenant's set whose template carries an instance key was accepted")
	} else {
		assertInvalid(t, err, "spec.template.metadata.annotations[cluster.marina.dev/instance-key]", "only marina's controllers and administrators")
	}
	// An administrator (marina move) may.
	moved := newWorker(ns, "moved")
	moved.Annotations = map[string]string{clusterv1.InstanceKeyAnnotation: "first-uid"}
	if err := env.Client.Create(ctx, moved); err != nil {
		t.Errorf("an administrator's machine with an instance key was refused: %v", err)
	}
}

// Finding 5 (dnsDomain): every label of the cluster's DNS domain is at most
// 63 characters, as DNS allows.
func TestAttackDNSDomainLabelTooLong(t *testing.T) {
	ns := env.Namespace(t)
	c := newCluster(ns)
	c.Spec.ClusterNetwork.DNSDomain = strings.Repeat("a", 64) + ".local"
	refused(t, c, "spec.clusterNetwork.dnsDomain", "at most 63 characters")
}

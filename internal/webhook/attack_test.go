package webhook_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/config"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/internal/webhook"
)

// The attacks of issue 24 on admission, in one place: each is made by a
// tenant (alice of group tenants, with the RBAC tenants are given and the
// tenancy policy of config/tenancy in force, not an administrator) against
// the real API server and the real webhook; each is refused with a message
// that says what is wrong, and the stored object is left as it was.

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
	refusal(t, err, field, want)
	unchanged(t, before)
}

func mergePatch(s string) client.Patch { return client.RawPatch(types.MergePatchType, []byte(s)) }

// tenant is a client that acts as alice of group tenants, with the RBAC
// docs/management-plane.md tells administrators to grant tenants (write
// Clusters, Machines, MachineSets and MachineDeployments; read the
// published MachineClasses), not an administrator, and with the tenancy
// policy of config/tenancy in force, as marina init installs it.
func tenant(t *testing.T) client.Client {
	t.Helper()
	ctx := context.Background()
	group := clusterv1.GroupVersion.Group
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "attack-tenant"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{group}, Resources: []string{"clusters", "machines", "machinesets", "machinedeployments"}, Verbs: []string{"*"}},
			{APIGroups: []string{group}, Resources: []string{"machineclasses"}, Verbs: []string{"get", "list", "watch"}},
		},
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
	applyTenancyPolicy(t)
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "alice", Groups: []string{"tenants"}}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	// The policy takes effect asynchronously after it is created: a
	// tenant's class-less machine, tried without being stored, is refused
	// by it once it is in force.
	ns := env.Namespace(t)
	testenv.Eventually(t, 30*time.Second, "the tenancy policy to be in force", func() error {
		err := c.Create(ctx, newWorker(ns, "probe"), client.DryRunAll)
		switch {
		case err == nil:
			return errors.New("a class-less machine was accepted")
		case !strings.Contains(err.Error(), "only marina administrators may describe a machine without a MachineClass"):
			return fmt.Errorf("refused for another reason: %w", err)
		}
		return nil
	})
	return c
}

var tenancyOnce sync.Once

// applyTenancyPolicy creates the objects of config/tenancy/policy.yaml, the
// file marina init and kubectl apply -k config/default install.
func applyTenancyPolicy(t *testing.T) {
	t.Helper()
	var err error
	tenancyOnce.Do(func() {
		var data []byte
		if data, err = config.Install.ReadFile("tenancy/policy.yaml"); err != nil {
			return
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			obj := &unstructured.Unstructured{}
			if err = dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
				err = nil
				return
			} else if err != nil {
				return
			}
			if len(obj.Object) == 0 {
				continue
			}
			if err = env.Client.Create(context.Background(), obj); client.IgnoreAlreadyExists(err) != nil {
				return
			}
		}
	})
	if err != nil {
		t.Fatalf("applying config/tenancy: %v", err)
	}
}

// tenantCluster is a Cluster as a tenant writes it: its control plane from
// a published class.
func tenantCluster(ns, name string, mc *clusterv1.MachineClass) *clusterv1.Cluster {
	c := newCluster(ns)
	c.Name = name
	c.Spec.ControlPlane.ProviderSpec = nil
	c.Spec.ControlPlane.ClassRef = &clusterv1.MachineClassReference{Name: mc.Name}
	return c
}

// tenantWorker is a worker of cluster prod as a tenant writes it.
func tenantWorker(ns, name string, mc *clusterv1.MachineClass) *clusterv1.Machine {
	m := newWorker(ns, name)
	m.Spec.ProviderSpec = nil
	m.Spec.ClassRef = &clusterv1.MachineClassReference{Name: mc.Name}
	return m
}

// createAs creates obj as c, failing the test when refused.
func createAs(t *testing.T, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

// refusedAs asserts that c may not create obj: refused with a message
// containing want (at field, when the webhook refuses; the tenancy
// policy's refusals name no field), and nothing stored.
func refusedAs(t *testing.T, c client.Client, obj client.Object, field, want string) {
	t.Helper()
	err := c.Create(context.Background(), obj.DeepCopyObject().(client.Object))
	if err == nil {
		t.Fatalf("%T %s was accepted; want it refused: %s", obj, obj.GetName(), want)
	}
	refusal(t, err, field, want)
	got := obj.DeepCopyObject().(client.Object)
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), got); !apierrors.IsNotFound(err) {
		t.Errorf("refused %T %s was stored anyway (get: %v)", obj, obj.GetName(), err)
	}
}

// refusal asserts err refuses a write as invalid at field with a message
// containing want, or, with field empty, as the tenancy policy does.
func refusal(t *testing.T, err error, field, want string) {
	t.Helper()
	if field != "" {
		assertInvalid(t, err, field, want)
		return
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("refused for another reason: %v; want %q", err, want)
	}
}

// Finding 1: extraArgs that would rewire a component on the management
// host are refused on create and on update, with the field and the reason.
// The components read '_' in a flag's name as '-': authorization_mode is
// authorization-mode (accepted before).
func TestAttackExtraArgsRewiring(t *testing.T) {
	ns := env.Namespace(t)
	alice := tenant(t)
	mc := class(t)
	stored := tenantCluster(ns, "prod", mc)
	createAs(t, alice, stored)
	for _, tc := range []struct {
		component, flag, value, want string
	}{
		{"apiServer", "bind-address", "0.0.0.0", "kube-apiserver --bind-address is owned by marina: it sets an address or port"},
		{"apiServer", "authorization-mode", "AlwaysAllow", "(authorization and admission)"},
		{"apiServer", "authorization_mode", "AlwaysAllow", "kube-apiserver --authorization_mode is owned by marina: it decides what callers may do"},
		{"apiServer", "enable_admission_plugins", "AlwaysAdmit", "(authorization and admission)"},
		{"apiServer", "etcd-servers", "https://127.0.0.1:2379", "it wires the API server to etcd"},
		{"controllerManager", "cluster-signing-cert-file", "/state/pki/ca.crt", "it names service-account or signing keys"},
		{"controllerManager", "cluster-signing-key-file", "/state/pki/ca.key", "it names service-account or signing keys"},
		{"controllerManager", "cluster_signing_key_file", "/state/pki/ca.key", "it names service-account or signing keys"},
		// Paths outside the machine's sandbox: every path is marina's.
		{"apiServer", "audit-log-path", "/state/other-cluster/audit.log", "it names a file or directory on the machine"},
		{"scheduler", "kubeconfig", "/state/admin.kubeconfig", "it names a file or directory"},
		{"controllerManager", "flex-volume-plugin-dir", "/", "it names a file or directory"},
	} {
		t.Run(tc.component+" "+tc.flag, func(t *testing.T) {
			field := fmt.Sprintf("spec.controlPlane.components.%s.extraArgs[%s]", tc.component, tc.flag)
			c := tenantCluster(ns, "new-"+strings.NewReplacer("-", "", "_", "").Replace(tc.flag)[:8], mc)
			settings := clusterv1.ComponentSettings{ExtraArgs: map[string]string{tc.flag: tc.value}}
			switch tc.component {
			case "apiServer":
				c.Spec.ControlPlane.Components.APIServer = settings
			case "controllerManager":
				c.Spec.ControlPlane.Components.ControllerManager = settings
			case "scheduler":
				c.Spec.ControlPlane.Components.Scheduler = settings
			}
			refusedAs(t, alice, c, field, tc.want)
			patchRefused(t, alice, stored, mergePatch(fmt.Sprintf(
				`{"spec":{"controlPlane":{"components":{%q:{"extraArgs":{%q:%q}}}}}}`, tc.component, tc.flag, tc.value)), field, tc.want)
		})
	}
}

// Finding 4: a stored error is forgiven only where the update leaves the
// value alone. A worker made before its Cluster, its kubelet a minor above
// the control plane (v1.38 against v1.37), may be relabelled, but its
// kubelet not moved to another version the control plane cannot serve
// (v1.38.1, or v1.45).
func TestAttackKubeletEditedToAnotherBadVersion(t *testing.T) {
	ns := env.Namespace(t)
	alice := tenant(t)
	mc := class(t)
	m := tenantWorker(ns, "ahead", mc)
	m.Spec.Versions.Kubelet = nextMinor(newest)
	// No Cluster yet: not checked, and the warning says what is not.
	var warned warnings
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "alice", Groups: []string{"tenants"}}
	cfg.WarningHandler = &warned
	early, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	createAs(t, early, m)
	if want := "nothing refuses one older than it: create the Cluster first"; !warned.contain(want) {
		t.Errorf("warnings %q; want one saying %q", warned.texts, want)
	}
	createAs(t, alice, tenantCluster(ns, "prod", mc))

	bumped := nextMinor(newest)[:len(nextMinor(newest))-1] + "1" // vX.Y+1.1
	patchRefused(t, alice, m, mergePatch(fmt.Sprintf(`{"spec":{"versions":{"kubelet":%q}}}`, bumped)),
		"spec.versions.kubelet", "must not be newer than the cluster's control plane ("+string(newest)+")")
	// v1.38 -> v1.45: the schema refuses a kubelet that skips minors.
	far := nextMinor(nextMinor(nextMinor(nextMinor(nextMinor(nextMinor(nextMinor(nextMinor(newest))))))))
	patchRefused(t, alice, m, mergePatch(fmt.Sprintf(`{"spec":{"versions":{"kubelet":%q}}}`, far)),
		"spec.versions.kubelet", "may go up by at most one minor version at a time")

	if err := alice.Patch(context.Background(), m, mergePatch(`{"metadata":{"labels":{"team":"a"}}}`)); err != nil {
		t.Errorf("relabelling the machine (its kubelet untouched) was refused: %v", err)
	}
}

// Version skew on update: a worker's kubelet never goes down a minor, nor
// up two; a template's likewise.
func TestAttackKubeletSkipsOrGoesDownAMinor(t *testing.T) {
	ns := env.Namespace(t)
	alice := tenant(t)
	mc := class(t)
	createAs(t, alice, tenantCluster(ns, "prod", mc))
	m := tenantWorker(ns, "w", mc)
	createAs(t, alice, m)
	patchRefused(t, alice, m, mergePatch(fmt.Sprintf(`{"spec":{"versions":{"kubelet":%q}}}`, minorsBack(newest, 1))),
		"spec.versions.kubelet", "never down a minor version")
	set := newMachineSet(ns, tenantWorker(ns, "", mc).Spec)
	createAs(t, alice, set)
	patchRefused(t, alice, set, mergePatch(fmt.Sprintf(`{"spec":{"template":{"spec":{"versions":{"kubelet":%q}}}}}`, minorsBack(newest, 1))),
		"spec.template.spec.versions.kubelet", "never down a minor version")
}

// The skew policy against what the API servers run: a worker's kubelet, or
// a set's template's, is not newer than the oldest API server, and at most
// three minors older than the control plane.
func TestAttackKubeletAgainstTheRunningAPIServers(t *testing.T) {
	ns := env.Namespace(t)
	alice := tenant(t)
	mc := class(t)
	cl := tenantCluster(ns, "prod", mc)
	createAs(t, alice, cl)
	cl.Status.ControlPlane.Components.APIServer = string(minorsBack(newest, 1))
	if err := env.Client.Status().Update(context.Background(), cl); err != nil {
		t.Fatal(err)
	}
	const ahead = "must not be newer than the oldest API server the cluster runs ("
	refusedAs(t, alice, tenantWorker(ns, "ahead-of-running", mc), "spec.versions.kubelet", ahead+string(minorsBack(newest, 1)))
	old := tenantWorker(ns, "too-old", mc)
	old.Spec.Versions.Kubelet = minorsBack(newest, 4)
	refusedAs(t, alice, old, "spec.versions.kubelet", "must be at most 3 minor versions older than the cluster's control plane")
	refusedAs(t, alice, newMachineSet(ns, tenantWorker(ns, "", mc).Spec), "spec.template.spec.versions.kubelet", ahead+string(minorsBack(newest, 1)))
}

// Finding 5: once set, the endpoint cannot be removed, by a JSON patch of
// the endpoint or of its host, nor changed.
func TestAttackEndpointRemoval(t *testing.T) {
	ns := env.Namespace(t)
	alice := tenant(t)
	mc := class(t)
	c := tenantCluster(ns, "prod", mc)
	c.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: "127.0.0.50", Port: 6443}
	createAs(t, alice, c)
	const want = "controlPlaneEndpoint cannot be removed or changed once set"
	for _, patch := range []string{
		`[{"op":"remove","path":"/spec/controlPlaneEndpoint"}]`,
		`[{"op":"remove","path":"/spec/controlPlaneEndpoint/host"}]`,
		`[{"op":"replace","path":"/spec/controlPlaneEndpoint","value":{}}]`,
		`[{"op":"replace","path":"/spec/controlPlaneEndpoint/host","value":"127.0.0.1"}]`,
	} {
		patchRefused(t, alice, c, client.RawPatch(types.JSONPatchType, []byte(patch)), "spec.controlPlaneEndpoint", want)
	}
	got := &clusterv1.Cluster{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(c), got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Spec.ControlPlaneEndpoint, c.Spec.ControlPlaneEndpoint) {
		t.Errorf("endpoint is %+v, want %+v", got.Spec.ControlPlaneEndpoint, c.Spec.ControlPlaneEndpoint)
	}
	// An endpoint not yet set may still be set (by marina or the user).
	unset := tenantCluster(ns, "unset", mc)
	createAs(t, alice, unset)
	if err := alice.Patch(context.Background(), unset, mergePatch(`{"spec":{"controlPlaneEndpoint":{"host":"127.0.0.51","port":6443}}}`)); err != nil {
		t.Errorf("setting an endpoint that was empty was refused: %v", err)
	}
}

// Finding 3: a tenant's machine cannot claim a control plane, another
// cluster, or a deployment; only marina's controllers and administrators
// set those labels.
func TestAttackTenantClaimsMembership(t *testing.T) {
	ns := env.Namespace(t)
	alice := tenant(t)
	mc := class(t)
	createAs(t, alice, tenantCluster(ns, "prod", mc))
	createAs(t, alice, tenantCluster(ns, "victim", mc))
	ctx := context.Background()

	claim := tenantWorker(ns, "claim-cp", mc)
	claim.Labels = map[string]string{clusterv1.ClusterNameLabel: "prod", clusterv1.ControlPlaneLabel: ""}
	err := alice.Create(ctx, claim)
	if err == nil {
		t.Fatal("a tenant's worker labelled control-plane was accepted")
	}
	assertInvalid(t, err, "metadata.labels[cluster.marina.dev/control-plane]", "only marina's controllers and administrators")
	assertInvalid(t, err, "metadata.labels[cluster.marina.dev/control-plane]", "have the ControlPlane role")

	// With the role too, the tenancy policy refuses it.
	master := tenantWorker(ns, "master", mc)
	master.Labels = map[string]string{clusterv1.ClusterNameLabel: "victim", clusterv1.ControlPlaneLabel: ""}
	master.Spec.ClusterName = "victim"
	master.Spec.Roles = []clusterv1.MachineRole{clusterv1.ControlPlaneRole}
	master.Spec.Versions.ControlPlane = newest
	refusedAs(t, alice, master, "", "only marina administrators may create control-plane machines")

	other := tenantWorker(ns, "claim-victim", mc)
	other.Labels = map[string]string{clusterv1.ClusterNameLabel: "victim"}
	refusedAs(t, alice, other, "metadata.labels[cluster.marina.dev/cluster-name]", `must be the machine's spec.clusterName ("prod")`)

	// Labelled rightly, the tenant's worker is accepted; relabelling it
	// into a control plane or a deployment is not.
	mine := tenantWorker(ns, "mine", mc)
	mine.Labels = map[string]string{clusterv1.ClusterNameLabel: "prod"}
	createAs(t, alice, mine)
	patchRefused(t, alice, mine, mergePatch(`{"metadata":{"labels":{"cluster.marina.dev/control-plane":""}}}`),
		"metadata.labels[cluster.marina.dev/control-plane]", "only marina's controllers and administrators")
	patchRefused(t, alice, mine, mergePatch(`{"metadata":{"labels":{"cluster.x-k8s.io/deployment-name":"pool"}}}`),
		"metadata.labels[cluster.x-k8s.io/deployment-name]", "only marina's controllers and administrators")
	set := newMachineSet(ns, tenantWorker(ns, "", mc).Spec)
	set.Spec.Template.ObjectMeta.Labels[clusterv1.MachineTemplateHashLabel] = "abc"
	refusedAs(t, alice, set, "spec.template.metadata.labels[cluster.marina.dev/machine-template-hash]", "only marina's controllers and administrators")
	cpSet := newMachineSet(ns, tenantWorker(ns, "", mc).Spec)
	cpSet.Spec.Template.ObjectMeta.Labels[clusterv1.ControlPlaneLabel] = ""
	refusedAs(t, alice, cpSet, "spec.template.metadata.labels[cluster.marina.dev/control-plane]", "only marina's controllers and administrators")

	// Nor can it make the Cluster its machine's controller, which with the
	// label is what makes a control-plane member.
	prod := &clusterv1.Cluster{}
	if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "prod"}, prod); err != nil {
		t.Fatal(err)
	}
	forged := tenantWorker(ns, "forged", mc)
	forged.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(prod, clusterv1.GroupVersion.WithKind("Cluster"))}
	forged.OwnerReferences[0].BlockOwnerDeletion = nil
	refusedAs(t, alice, forged, "metadata.ownerReferences", "may make a Cluster (prod) a machine's controller")
	patchRefused(t, alice, mine, client.RawPatch(types.JSONPatchType, []byte(fmt.Sprintf(
		`[{"op":"add","path":"/metadata/ownerReferences","value":[{"apiVersion":%q,"kind":"Cluster","name":"prod","uid":%q,"controller":true}]}]`,
		clusterv1.GroupVersion.String(), prod.UID))), "metadata.ownerReferences", "may make a Cluster (prod) a machine's controller")

	// Nor the annotations by which the control plane steers its machines:
	// the settings handed to their components as flags, etcd's start.
	settings := `{"metadata":{"annotations":{"cluster.marina.dev/component-settings":"{\"v1.37.2\":{\"apiServer\":{\"extraArgs\":{\"authorization-mode\":\"AlwaysAllow\"}}}}"}}}`
	patchRefused(t, alice, mine, mergePatch(settings),
		"metadata.annotations[cluster.marina.dev/component-settings]", "only marina's controllers and administrators (group marina:admins) may add, change or remove this annotation")
	initSet := newMachineSet(ns, tenantWorker(ns, "", mc).Spec)
	initSet.Spec.Template.ObjectMeta.Annotations = map[string]string{clusterv1.EtcdInitAnnotation: "true"}
	refusedAs(t, alice, initSet, "spec.template.metadata.annotations[cluster.marina.dev/etcd-init]", "may add, change or remove this annotation")

	// marina's controllers and administrators may.
	if err := env.Client.Patch(ctx, mine, mergePatch(`{"metadata":{"labels":{"cluster.x-k8s.io/deployment-name":"pool"}}}`)); err != nil {
		t.Errorf("an administrator's label change was refused: %v", err)
	}
	if webhook.ControllerUser != "system:serviceaccount:marina-system:marina-controller" {
		t.Errorf("the webhook exempts %s; config/tenancy exempts marina-system/marina-controller", webhook.ControllerUser)
	}
}

// Tenancy for Clusters: a tenant's control plane comes from a class, on
// create and on update; the class's allowed overrides bound what a tenant
// may add to it.
func TestAttackTenantWritesTheControlPlanesProviderSpec(t *testing.T) {
	ns := env.Namespace(t)
	alice := tenant(t)
	mc := class(t)
	const want = "only marina administrators may describe a control plane without a MachineClass"
	refusedAs(t, alice, newCluster(ns), "", want)
	stored := tenantCluster(ns, "prod", mc)
	createAs(t, alice, stored)
	patchRefused(t, alice, stored, client.RawPatch(types.JSONPatchType, []byte(fmt.Sprintf(
		`[{"op":"remove","path":"/spec/controlPlane/classRef"},{"op":"add","path":"/spec/controlPlane/providerSpec","value":%s}]`, localSpec))), "", want)
	patchRefused(t, alice, stored, mergePatch(`{"spec":{"controlPlane":{"providerSpec":{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":64}}}}}`),
		"spec.controlPlane.providerSpec.spec.cpu", "does not allow overriding this field (allowed: spec.diskSize)")
}

// marina move's instance key names the real machine a Machine acts on: a
// tenant who set it to another machine's key, on a Machine or in a set's
// template, could delete or take over that machine. Only marina's
// controllers and administrators may set it.
func TestAttackTenantPointsAMachineAtAnotherOnesSandbox(t *testing.T) {
	ns := env.Namespace(t)
	alice := tenant(t)
	mc := class(t)
	createAs(t, alice, tenantCluster(ns, "prod", mc))
	victim := tenantWorker(ns, "victim", mc)
	create(t, victim)
	const field, want = "metadata.annotations[cluster.marina.dev/instance-key]", "only marina's controllers and administrators"

	thief := tenantWorker(ns, "thief", mc)
	thief.Annotations = map[string]string{clusterv1.InstanceKeyAnnotation: string(victim.UID)}
	refusedAs(t, alice, thief, field, want)
	mine := tenantWorker(ns, "mine", mc)
	createAs(t, alice, mine)
	patchRefused(t, alice, mine, mergePatch(`{"metadata":{"annotations":{"cluster.marina.dev/instance-key":"`+string(victim.UID)+`"}}}`), field, want)
	set := newMachineSet(ns, tenantWorker(ns, "", mc).Spec)
	set.Spec.Template.ObjectMeta.Annotations = map[string]string{clusterv1.InstanceKeyAnnotation: string(victim.UID)}
	refusedAs(t, alice, set, "spec.template."+field, want)
	// An administrator (marina move) may.
	moved := tenantWorker(ns, "moved", mc)
	moved.Annotations = map[string]string{clusterv1.InstanceKeyAnnotation: "first-uid"}
	create(t, moved)
}

// Finding 5 (dnsDomain): every label of the cluster's DNS domain is at most
// 63 characters, as DNS allows.
func TestAttackDNSDomainLabelTooLong(t *testing.T) {
	ns := env.Namespace(t)
	alice := tenant(t)
	c := tenantCluster(ns, "prod", class(t))
	c.Spec.ClusterNetwork.DNSDomain = strings.Repeat("a", 64) + ".local"
	refusedAs(t, alice, c, "spec.clusterNetwork.dnsDomain", "at most 63 characters")
}

// The skew policy from the Cluster's side: its control plane cannot move
// more than three minors ahead of a worker's kubelet (a machine's or a
// set's template's); the upgrade found that out only when it rolled them.
func TestAttackControlPlaneVersionLeavesKubeletsBehind(t *testing.T) {
	ns := env.Namespace(t)
	alice := tenant(t)
	mc := class(t)
	cl := tenantCluster(ns, "prod", mc)
	cl.Spec.ControlPlane.Version = "v1.36.3"
	createAs(t, alice, cl)
	w := tenantWorker(ns, "old", mc)
	w.Spec.Versions.Kubelet = minorsBack("v1.36.3", 3)
	createAs(t, alice, w)
	set := newMachineSet(ns, w.Spec)
	createAs(t, alice, set)
	patchRefused(t, alice, cl, mergePatch(fmt.Sprintf(`{"spec":{"controlPlane":{"version":%q}}}`, newest)), "spec.controlPlane.version",
		"would leave kubelets more than 3 minor versions older than the control plane: Machine old (kubelet v1.33.0), MachineSet pool (kubelet v1.33.0)")
}

// warnings collects the warnings the API server sends back.
type warnings struct {
	mu    sync.Mutex
	texts []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.texts = append(w.texts, text)
}

func (w *warnings) contain(s string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, t := range w.texts {
		if strings.Contains(t, s) {
			return true
		}
	}
	return false
}

// Issue 36, finding 6: a component's version names its binary in a path
// on the management host and in a shell command on an SSH host. One that
// is not a release version is refused on create and on update, in a
// Machine and in a set's template, the field named.
func TestAttackComponentVersionReachesAPathOrAShell(t *testing.T) {
	ns := env.Namespace(t)
	m := newWorker(ns, "shell")
	m.Spec.Versions.Components = &clusterv1.ComponentVersions{APIServer: "v1.37.2;touch${IFS}/tmp/owned"}
	refusedAs(t, env.Client, m, "spec.versions.components.apiServer", "must be a release version like v1.37.2")

	m = newWorker(ns, "path")
	createAs(t, env.Client, m)
	patchRefused(t, env.Client, m, mergePatch(`{"spec":{"versions":{"components":{"etcd":"v3.6.16/../../../../bin/sh"}}}}`),
		"spec.versions.components.etcd", "a leading v, then major.minor.patch")

	spec := newWorker(ns, "template").Spec
	spec.Versions.Components = &clusterv1.ComponentVersions{Scheduler: "$(id)"}
	refusedAs(t, env.Client, newMachineSet(ns, spec), "spec.template.spec.versions.components.scheduler", "must be a release version")
}

// Issue 35: a Machine written directly, not through its Cluster, is held
// to the skew policy too: its control-plane version moves one minor at a
// time and never down one, its kubelet at most one minor at a time and at
// most three minors behind its control-plane version. Each on create or
// update, the field named.
func TestAttackAControlPlaneMachinesOwnVersionsSkipMinors(t *testing.T) {
	ns := env.Namespace(t)
	cp := func(name string, kubelet clusterv1.KubernetesVersion) *clusterv1.Machine {
		m := newWorker(ns, name)
		m.Spec.Roles = []clusterv1.MachineRole{clusterv1.ControlPlaneRole}
		m.Spec.Versions = clusterv1.MachineVersions{Kubelet: kubelet, ControlPlane: newest}
		return m
	}
	m := cp("cp", newest)
	createAs(t, env.Client, m)
	patchRefused(t, env.Client, m, mergePatch(fmt.Sprintf(`{"spec":{"versions":{"controlPlane":%q}}}`, nextMinor(nextMinor(newest)))),
		"spec.versions.controlPlane", "may go up by at most one minor version at a time")
	patchRefused(t, env.Client, m, mergePatch(fmt.Sprintf(`{"spec":{"versions":{"controlPlane":%q,"kubelet":%q}}}`, minorsBack(newest, 1), minorsBack(newest, 1))),
		"spec.versions.controlPlane", "never down a minor version")

	behind := cp("behind", minorsBack(newest, 2))
	createAs(t, env.Client, behind)
	patchRefused(t, env.Client, behind, mergePatch(fmt.Sprintf(`{"spec":{"versions":{"kubelet":%q}}}`, newest)),
		"spec.versions.kubelet", "a control-plane machine's kubelet may move by at most one minor version at a time")

	refusedAs(t, env.Client, cp("far-behind", minorsBack(newest, 4)), "spec.versions.kubelet", "at most three minor versions older than versions.controlPlane")
}

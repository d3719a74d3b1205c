package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/internal/testenv/localenv"
	"marina.dev/marina/provider"
	"marina.dev/marina/provider/local"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

// startController runs the Cluster controller alone (no provider acts on
// machines) against namespace ns until the test ends.
func startController(t *testing.T, ns string, providers ...provider.Provider) {
	t.Helper()
	reg, err := provider.NewRegistry(providers...)
	if err != nil {
		t.Fatal(err)
	}
	localenv.StartManager(t, env.Config, ns, func(_ context.Context, mgr ctrl.Manager) error {
		_, err := SetupWithManager(mgr, Options{Providers: reg})
		return err
	})
}

func newCluster(ns, name string) *clusterv1.Cluster {
	return &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: clusterv1.ClusterSpec{
			ControlPlane: clusterv1.ControlPlaneSpec{
				Version:      "v1.37.2",
				Replicas:     1,
				ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"2Gi"}}`)},
			},
		},
	}
}

// selfSigned makes a certificate from tmpl and a new key, as PEM.
func selfSigned(t *testing.T, tmpl *x509.Certificate) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(1)
	tmpl.Subject = pkix.Name{CommonName: "users-ca"}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

func caTemplate(notBefore, notAfter time.Time, isCA bool) *x509.Certificate {
	return &x509.Certificate{
		NotBefore: notBefore, NotAfter: notAfter, IsCA: isCA, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
}

func secretNames(t *testing.T, ns string) []string {
	t.Helper()
	var list corev1.SecretList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range list.Items {
		names = append(names, s.Name)
	}
	return names
}

// Each kind of unusable CA material gets CertificatesAvailable=False naming
// the problem, the cluster Failed, and nothing is made for it (M15).
func TestAUnusableCAStopsTheClusterWithItsReason(t *testing.T) {
	now := time.Now()
	good, _ := selfSigned(t, caTemplate(now.Add(-time.Hour), now.Add(24*time.Hour), true))
	_, otherKey := selfSigned(t, caTemplate(now.Add(-time.Hour), now.Add(24*time.Hour), true))
	expired, expiredKey := selfSigned(t, caTemplate(now.Add(-48*time.Hour), now.Add(-24*time.Hour), true))
	leaf, leafKey := selfSigned(t, caTemplate(now.Add(-time.Hour), now.Add(24*time.Hour), false))

	ns := env.Namespace(t)
	startController(t, ns)
	cases := []struct {
		name      string
		cert, key []byte // nil cert: no Secret at all
		want      string
	}{
		{"missing", nil, nil, "does not exist"},
		{"key-mismatch", good, otherKey, "does not match the certificate"},
		{"expired", expired, expiredKey, "expired on"},
		{"not-a-ca", leaf, leafKey, "is not a CA certificate"},
	}
	for _, tc := range cases {
		c := newCluster(ns, tc.name)
		c.Spec.ControlPlane.CASecretRef = &clusterv1.SecretReference{Name: tc.name + "-users-ca"}
		if tc.cert != nil {
			create(t, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: tc.name + "-users-ca", Namespace: ns},
				Type:       corev1.SecretTypeTLS,
				Data:       map[string][]byte{corev1.TLSCertKey: tc.cert, corev1.TLSPrivateKeyKey: tc.key},
			})
		}
		create(t, c)
	}
	for _, tc := range cases {
		testenv.Eventually(t, 30*time.Second, tc.name+": CertificatesAvailable=False says why", func() error {
			c := get(t, ns, tc.name)
			cond := meta.FindStatusCondition(c.Status.Conditions, clusterv1.ClusterCertificatesAvailableCondition)
			if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != clusterv1.ClusterCASecretInvalidReason {
				return fmt.Errorf("condition %+v", cond)
			}
			if !strings.Contains(cond.Message, tc.want) {
				return fmt.Errorf("message %q does not say %q", cond.Message, tc.want)
			}
			if strings.Contains(cond.Message, "PRIVATE KEY") {
				t.Fatalf("the condition quotes key material: %q", cond.Message)
			}
			if c.Status.Phase != clusterv1.ClusterPhaseFailed {
				return fmt.Errorf("phase %q, want Failed", c.Status.Phase)
			}
			return nil
		})
	}
	for _, name := range secretNames(t, ns) {
		if !strings.HasSuffix(name, "-users-ca") {
			t.Errorf("Secret %s was made for a cluster whose CA is unusable", name)
		}
	}
}

// A paused cluster gets its Paused condition and nothing else; a cluster
// whose control plane someone else runs is left alone entirely.
func TestPausedAndExternalClustersAreLeftAlone(t *testing.T) {
	ns := env.Namespace(t)
	startController(t, ns)
	paused := newCluster(ns, "paused")
	paused.Spec.Paused = true
	external := newCluster(ns, "external")
	external.Annotations = map[string]string{clusterv1.ExternalControlPlaneAnnotation: "true"}
	create(t, external) // first: one worker takes the queue in order
	create(t, paused)
	testenv.Eventually(t, 30*time.Second, "the paused cluster is Paused", func() error {
		if !meta.IsStatusConditionTrue(get(t, ns, "paused").Status.Conditions, clusterv1.PausedCondition) {
			return fmt.Errorf("no Paused=True condition")
		}
		return nil
	})
	// Both were reconciled by now (one queue, the paused one done): the
	// external one has neither a finalizer nor a status.
	if c := get(t, ns, "external"); len(c.Finalizers) > 0 || len(c.Status.Conditions) > 0 {
		t.Errorf("the external cluster was acted on: finalizers %v, conditions %v", c.Finalizers, c.Status.Conditions)
	}
	if names := secretNames(t, ns); len(names) > 0 {
		t.Errorf("Secrets were made for paused or external clusters: %v", names)
	}
}

// Clusters an older marina made carry the finalizer's legacy name: a
// running one gets the current name, and one deleted while no controller
// ran goes all the same.
func TestLegacyFinalizerIsReplacedAndHonoured(t *testing.T) {
	ns := env.Namespace(t)
	ctx := context.Background()
	running, deleted := newCluster(ns, "running"), newCluster(ns, "deleted")
	for _, c := range []*clusterv1.Cluster{running, deleted} {
		c.Finalizers = []string{clusterv1.LegacyClusterFinalizer}
		create(t, c)
	}
	if err := env.Client.Delete(ctx, deleted); err != nil {
		t.Fatal(err)
	}
	startController(t, ns)
	testenv.Eventually(t, 30*time.Second, "the running cluster's finalizer renamed", func() error {
		if f := get(t, ns, "running").Finalizers; !slices.Equal(f, []string{clusterv1.ClusterFinalizer}) {
			return fmt.Errorf("finalizers %v", f)
		}
		return nil
	})
	testenv.Eventually(t, 30*time.Second, "the deleted cluster gone", func() error {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(deleted), &clusterv1.Cluster{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
}

func create(t *testing.T, o client.Object) {
	t.Helper()
	if err := env.Client.Create(context.Background(), o); err != nil {
		t.Fatalf("creating %s: %v", o.GetName(), err)
	}
}

func get(t *testing.T, ns, name string) *clusterv1.Cluster {
	t.Helper()
	c := &clusterv1.Cluster{}
	if err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, c); err != nil {
		t.Fatal(err)
	}
	return c
}

// Issue 22 (finding 7): once the control plane is initialised, a deleted
// CA or service-account Secret is reported, with an event, and never made
// anew: a new CA is one no running API server presents, a new
// service-account key voids every token. Restoring the Secret heals it.
func TestLostKeyMaterialIsReportedAndNeverRemade(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	startController(t, ns)
	create(t, newCluster(ns, "lost"))
	for _, purpose := range []string{clusterpki.ClusterCA, clusterpki.ServiceAccount} {
		secret := &corev1.Secret{}
		key := types.NamespacedName{Namespace: ns, Name: clusterpki.SecretName("lost", purpose)}
		testenv.Eventually(t, 30*time.Second, "the cluster's "+purpose+" Secret", func() error {
			return env.Client.Get(ctx, key, secret)
		})
	}
	// The control plane answered once: what the provider-less controller
	// here cannot see, so the test says it.
	testenv.Eventually(t, 30*time.Second, "ControlPlaneInitialized=True recorded", func() error {
		c := get(t, ns, "lost")
		if meta.IsStatusConditionTrue(c.Status.Conditions, clusterv1.ClusterControlPlaneInitializedCondition) {
			return nil
		}
		meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: clusterv1.ClusterControlPlaneInitializedCondition,
			Status: metav1.ConditionTrue, Reason: clusterv1.ClusterControlPlaneInitializedReason})
		if err := env.Client.Status().Update(ctx, c); err != nil {
			return err
		}
		return fmt.Errorf("just recorded")
	})

	for _, purpose := range []string{clusterpki.ClusterCA, clusterpki.ServiceAccount} {
		key := types.NamespacedName{Namespace: ns, Name: clusterpki.SecretName("lost", purpose)}
		saved := &corev1.Secret{}
		if err := env.Client.Get(ctx, key, saved); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Delete(ctx, saved); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, purpose+" deleted: CertificatesAvailable=False says so", func() error {
			c := get(t, ns, "lost")
			cond := meta.FindStatusCondition(c.Status.Conditions, clusterv1.ClusterCertificatesAvailableCondition)
			if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != clusterv1.ClusterCertificatesLostReason {
				return fmt.Errorf("condition %+v", cond)
			}
			if !strings.Contains(cond.Message, key.String()) || !strings.Contains(cond.Message, "Restore the Secret") {
				return fmt.Errorf("message %q does not name %s and say how to restore it", cond.Message, key)
			}
			return nil
		})
		err := env.Client.Get(ctx, key, &corev1.Secret{})
		if !apierrors.IsNotFound(err) {
			t.Fatalf("Secret %s after the controller saw it gone: %v, want it not made anew", key, err)
		}
		events := &eventsv1.EventList{}
		if err := env.Client.List(ctx, events, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(events.Items, func(e eventsv1.Event) bool {
			return e.Reason == clusterv1.ClusterCertificatesLostReason && e.Regarding.Name == "lost"
		}) {
			t.Errorf("no %s event on the cluster", clusterv1.ClusterCertificatesLostReason)
		}

		// Restored from a backup, as the message says.
		restored := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name, Labels: saved.Labels, OwnerReferences: saved.OwnerReferences},
			Type: saved.Type, Data: saved.Data}
		create(t, restored)
		testenv.Eventually(t, 30*time.Second, purpose+" restored: CertificatesAvailable=True", func() error {
			cond := meta.FindStatusCondition(get(t, ns, "lost").Status.Conditions, clusterv1.ClusterCertificatesAvailableCondition)
			if cond == nil || cond.Status != metav1.ConditionTrue {
				return fmt.Errorf("condition %+v", cond)
			}
			return nil
		})
	}
}

// Issue 22 (finding 7): a user CA that expires soon is accepted, and the
// cluster says when it expires and what to do, since marina cannot rotate a
// CA in place.
func TestACAThatExpiresSoonIsReported(t *testing.T) {
	now := time.Now()
	cert, key := selfSigned(t, caTemplate(now.Add(-time.Hour), now.Add(30*24*time.Hour), true))
	ns := env.Namespace(t)
	startController(t, ns)
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "users-ca", Namespace: ns}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: cert, corev1.TLSPrivateKeyKey: key}})
	c := newCluster(ns, "soon")
	c.Spec.ControlPlane.CASecretRef = &clusterv1.SecretReference{Name: "users-ca"}
	create(t, c)
	testenv.Eventually(t, 30*time.Second, "CertificatesAvailable=True, CAExpiringSoon", func() error {
		cond := meta.FindStatusCondition(get(t, ns, "soon").Status.Conditions, clusterv1.ClusterCertificatesAvailableCondition)
		if cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != clusterv1.ClusterCAExpiringSoonReason {
			return fmt.Errorf("condition %+v", cond)
		}
		if !strings.Contains(cond.Message, "expires on") || !strings.Contains(cond.Message, "cannot rotate a CA in place") {
			return fmt.Errorf("message %q does not say when and what to do", cond.Message)
		}
		return nil
	})
}

// staleMachines is a cache that has not yet seen some machines: what a
// controller's cache is for a moment after a machine is created. It is a
// fake at the one edge a test cannot time (how late a watch event comes).
type staleMachines struct {
	client.Client
	unseen map[string]bool
}

func (s staleMachines) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := s.Client.List(ctx, list, opts...); err != nil {
		return err
	}
	if ml, ok := list.(*clusterv1.MachineList); ok {
		ml.Items = slices.DeleteFunc(ml.Items, func(m clusterv1.Machine) bool { return s.unseen[m.Name] })
	}
	return nil
}

// Issue 22 (finding 8): a Cluster is not let go while one of its machines
// exists, even one its cache has not seen: the deletion lists machines
// live, as creation does, so no machine keeps its hook and sandbox after
// the Cluster is gone.
func TestDeletionSeesAMachineTheCacheMissed(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	c := newCluster(ns, "late")
	c.Finalizers = []string{clusterv1.ClusterFinalizer}
	create(t, c)
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "late-cp-x", Labels: map[string]string{clusterv1.ClusterNameLabel: "late", clusterv1.ControlPlaneLabel: ""}},
		Spec: clusterv1.MachineSpec{ClusterName: "late", Roles: []clusterv1.MachineRole{clusterv1.ControlPlaneRole},
			Versions:     clusterv1.MachineVersions{Kubelet: "v1.37.2", ControlPlane: "v1.37.2"},
			ProviderSpec: c.Spec.ControlPlane.ProviderSpec},
	}
	if err := controllerutil.SetControllerReference(c, m, env.Client.Scheme()); err != nil {
		t.Fatal(err)
	}
	create(t, m)
	if err := env.Client.Delete(ctx, c); err != nil {
		t.Fatal(err)
	}
	c = get(t, ns, "late")

	r := New(staleMachines{Client: env.Client, unseen: map[string]bool{m.Name: true}}, env.Client, nil, Options{})
	if _, err := r.reconcileDelete(ctx, c); err != nil {
		t.Fatal(err)
	}
	if !clusterFinalizer.Held(c) {
		t.Fatal("the cluster's finalizer was removed while its machine late-cp-x exists (the cache had not seen it)")
	}
	got := &clusterv1.Machine{}
	err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: m.Name}, got)
	if err == nil && got.DeletionTimestamp.IsZero() {
		t.Error("the machine the cache missed was not deleted with its cluster")
	} else if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

// A paused cluster that is deleted is left alone, its finalizer kept
// (marina move deletes the copies it handed over that way); a cluster
// deleted after it, not paused, goes: the controller looked at both.
func TestDeletedPausedClusterIsLeftAlone(t *testing.T) {
	ns := env.Namespace(t)
	ctx := context.Background()
	paused, other := newCluster(ns, "a-paused"), newCluster(ns, "b-other")
	paused.Spec.Paused = true
	for _, c := range []*clusterv1.Cluster{paused, other} {
		c.Finalizers = []string{clusterv1.ClusterFinalizer}
		create(t, c)
	}
	for _, c := range []*clusterv1.Cluster{paused, other} {
		if err := env.Client.Delete(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	startController(t, ns)
	testenv.Eventually(t, 30*time.Second, "the other cluster gone", func() error {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(other), &clusterv1.Cluster{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
	if c := get(t, ns, "a-paused"); !slices.Equal(c.Finalizers, []string{clusterv1.ClusterFinalizer}) {
		t.Errorf("the deleted paused cluster was taken apart: finalizers %v", c.Finalizers)
	}
	patch := []byte(`{"metadata":{"finalizers":null}}`)
	if err := env.Client.Patch(ctx, paused, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
}

// Issue 24: a Cluster whose own endpoint is an address of the management
// host that its operator did not open (--endpoint-addresses) is told so,
// and nothing listens there: its balancer could otherwise take a port the
// management plane needs when it restarts.
func TestAnEndpointAtAHostAddressNotOpenedIsRefused(t *testing.T) {
	ns := env.Namespace(t)
	p, err := local.New(local.Options{Root: t.TempDir(), AgentCommand: []string{"/bin/false"}, LoadBalancerCommand: []string{"/bin/false"}})
	if err != nil {
		t.Fatal(err)
	}
	startController(t, ns, p)
	c := newCluster(ns, "grabs-a-port")
	c.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: "127.0.0.1", Port: 6443}
	create(t, c)
	testenv.Eventually(t, 30*time.Second, "ControlPlaneReady=False with reason EndpointNotAllowed", func() error {
		c := get(t, ns, c.Name)
		cond := meta.FindStatusCondition(c.Status.Conditions, clusterv1.ClusterControlPlaneReadyCondition)
		if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != clusterv1.ClusterEndpointNotAllowedReason {
			return fmt.Errorf("condition %+v", cond)
		}
		if !strings.Contains(cond.Message, "127.0.0.1:6443") || !strings.Contains(cond.Message, "--endpoint-addresses") {
			return fmt.Errorf("message %q names neither the endpoint nor the flag", cond.Message)
		}
		return nil
	})
	if uids, err := p.EndpointUIDs(); err != nil || len(uids) != 0 {
		t.Errorf("endpoints made: %v, %v; want none", uids, err)
	}
	var machines clusterv1.MachineList
	if err := env.Client.List(context.Background(), &machines, client.InNamespace(ns)); err != nil || len(machines.Items) != 0 {
		t.Errorf("machines made: %d, %v; want none", len(machines.Items), err)
	}
}

package capabilities_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"marina.dev/marina/internal/capabilities"
	"marina.dev/marina/internal/install"
	"marina.dev/marina/internal/scheme"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider"
	"marina.dev/marina/provider/local"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.MainWorkload(m, &env) }

// The namespace is the one marina init makes.
func TestNamespaceIsMarinas(t *testing.T) {
	if capabilities.Namespace != install.Namespace {
		t.Errorf("capabilities are published in %s, marina's namespace is %s", capabilities.Namespace, install.Namespace)
	}
}

// The controller, with no more rights than config/rbac gives it, publishes
// the releases of its bin dir at start and again when one is built; the
// ConfigMap comes back when deleted; an unchanged one is not rewritten;
// any authenticated user reads it, and no other ConfigMap of marina's
// namespace.
func TestPublisherKeepsWhatTheControllerCanRunCurrent(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	applyRBAC(t, ctx)
	controller := impersonate(t, "system:serviceaccount:marina-system:marina-controller", "system:serviceaccounts", "system:serviceaccounts:marina-system")
	alice := impersonate(t, "alice")

	binDir := t.TempDir()
	build(t, binDir, "v1.36.3")
	prov, err := local.New(local.Options{Root: t.TempDir(), AgentCommand: []string{"/bin/false"}, BinDir: binDir})
	if err != nil {
		t.Fatal(err)
	}
	registry, err := provider.NewRegistry(prov)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := capabilities.Read(ctx, alice); !errors.Is(err, capabilities.ErrNotPublished) {
		t.Fatalf("before any controller ran: got %v, want ErrNotPublished", err)
	}

	done := make(chan error, 1)
	go func() {
		done <- capabilities.NewPublisher(controller, registry, 100*time.Millisecond, testr.New(t)).Start(ctx)
	}()
	defer func() { cancel(); <-done }()

	localKind := provider.FormatKind(local.GroupVersion.WithKind(local.Kind))
	published := func(want ...string) func() error {
		return func() error {
			caps, err := capabilities.Read(ctx, alice)
			if err != nil {
				return err
			}
			p, ok := caps.For(local.GroupVersion.WithKind(local.Kind))
			if !ok || p.Name != local.Name || p.AnyKubernetesVersion || !slices.Equal(p.KubernetesVersions, want) {
				return fmt.Errorf("published %+v, want provider local owning %s with versions %v", caps.Providers, localKind, want)
			}
			return nil
		}
	}
	testenv.Eventually(t, 10*time.Second, "the versions published at start", published("v1.36.3"))
	build(t, binDir, "v1.37.2")
	testenv.Eventually(t, 10*time.Second, "a release built later published", published("v1.36.3", "v1.37.2"))

	key := types.NamespacedName{Namespace: capabilities.Namespace, Name: capabilities.Name}
	cm := &corev1.ConfigMap{}
	if err := env.Client.Get(ctx, key, cm); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // five intervals: nothing may change
	again := &corev1.ConfigMap{}
	if err := env.Client.Get(ctx, key, again); err != nil {
		t.Fatal(err)
	}
	if again.ResourceVersion != cm.ResourceVersion {
		t.Errorf("an unchanged ConfigMap was rewritten: resourceVersion %s, then %s", cm.ResourceVersion, again.ResourceVersion)
	}

	if err := env.Client.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the deleted ConfigMap published again", published("v1.36.3", "v1.37.2"))

	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: capabilities.Namespace, Name: "not-for-users"}}
	if err := env.Client.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := alice.Get(ctx, client.ObjectKeyFromObject(other), &corev1.ConfigMap{}); !apierrors.IsForbidden(err) {
		t.Errorf("a user reading another ConfigMap of %s: got %v, want Forbidden", capabilities.Namespace, err)
	}
}

// A provider that restricts nothing is published as running any version.
func TestOfAProviderWithoutABinDir(t *testing.T) {
	prov, err := local.New(local.Options{Root: t.TempDir(), AgentCommand: []string{"/bin/false"}})
	if err != nil {
		t.Fatal(err)
	}
	registry, err := provider.NewRegistry(prov)
	if err != nil {
		t.Fatal(err)
	}
	caps, err := capabilities.Of(registry)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := caps.For(local.GroupVersion.WithKind(local.Kind))
	if !ok || !p.AnyKubernetesVersion || !p.CanRun("v1.99.0") {
		t.Errorf("got %+v, want local running any version", caps.Providers)
	}
}

// applyRBAC applies marina's namespace and RBAC, as marina init does.
func applyRBAC(t *testing.T, ctx context.Context) {
	t.Helper()
	objs, err := install.Objects(install.Options{WebhookURL: "https://127.0.0.1:9443"})
	if err != nil {
		t.Fatal(err)
	}
	var rbac []*unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding":
			rbac = append(rbac, o)
		}
	}
	if _, err := install.Apply(ctx, env.Client, rbac); err != nil {
		t.Fatal(err)
	}
}

// impersonate is a client acting as user, an authenticated one.
func impersonate(t *testing.T, user string, groups ...string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:authenticated")}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// build puts a release's kube-apiserver in binDir, as make setup does.
func build(t *testing.T, binDir, version string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(binDir, "kube-apiserver-"+version), nil, 0o755); err != nil {
		t.Fatal(err)
	}
}

package manager_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/capabilities"
	"marina.dev/marina/internal/manager"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider"
	"marina.dev/marina/provider/local"
)

// Issue 24, finding 6: the manager's cache holds the Secrets marina labels
// and no other. 1,000 unlabelled Secrets of a tenant's namespace never
// enter it, while a labelled one (a cluster's kubeconfig) does.
func TestManagerCachesOnlyTheSecretsItLabels(t *testing.T) {
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, ns := range []string{capabilities.Namespace, "tenant", "clusters"} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	const unlabelled = 1000
	for i := range unlabelled {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: fmt.Sprintf("secret-%04d", i)},
			StringData: map[string]string{"password": "hunter2"}}
		if err := env.Client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	labelled := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "clusters", Name: "c1-kubeconfig",
		Labels: map[string]string{clusterv1.ClusterNameLabel: "c1"}}}
	if err := env.Client.Create(ctx, labelled); err != nil {
		t.Fatal(err)
	}

	prov, err := local.New(local.Options{Root: t.TempDir(), AgentCommand: []string{"/bin/false"}, BinDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := manager.New(ctx, env.Config, manager.Options{MetricsAddr: "0", HealthAddr: "0", Providers: []provider.Provider{prov}, Restartable: true})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("the manager's cache did not sync")
	}

	// The controllers watch Secrets (kubeconfigs), so the informer runs
	// from the start: once it holds the labelled Secret it has listed.
	list := &corev1.SecretList{}
	testenv.Eventually(t, 30*time.Second, "the labelled Secret in the cache", func() error {
		if err := mgr.GetCache().List(ctx, list); err != nil {
			return err
		}
		for _, s := range list.Items {
			if s.Name == labelled.Name {
				return nil
			}
		}
		return fmt.Errorf("%d Secrets cached, none of them %s", len(list.Items), labelled.Name)
	})
	inTenant := 0
	for _, s := range list.Items {
		if s.Namespace == "tenant" {
			inTenant++
		}
		if _, ok := s.Labels[clusterv1.ClusterNameLabel]; !ok {
			t.Errorf("Secret %s/%s is cached without the label %s", s.Namespace, s.Name, clusterv1.ClusterNameLabel)
		}
	}
	if inTenant != 0 {
		t.Errorf("%d of the tenant's %d unlabelled Secrets are in the cache, want none", inTenant, unlabelled)
	}
	err = mgr.GetCache().Get(ctx, client.ObjectKey{Namespace: "tenant", Name: "secret-0000"}, &corev1.Secret{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("reading a tenant's Secret from the cache: err = %v, want NotFound", err)
	}
}

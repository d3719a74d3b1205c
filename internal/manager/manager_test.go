package manager_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"marina.dev/marina/internal/capabilities"
	"marina.dev/marina/internal/manager"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider"
	"marina.dev/marina/provider/local"
)

// The manager marina up and marina controller run publishes what its
// providers can run, from the start.
func TestManagerPublishesWhatItCanRun(t *testing.T) {
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
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: capabilities.Namespace}}); err != nil {
		t.Fatal(err)
	}
	binDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(binDir, "kube-apiserver-v1.36.3"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	prov, err := local.New(local.Options{Root: t.TempDir(), AgentCommand: []string{"/bin/false"}, BinDir: binDir})
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := manager.New(ctx, env.Config, manager.Options{MetricsAddr: "0", HealthAddr: "0", Providers: []provider.Provider{prov}})
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
	testenv.Eventually(t, 30*time.Second, "the manager's capabilities published", func() error {
		caps, err := capabilities.Read(ctx, env.Client)
		if err != nil {
			return err
		}
		p, ok := caps.For(local.GroupVersion.WithKind(local.Kind))
		if !ok || !slices.Equal(p.KubernetesVersions, []string{"v1.36.3"}) {
			return fmt.Errorf("published %+v", caps.Providers)
		}
		return nil
	})
}

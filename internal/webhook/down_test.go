package webhook_test

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider/local"
)

// With marina's webhook down, writes of marina's kinds fail closed: the
// error says the webhook could not be called, and nothing is stored.
func TestWebhookDownRefusesWritesAndStoresNothing(t *testing.T) {
	prov, err := local.New(local.Options{Root: t.TempDir(), AgentCommand: []string{"/bin/false"}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := testenv.StartWithWebhook(prov)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := e.Stop(); err != nil {
			t.Error(err)
		}
	}()
	ns := e.Namespace(t)
	ctx := context.Background()
	if err := e.Client.Create(ctx, newCluster(ns)); err != nil {
		t.Fatalf("with the webhook up: %v", err)
	}

	e.StopWebhook()
	m := newWorker(ns, "while-down")
	err = e.Client.Create(ctx, m)
	if err == nil {
		t.Fatal("a machine was accepted while the webhook was down")
	}
	if !strings.Contains(err.Error(), `failed calling webhook "machines.cluster.marina.dev"`) {
		t.Errorf("the error does not say marina's webhook could not be called: %v", err)
	}
	if err := e.Client.Get(ctx, client.ObjectKeyFromObject(m), m); !apierrors.IsNotFound(err) {
		t.Errorf("the machine was stored anyway (get: %v)", err)
	}
}

package bootstraptoken

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"marina.dev/marina/internal/testenv"
)

// A machine's token is made once and handed out again on a retry; one
// about to expire is replaced; Delete removes it, and again is no error.
func TestEnsureHandsOutOneLiveTokenPerMachine(t *testing.T) {
	env, err := testenv.StartWorkload()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	cs := kubernetes.NewForConfigOrDie(env.Config)
	ctx := context.Background()
	uid := types.UID("7d3c1f6e-0000-4000-8000-000000000001")
	now := time.Now()

	first, err := Ensure(ctx, cs, uid, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	if !Is(first) {
		t.Fatalf("token %q is not a bootstrap token", first)
	}
	again, err := Ensure(ctx, cs, uid, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	if again != first {
		t.Errorf("a retry got token %q, want the live one %q", again, first)
	}
	other, err := Ensure(ctx, cs, "7d3c1f6e-0000-4000-8000-000000000002", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	if other == first {
		t.Error("two machines got the same token")
	}

	// 59 minutes on, the first token has less than a minute left.
	renewed, err := Ensure(ctx, cs, uid, time.Hour, now.Add(59*time.Minute+30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if renewed == first {
		t.Error("a token with 30 s left was handed out again, want a new one")
	}
	s, err := cs.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, namePrefix+idFor(uid), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := idFor(uid) + "." + string(s.Data[keySecret]); got != renewed {
		t.Errorf("the Secret holds token %q, want the renewed %q", got, renewed)
	}

	// A live token of another machine whose id collides is never handed
	// out (the id is six characters of a hash of the UID).
	s.Data[keyDescription] = []byte(description("another-machine"))
	if _, err := cs.CoreV1().Secrets(metav1.NamespaceSystem).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := Ensure(ctx, cs, uid, time.Hour, now.Add(59*time.Minute+30*time.Second)); err == nil {
		t.Errorf("a live token of another machine was handed out: %q", got)
	}

	for range 2 {
		if err := Delete(ctx, cs, uid); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, namePrefix+idFor(uid), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after Delete, reading the token Secret: %v, want NotFound", err)
	}
}

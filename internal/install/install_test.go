package install

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"marina.dev/marina/internal/testenv"
)

// A real API server without marina's CRDs: what marina init meets.
var env *testenv.Env

func TestMain(m *testing.M) { testenv.MainWorkload(m, &env) }

func TestOptionsAreChecked(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"no image", Options{Replicas: 1}, "--image is empty"},
		{"no replica", Options{Image: "marina:dev"}, "at least 1 replica"},
		{"plain http webhook", Options{WebhookURL: "http://127.0.0.1:9443"}, "not an https:// URL"},
		{"webhook without host", Options{WebhookURL: "https://"}, "not an https:// URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Objects(tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Objects(%+v) = %v, want an error with %q", tc.o, err, tc.want)
			}
		})
	}
}

func TestObjectsInClusterRunTheControllerBehindItsService(t *testing.T) {
	objs, err := Objects(Options{Image: "registry.example/marina:v1", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if first := objs[0]; first.GetKind() != "Namespace" || first.GetName() != Namespace {
		t.Errorf("first object is %s %s, want Namespace %s: everything else lives in it", first.GetKind(), first.GetName(), Namespace)
	}
	if last := objs[len(objs)-1]; last.GetKind() != "Deployment" {
		t.Errorf("last object is %s, want the controller Deployment: it needs every other", last.GetKind())
	}
	d := find(t, objs, "Deployment", "marina-controller")
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	if image := containers[0].(map[string]any)["image"]; image != "registry.example/marina:v1" {
		t.Errorf("controller image %v, want --image's", image)
	}
	if replicas, _, _ := unstructured.NestedInt64(d.Object, "spec", "replicas"); replicas != 3 {
		t.Errorf("replicas %d, want 3", replicas)
	}
	find(t, objs, "Service", "marina-webhook")
	for _, hook := range webhooks(t, objs) {
		svc, _, _ := unstructured.NestedMap(hook, "clientConfig", "service")
		if svc["namespace"] != Namespace || svc["name"] != "marina-webhook" || !strings.HasPrefix(svc["path"].(string), "/validate-") {
			t.Errorf("webhook %v is sent to %v, want Service %s/marina-webhook", hook["name"], svc, Namespace)
		}
	}
}

func TestObjectsWithAWebhookURLInstallNoController(t *testing.T) {
	objs, err := Objects(Options{WebhookURL: "https://10.0.0.5:9443"})
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range objs {
		if k := obj.GetKind(); k == "Deployment" || k == "Service" {
			t.Errorf("%s %s installed for a controller outside the cluster", k, obj.GetName())
		}
	}
	for _, hook := range webhooks(t, objs) {
		u, _, _ := unstructured.NestedString(hook, "clientConfig", "url")
		if !strings.HasPrefix(u, "https://10.0.0.5:9443/validate-") {
			t.Errorf("webhook %v is sent to %q, want the URL", hook["name"], u)
		}
	}
	if n := len(Checks(Options{WebhookURL: "https://10.0.0.5:9443"}, objs, nil)); n != 4 {
		t.Errorf("%d post-conditions, want 4 (no Deployment to wait for)", n)
	}
}

// Applying twice: everything is created, then nothing changes, as
// `marina init` run again must show.
func TestApplyTwiceChangesNothing(t *testing.T) {
	objs, err := Objects(Options{Image: "marina:dev", Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	results, err := Apply(ctx, env.Client, objs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Action != "created" {
			t.Errorf("first apply: %s", r)
		}
	}
	results, err = Apply(ctx, env.Client, objs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Action != "unchanged" {
			t.Errorf("second apply: %s", r)
		}
	}
	if len(results) != len(objs) {
		t.Errorf("%d results for %d objects", len(results), len(objs))
	}
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, obj := range objs {
		if obj.GetKind() == kind && obj.GetName() == name {
			return obj
		}
	}
	t.Fatalf("no %s %s among the objects", kind, name)
	return nil
}

func webhooks(t *testing.T, objs []*unstructured.Unstructured) []map[string]any {
	t.Helper()
	list, _, _ := unstructured.NestedSlice(find(t, objs, "ValidatingWebhookConfiguration", "marina-validation").Object, "webhooks")
	if len(list) == 0 {
		t.Fatal("the webhook configuration has no webhooks")
	}
	out := make([]map[string]any, 0, len(list))
	for _, w := range list {
		out = append(out, w.(map[string]any))
	}
	return out
}

// Installed, with no controller running: each post-condition that needs
// the controller says what is missing, and a lapsed leader is not taken
// for a live one.
func TestPostConditionsSayWhatIsMissing(t *testing.T) {
	o := Options{Image: "marina:dev", Replicas: 2}
	objs, err := Objects(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := Apply(ctx, env.Client, objs); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	want := map[string]string{
		"CRDs established (6)":            "",
		"tenancy policy bound (M6)":       "",
		"controller Deployment available": "0 of 2 replicas updated, 0 available",
		"controller leader elected":       "no controller has taken Lease marina-system/marina-controller-manager",
		"admission webhook answering":     "the webhook did not answer",
	}
	checks := Checks(o, objs, func() time.Time { return now })
	if len(checks) != len(want) {
		t.Fatalf("%d checks, want %d", len(checks), len(want))
	}
	for _, ch := range checks {
		err := ch.Run(ctx, env.Client)
		switch w, ok := want[ch.Name]; {
		case !ok:
			t.Errorf("unexpected check %q", ch.Name)
		case w == "" && err != nil:
			t.Errorf("%s: %v, want it to hold", ch.Name, err)
		case w != "" && (err == nil || !strings.Contains(err.Error(), w)):
			t.Errorf("%s: %v, want %q", ch.Name, err, w)
		}
	}

	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "marina-controller-manager"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("gone"), LeaseDurationSeconds: ptr.To[int32](15),
			RenewTime: &metav1.MicroTime{Time: now.Add(-time.Minute)}},
	}
	if err := env.Client.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if err := leaderElected(ctx, env.Client, now); err == nil || !strings.Contains(err.Error(), "has lapsed") {
		t.Errorf("a Lease last renewed a minute ago: %v, want it lapsed", err)
	}
	if err := leaderElected(ctx, env.Client, now.Add(-55*time.Second)); err != nil {
		t.Errorf("a Lease renewed 5 s ago: %v, want it to hold", err)
	}
}

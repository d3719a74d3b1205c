// Package install puts marina into an existing Kubernetes cluster (marina
// init, M18): it applies the manifests under config/ with server-side
// apply, so that running it again changes nothing and a newer marina
// upgrades what an older one installed, then checks the post-conditions
// that say marina works there (checks.go).
package install

import (
	"context"
	"fmt"
	"io/fs"
	"net/url"
	"path"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"marina.dev/marina/config"
)

// FieldOwner is the field manager of everything marina init applies.
const FieldOwner = "marina-init"

// Namespace is marina's own namespace: the controller, its leader election
// Lease and its webhook certificate live there.
const Namespace = "marina-system"

// PartOfLabel marks everything marina init applies, so that
// `kubectl get -l app.kubernetes.io/part-of=marina` finds it. It also gives
// the Namespace a field marina init owns: an object applied with none has
// no managed fields, and the next apply would change it to record them.
const PartOfLabel = "app.kubernetes.io/part-of"

// Options say how marina's controller runs in the cluster.
type Options struct {
	// Image and Replicas of the controller Deployment.
	Image    string
	Replicas int32
	// WebhookURL, when set, says the controller runs outside the cluster
	// (marina controller --kubeconfig on a host the API server reaches):
	// no Deployment or Service is installed and the admission webhook is
	// called at this URL.
	WebhookURL string
}

// Validate refuses options that cannot make a working installation.
func (o Options) Validate() error {
	if o.WebhookURL != "" {
		u, err := url.Parse(o.WebhookURL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("--webhook-url %q is not an https:// URL with a host: the API server calls the webhook over TLS", o.WebhookURL)
		}
		return nil
	}
	if o.Image == "" {
		return fmt.Errorf("--image is empty: name the controller image, or pass --webhook-url to run the controller outside the cluster")
	}
	if o.Replicas < 1 {
		return fmt.Errorf("--replicas %d: at least 1 replica must run the controller", o.Replicas)
	}
	return nil
}

// InCluster says whether the controller runs as a Deployment in the cluster.
func (o Options) InCluster() bool { return o.WebhookURL == "" }

// Objects are what marina init applies, in order: the namespace, the CRDs,
// RBAC, the webhook's Service and configuration, the tenancy policy, and
// last the controller, which needs all of them.
func Objects(o Options) ([]*unstructured.Unstructured, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var all []*unstructured.Unstructured
	crds, err := decodeDir(config.CRDs, config.CRDDir)
	if err != nil {
		return nil, err
	}
	all = append(all, crds...)
	for _, dir := range []string{"rbac", "webhook", "tenancy", "manager"} {
		objs, err := decodeDir(config.Install, dir)
		if err != nil {
			return nil, err
		}
		all = append(all, objs...)
	}
	webhook, err := decode("webhook/manifests.yaml", config.Webhook)
	if err != nil {
		return nil, err
	}
	for _, w := range webhook {
		if err := pointWebhooks(w, o.WebhookURL); err != nil {
			return nil, err
		}
	}
	all = append(all, webhook...)

	var out []*unstructured.Unstructured
	for _, obj := range all {
		switch obj.GetKind() {
		case "Deployment":
			if !o.InCluster() {
				continue
			}
			if err := setController(obj, o); err != nil {
				return nil, err
			}
		case "Service", "PodDisruptionBudget":
			// They exist for the Deployment's pods.
			if !o.InCluster() {
				continue
			}
		}
		labels := obj.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels[PartOfLabel] = "marina"
		obj.SetLabels(labels)
		out = append(out, obj)
	}
	slices.SortStableFunc(out, func(a, b *unstructured.Unstructured) int { return rank(a) - rank(b) })
	return out, nil
}

// rank orders kinds so that each object finds what it refers to.
func rank(obj *unstructured.Unstructured) int {
	switch obj.GetKind() {
	case "Namespace":
		return 0
	case "CustomResourceDefinition":
		return 1
	case "Deployment":
		return 4
	case "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
		return 3
	}
	return 2
}

// decodeDir reads every manifest in dir, except kustomize's own files.
func decodeDir(fsys fs.FS, dir string) ([]*unstructured.Unstructured, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("reading embedded %s: %w", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, e := range entries {
		if e.IsDir() || path.Ext(e.Name()) != ".yaml" || e.Name() == "kustomization.yaml" {
			continue
		}
		p := path.Join(dir, e.Name())
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			return nil, fmt.Errorf("reading embedded %s: %w", p, err)
		}
		objs, err := decode(p, data)
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	return out, nil
}

// decode splits a multi-document YAML file into objects.
func decode(name string, data []byte) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for i, doc := range strings.Split(string(data), "\n---") {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			return nil, fmt.Errorf("decoding document %d of embedded %s: %w", i+1, name, err)
		}
		if len(obj.Object) == 0 {
			continue // only comments
		}
		if obj.GetKind() == "" || obj.GetName() == "" {
			return nil, fmt.Errorf("document %d of embedded %s has no kind or name", i+1, name)
		}
		out = append(out, obj)
	}
	return out, nil
}

// pointWebhooks sends every webhook of the generated configuration to the
// Service in front of the controller, or to url when it runs outside the
// cluster. The caBundle is left to the controller (internal/webhook), which
// owns its CA.
func pointWebhooks(cfg *unstructured.Unstructured, base string) error {
	webhooks, _, err := unstructured.NestedSlice(cfg.Object, "webhooks")
	if err != nil {
		return fmt.Errorf("webhook configuration %s: %w", cfg.GetName(), err)
	}
	for i, w := range webhooks {
		hook, _ := w.(map[string]any)
		p, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
		if p == "" {
			return fmt.Errorf("webhook %d of configuration %s has no service path", i, cfg.GetName())
		}
		clientConfig := map[string]any{"service": map[string]any{"namespace": Namespace, "name": "marina-webhook", "path": p}}
		if base != "" {
			u, err := url.JoinPath(base, p)
			if err != nil {
				return fmt.Errorf("webhook URL from %q: %w", base, err)
			}
			clientConfig = map[string]any{"url": u}
		}
		hook["clientConfig"] = clientConfig
	}
	return unstructured.SetNestedSlice(cfg.Object, webhooks, "webhooks")
}

// setController sets the Deployment's image and replicas.
func setController(d *unstructured.Unstructured, o Options) error {
	containers, _, err := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	if err != nil || len(containers) == 0 {
		return fmt.Errorf("the embedded Deployment %s has no container (%v)", d.GetName(), err)
	}
	containers[0].(map[string]any)["image"] = o.Image
	if err := unstructured.SetNestedSlice(d.Object, containers, "spec", "template", "spec", "containers"); err != nil {
		return err
	}
	return unstructured.SetNestedField(d.Object, int64(o.Replicas), "spec", "replicas")
}

// Result says what applying one object did.
type Result struct {
	Kind, Namespace, Name string
	// Action is created, configured or unchanged.
	Action string
}

func (r Result) String() string {
	name := r.Name
	if r.Namespace != "" {
		name = r.Namespace + "/" + r.Name
	}
	return fmt.Sprintf("%s %s/%s", r.Action, r.Kind, name)
}

// Apply server-side applies each object in turn, taking over fields an
// earlier kubectl apply or marina version set, and says what each did.
func Apply(ctx context.Context, c client.Client, objs []*unstructured.Unstructured) ([]Result, error) {
	results := make([]Result, 0, len(objs))
	for _, obj := range objs {
		r := Result{Kind: obj.GetKind(), Namespace: obj.GetNamespace(), Name: obj.GetName()}
		before := &unstructured.Unstructured{}
		before.SetGroupVersionKind(obj.GroupVersionKind())
		err := c.Get(ctx, client.ObjectKeyFromObject(obj), before)
		if err != nil && !apierrors.IsNotFound(err) {
			return results, fmt.Errorf("reading %s: %w", r.Kind+" "+r.Name, err)
		}
		existed := err == nil
		applied := obj.DeepCopy()
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(applied), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
			return results, fmt.Errorf("applying %s %s: %w", r.Kind, r.Name, err)
		}
		switch {
		case !existed:
			r.Action = "created"
		case applied.GetResourceVersion() != before.GetResourceVersion():
			r.Action = "configured"
		default:
			r.Action = "unchanged"
		}
		results = append(results, r)
	}
	return results, nil
}

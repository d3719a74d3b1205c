package webhook

import (
	"context"
	"fmt"
	"net/url"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"marina.dev/marina/config"
)

// ConfigurationName is the ValidatingWebhookConfiguration marina installs.
const ConfigurationName = "marina-validation"

// Configuration is the generated webhook configuration (config/webhook) with
// every webhook sent to base (e.g. https://127.0.0.1:7444) and its serving
// certificate verified with caBundle (PEM).
func Configuration(base string, caBundle []byte) (*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := yaml.UnmarshalStrict(config.Webhook, cfg); err != nil {
		return nil, fmt.Errorf("decoding the embedded webhook configuration: %w", err)
	}
	for i := range cfg.Webhooks {
		cc := &cfg.Webhooks[i].ClientConfig
		if cc.Service == nil || cc.Service.Path == nil {
			return nil, fmt.Errorf("webhook %s has no service path in the embedded configuration", cfg.Webhooks[i].Name)
		}
		u, err := url.JoinPath(base, *cc.Service.Path)
		if err != nil {
			return nil, fmt.Errorf("webhook URL from %q: %w", base, err)
		}
		*cc = admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: caBundle}
	}
	return cfg, nil
}

// Install creates the webhook configuration, or replaces the one installed
// before (a restart on another port, a newer marina with more rules).
func Install(ctx context.Context, c client.Client, cfg *admissionregistrationv1.ValidatingWebhookConfiguration) error {
	existing := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	err := c.Get(ctx, client.ObjectKeyFromObject(cfg), existing)
	switch {
	case apierrors.IsNotFound(err):
		if err := c.Create(ctx, cfg); err != nil {
			return fmt.Errorf("creating ValidatingWebhookConfiguration %s: %w", cfg.Name, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading ValidatingWebhookConfiguration %s: %w", cfg.Name, err)
	}
	existing.Webhooks = cfg.Webhooks
	if err := c.Update(ctx, existing); err != nil {
		return fmt.Errorf("updating ValidatingWebhookConfiguration %s: %w", cfg.Name, err)
	}
	return nil
}

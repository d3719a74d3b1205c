package webhook

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"slices"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"marina.dev/marina/internal/pki"
)

// The serving certificate of `marina controller` on an existing cluster.
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,resourceNames=marina-validation,verbs=get;update

// CertOptions say where `marina controller` keeps its webhook's serving
// certificate when it runs in a cluster (config/default), rather than under
// marina up, whose plane's CA signs it.
type CertOptions struct {
	// Namespace and Service are the webhook's Service: the certificate is
	// issued for <Service>.<Namespace>.svc, the name the API server calls.
	Namespace, Service string
	// Hosts are names or IP addresses the certificate is also issued for:
	// the host of a webhook URL when the controller runs outside the
	// cluster (marina init --webhook-url).
	Hosts []string
	// SecretName is the Secret in Namespace holding the webhook's own CA and
	// serving certificate (ca.crt, ca.key, tls.crt, tls.key), shared by
	// every replica.
	SecretName string
	// Dir is where the serving certificate is written (tls.crt, tls.key,
	// mode 0600) for the webhook server to read.
	Dir string
}

// EnsureServingCert makes the webhook reachable with a certificate marina
// manages itself, so that installing marina needs no certificate manager:
// the Secret gets a CA and a serving certificate (made by the first replica,
// read by the others; the serving certificate is reissued before it
// expires), the serving pair is written to opts.Dir, and the CA is put in
// the caBundle of the webhook configuration. It is safe to call again at
// any time, from any replica.
func EnsureServingCert(ctx context.Context, c client.Client, opts CertOptions, now time.Time) error {
	ca, serving, err := servingCert(ctx, c, opts, now)
	if err != nil {
		return err
	}
	if err := serving.Write(opts.Dir, "tls"); err != nil {
		return fmt.Errorf("writing the webhook's serving certificate: %w", err)
	}
	return injectCABundle(ctx, c, ca.CertPEM())
}

// servingCert reads the Secret, creating it or renewing its serving
// certificate when needed.
func servingCert(ctx context.Context, c client.Client, opts CertOptions, now time.Time) (ca, serving *pki.KeyPair, err error) {
	key := types.NamespacedName{Namespace: opts.Namespace, Name: opts.SecretName}
	spec := opts.certSpec()
	secret := &corev1.Secret{}
	err = c.Get(ctx, key, secret)
	if apierrors.IsNotFound(err) {
		if ca, err = pki.NewCA("marina-webhook-ca"); err != nil {
			return nil, nil, err
		}
		if serving, err = ca.Issue(spec); err != nil {
			return nil, nil, err
		}
		secret = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Type: corev1.SecretTypeTLS}
		if err := fill(secret, ca, serving); err != nil {
			return nil, nil, err
		}
		err = c.Create(ctx, secret)
		if err == nil {
			return ca, serving, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, nil, fmt.Errorf("creating Secret %s: %w", key, err)
		}
		// Another replica made it first: use theirs.
		err = c.Get(ctx, key, secret)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading Secret %s: %w", key, err)
	}
	if ca, err = pki.ParsePEM(secret.Data["ca.crt"], secret.Data["ca.key"]); err != nil {
		// Never replace a CA silently: the API server trusts it.
		return nil, nil, fmt.Errorf("secret %s does not hold a usable CA (%w): delete it to have marina make a new one", key, err)
	}
	serving, err = pki.ParsePEM(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
	if err == nil && !pki.NeedsRenewal(serving.Cert, now) && serving.Cert.CheckSignatureFrom(ca.Cert) == nil &&
		slices.Equal(serving.Cert.DNSNames, spec.DNSNames) && slices.EqualFunc(serving.Cert.IPAddresses, spec.IPs, net.IP.Equal) {
		return ca, serving, nil
	}
	if serving, err = ca.Issue(spec); err != nil {
		return nil, nil, err
	}
	if err := fill(secret, ca, serving); err != nil {
		return nil, nil, err
	}
	// The update carries the resourceVersion read: of two replicas renewing
	// at once, one wins and the other retries and reads its certificate.
	if err := c.Update(ctx, secret); err != nil {
		return nil, nil, fmt.Errorf("renewing the serving certificate in Secret %s: %w", key, err)
	}
	return ca, serving, nil
}

// certSpec is the serving certificate's: the Service's names, and Hosts.
func (opts CertOptions) certSpec() pki.CertSpec {
	dnsName := opts.Service + "." + opts.Namespace + ".svc"
	spec := pki.CertSpec{CommonName: dnsName, DNSNames: []string{dnsName, dnsName + ".cluster.local"}, Usage: pki.ServerAuth}
	for _, h := range opts.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			spec.IPs = append(spec.IPs, ip)
		} else {
			spec.DNSNames = append(spec.DNSNames, h)
		}
	}
	return spec
}

func fill(secret *corev1.Secret, ca, serving *pki.KeyPair) error {
	caKey, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	servingKey, err := serving.KeyPEM()
	if err != nil {
		return err
	}
	secret.Data = map[string][]byte{
		"ca.crt":                ca.CertPEM(),
		"ca.key":                caKey,
		corev1.TLSCertKey:       serving.CertPEM(),
		corev1.TLSPrivateKeyKey: servingKey,
	}
	return nil
}

// injectCABundle makes the API server trust the webhook's CA.
func injectCABundle(ctx context.Context, c client.Client, caPEM []byte) error {
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := c.Get(ctx, types.NamespacedName{Name: ConfigurationName}, cfg); err != nil {
		return fmt.Errorf("reading ValidatingWebhookConfiguration %s: %w; install it with kubectl apply -k config/default, or run with --webhook-port=0 to serve no webhook", ConfigurationName, err)
	}
	changed := false
	for i := range cfg.Webhooks {
		if !bytes.Equal(cfg.Webhooks[i].ClientConfig.CABundle, caPEM) {
			cfg.Webhooks[i].ClientConfig.CABundle = caPEM
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if err := c.Update(ctx, cfg); err != nil {
		return fmt.Errorf("setting the caBundle of ValidatingWebhookConfiguration %s: %w", ConfigurationName, err)
	}
	return nil
}

// CertRenewer runs EnsureServingCert every period in every replica (not
// only the leader: each serves the webhook), so the serving certificate is
// renewed long before it expires; the webhook server reloads the files when
// they change.
func CertRenewer(c client.Client, opts CertOptions, period time.Duration) manager.Runnable {
	return &certRenewer{c: c, opts: opts, period: period}
}

type certRenewer struct {
	c      client.Client
	opts   CertOptions
	period time.Duration
}

// NeedLeaderElection is false: every replica serves the webhook.
func (r *certRenewer) NeedLeaderElection() bool { return false }

func (r *certRenewer) Start(ctx context.Context) error {
	ticker := time.NewTicker(r.period)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-ticker.C:
			if err := EnsureServingCert(ctx, r.c, r.opts, now); err != nil {
				log.FromContext(ctx).Error(err, "Renewing the webhook's serving certificate failed; retrying at the next period")
			}
		}
	}
}

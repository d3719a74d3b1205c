package nodeagent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"os"
	"path/filepath"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/klog/v2"

	"marina.dev/marina/internal/bootstraptoken"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/internal/pki"
)

// csrTimeout bounds one wait for kube-controller-manager to approve and
// sign the node's certificate request.
const csrTimeout = 2 * time.Minute

// tlsBootstrap returns a client that authenticates as the node with its own
// certificate: the one in the sandbox if it is still good, or a new one
// asked for with the machine's bootstrap token, as a kubelet does (a CSR
// for system:node:<name>, signer kube-apiserver-client-kubelet, approved
// and signed by the cluster's kube-controller-manager). It retries until
// ctx ends: the control plane may still be coming up.
func tlsBootstrap(ctx context.Context, dir string, b *sandbox.Bootstrap) (kubernetes.Interface, error) {
	certPath, keyPath := filepath.Join(dir, sandbox.NodeCertFile), filepath.Join(dir, sandbox.NodeKeyFile)
	if _, _, err := readNodeCredential(certPath, keyPath); err != nil {
		log := klog.FromContext(ctx)
		delay := time.Second
		for {
			var certPEM, keyPEM []byte
			certPEM, keyPEM, err = requestNodeCertificate(ctx, b, func(cfg *rest.Config) { cfg.BearerToken = b.Token })
			if err == nil {
				if err := writeNodeCredential(dir, certPEM, keyPEM); err != nil {
					return nil, err
				}
				break
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			log.Error(err, "TLS bootstrap failed, retrying", "after", delay)
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(delay):
			}
			delay = min(2*delay, 30*time.Second)
		}
		log.Info("Got the node's client certificate by TLS bootstrap")
	}
	cs, err := kubernetes.NewForConfig(nodeCertConfig(b, certPath, keyPath))
	if err != nil {
		return nil, fmt.Errorf("building the node's client: %w", err)
	}
	return cs, nil
}

// readNodeCredential returns the node's certificate and key if both exist
// and the certificate is valid for at least another hour.
func readNodeCredential(certPath, keyPath string) (certPEM, keyPEM []byte, err error) {
	if certPEM, err = os.ReadFile(certPath); err != nil {
		return nil, nil, err
	}
	if keyPEM, err = os.ReadFile(keyPath); err != nil {
		return nil, nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("the node's certificate and key do not match: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, err
	}
	if time.Until(leaf.NotAfter) < time.Hour {
		return nil, nil, errors.New("the node's certificate expires within the hour")
	}
	return certPEM, keyPEM, nil
}

// nodeCertConfig is the worker's connection authenticated by the node
// certificate in its files: client-go reads them for every new connection
// and closes the open ones when they change, so a renewed certificate is
// used without a restart.
func nodeCertConfig(b *sandbox.Bootstrap, certPath, keyPath string) *rest.Config {
	cfg := nodeRESTConfig(b)
	cfg.TLSClientConfig.CertFile, cfg.TLSClientConfig.KeyFile = certPath, keyPath
	return cfg
}

// keepNodeCertificate renews the worker's node certificate before it ends,
// as a kubelet rotates its client certificate: a new key, and a request
// for its certificate made as the node itself, with the certificate it
// holds (kube-controller-manager approves a node's request for its own
// name: marina:node-autoapprove-certificate-rotation). It renews when
// renewalDue says, this agent's jitter drawn once, and sleeps at most an
// hour, so a clock that jumps is noticed. It returns when ctx ends.
func keepNodeCertificate(ctx context.Context, dir string, b *sandbox.Bootstrap, renew func(context.Context) (certPEM, keyPEM []byte, err error)) {
	log := klog.FromContext(ctx)
	certPath := filepath.Join(dir, sandbox.NodeCertFile)
	caEnd := time.Now().Add(pki.CAValidity)
	if ca, err := readCertificatePEM([]byte(b.CAPEM)); err == nil {
		caEnd = ca.NotAfter
	}
	jitter := mathrand.Float64()
	for {
		wait := time.Hour
		cert, err := readCertificate(certPath)
		if err != nil {
			log.Error(err, "Reading the node's certificate failed; looking again in a minute")
			wait = time.Minute
		} else if due, worthIt := renewalDue(cert, caEnd, jitter); worthIt && !time.Now().Before(due) {
			certPEM, keyPEM, err := renew(ctx)
			if err == nil {
				err = writeNodeCredential(dir, certPEM, keyPEM)
			}
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				log.Error(err, "Renewing the node's certificate failed; trying again in a minute", "notAfter", cert.NotAfter)
				wait = time.Minute
			} else {
				log.Info("Renewed the node's client certificate", "notAfter", cert.NotAfter)
				wait = time.Second
			}
		} else if worthIt {
			wait = min(wait, time.Until(due))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(wait, time.Second)):
		}
	}
}

// RenewNodeCertificate renews the worker's node certificate in sandbox
// dir now, as its agent does by time: a new key, its certificate asked
// for as the node with the certificate it holds, both written to the
// sandbox.
func RenewNodeCertificate(ctx context.Context, dir string, b *sandbox.Bootstrap) error {
	certPEM, keyPEM, err := renewNodeCertificate(dir, b)(ctx)
	if err != nil {
		return err
	}
	return writeNodeCredential(dir, certPEM, keyPEM)
}

// renewNodeCertificate asks for a new node certificate as the node, with
// the one it holds.
func renewNodeCertificate(dir string, b *sandbox.Bootstrap) func(context.Context) ([]byte, []byte, error) {
	return func(ctx context.Context) ([]byte, []byte, error) {
		return requestNodeCertificate(ctx, b, func(cfg *rest.Config) {
			cfg.TLSClientConfig.CertFile, cfg.TLSClientConfig.KeyFile = filepath.Join(dir, sandbox.NodeCertFile), filepath.Join(dir, sandbox.NodeKeyFile)
		})
	}
}

// requestNodeCertificate makes a key, asks for its certificate, the
// request authenticated by auth (the bootstrap token, or the node's
// current certificate), and waits until it is signed.
func requestNodeCertificate(ctx context.Context, b *sandbox.Bootstrap, auth func(*rest.Config)) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	request, err := cert.MakeCSR(key, &pkix.Name{CommonName: "system:node:" + b.NodeName, Organization: []string{"system:nodes"}}, nil, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("making the certificate request: %w", err)
	}
	cfg := nodeRESTConfig(b)
	auth(cfg)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	name, uid, err := csr.RequestCertificateWithContext(ctx, client, request, "", certificatesv1.KubeAPIServerClientKubeletSignerName, nil,
		[]certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("asking for the node's certificate: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, csrTimeout)
	defer cancel()
	certPEM, err = csr.WaitForCertificate(wctx, client, name, uid)
	if err != nil {
		return nil, nil, fmt.Errorf("waiting for certificate request %s to be signed: %w", name, err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// nodeRESTConfig is the worker's connection to its cluster, from the
// bootstrap alone (nothing from the environment), without credentials.
func nodeRESTConfig(b *sandbox.Bootstrap) *rest.Config {
	return &rest.Config{
		Host:            b.Server,
		TLSClientConfig: rest.TLSClientConfig{CAData: []byte(b.CAPEM)},
		UserAgent:       "marina-node-agent/" + b.NodeName,
		// Protobuf costs the API server and hundreds of agents less CPU.
		ContentConfig: rest.ContentConfig{
			ContentType:        "application/vnd.kubernetes.protobuf",
			AcceptContentTypes: "application/vnd.kubernetes.protobuf,application/json",
		},
		QPS:   5,
		Burst: 10,
	}
}

// credentialMargin is how long a worker's credential must still live for a
// restart to use it: as long as the agent's own check of its certificate
// (readNodeCredential) asks for.
const credentialMargin = time.Hour

// CheckCredential says whether the worker of sandbox dir can start with the
// credential it holds (a restart after a reboot or a killed agent): nil
// when it can, else why not, in words that hold no secret. A worker joins
// with its node certificate, which must exist and live another hour (the
// bootstrap token it was made with expires within minutes). A
// control-plane machine makes its own credentials and always can.
func CheckCredential(dir string, b *sandbox.Bootstrap, now time.Time) error {
	if _, err := os.Stat(filepath.Join(dir, sandbox.ControlPlaneFile)); err == nil {
		return nil
	}
	if !bootstraptoken.Is(b.Token) {
		return errors.New("the worker was not made with a bootstrap token")
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, sandbox.NodeCertFile))
	if err != nil {
		return errors.New("the worker has no node certificate yet")
	}
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return errors.New("the worker's node certificate is not PEM")
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return fmt.Errorf("the worker's node certificate does not parse: %w", err)
	}
	if leaf.NotAfter.Before(now.Add(credentialMargin)) {
		return fmt.Errorf("the worker's node certificate expires at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

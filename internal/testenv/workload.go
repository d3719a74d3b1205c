package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"marina.dev/marina/internal/pki"
	"marina.dev/marina/tools"
)

// A workload API server stands for a cluster someone else runs, as marina
// meets one behind cluster.marina.dev/external-control-plane. Like every
// conformant cluster it authenticates bootstrap tokens, authorizes nodes
// with the Node authorizer and NodeRestriction, and runs
// kube-controller-manager's certificate controllers, which approve a
// bootstrap token's node client CSR and sign it with the cluster CA: a
// worker joins it by TLS bootstrap, with its own node identity.
var workloadAPIServerArgs = map[string]string{
	"authorization-mode":          "Node,RBAC",
	"enable-admission-plugins":    "NodeRestriction",
	"enable-bootstrap-token-auth": "true",
}

// workloadControllers are the kube-controller-manager controllers TLS
// bootstrap needs.
var workloadControllers = []string{
	"certificatesigningrequest-approving-controller",
	"certificatesigningrequest-signing-controller",
}

// clientCA is the workload API server's client authentication (an
// envtest.Authn): a CA of the test's own, since envtest's keeps its key in
// memory and kube-controller-manager must sign node certificates with it.
type clientCA struct {
	ca *pki.KeyPair
	// dir holds ca.crt and ca.key (0600); it is the suite's, removed on Stop.
	dir string
}

var _ envtest.Authn = (*clientCA)(nil)

func newClientCA() (*clientCA, error) {
	ca, err := pki.NewCA("workload-ca")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "marina-workload-ca-")
	if err != nil {
		return nil, err
	}
	if err := ca.Write(dir, "ca"); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &clientCA{ca: ca, dir: dir}, nil
}

func (c *clientCA) certFile() string { return filepath.Join(c.dir, "ca.crt") }
func (c *clientCA) keyFile() string  { return filepath.Join(c.dir, "ca.key") }

// Configure points the API server at the CA's certificate.
func (c *clientCA) Configure(_ string, args *envtest.Arguments) error {
	args.Set("client-ca-file", c.certFile())
	return nil
}

// Start has nothing to do: the files exist from newClientCA.
func (c *clientCA) Start() error { return nil }

// AddUser issues a client certificate for user.
func (c *clientCA) AddUser(user envtest.User, base *rest.Config) (*rest.Config, error) {
	kp, err := c.ca.Issue(pki.CertSpec{CommonName: user.Name, Organizations: user.Groups, Usage: pki.ClientAuth})
	if err != nil {
		return nil, fmt.Errorf("issuing a client certificate for %s: %w", user.Name, err)
	}
	key, err := kp.KeyPEM()
	if err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(base)
	cfg.CertData, cfg.KeyData = kp.CertPEM(), key
	return cfg, nil
}

// Stop removes the CA's files.
func (c *clientCA) Stop() error { return os.RemoveAll(c.dir) }

// configureWorkload makes e's API server a cluster's (see
// workloadAPIServerArgs) and returns its client CA.
func configureWorkload(e *envtest.Environment) (*clientCA, error) {
	ca, err := newClientCA()
	if err != nil {
		return nil, fmt.Errorf("making the workload cluster's CA: %w", err)
	}
	api := e.ControlPlane.GetAPIServer()
	api.SecureServing.Authn = ca
	for k, v := range workloadAPIServerArgs {
		api.Configure().Set(k, v)
	}
	return ca, nil
}

// startCertificateControllers runs kube-controller-manager with the
// certificate controllers against the workload API server, signing with
// its client CA. The returned function stops it.
func startCertificateControllers(kubeconfig []byte, ca *clientCA) (stop func(), err error) {
	binDir, err := BinDir()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(ca.dir, "admin.kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(ca.dir, "kube-controller-manager.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(binDir, "kube-controller-manager-"+tools.Pinned().NewestKube()),
		"--kubeconfig="+path,
		"--controllers="+strings.Join(workloadControllers, ","),
		"--cluster-signing-cert-file="+ca.certFile(),
		"--cluster-signing-key-file="+ca.keyFile(),
		"--leader-elect=false",
		"--secure-port=0")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting the workload cluster's kube-controller-manager: %w", err)
	}
	return func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		logFile.Close()
	}, nil
}

// ApproveBootstrapCertificates lets the workload cluster's
// kube-controller-manager approve every node client certificate a
// bootstrap token asks for, as kubeadm's clusters do. Tests of the node
// agent and the providers, which run no machine controller, use it in
// place of marina's approver (internal/nodecsr), which approves a
// machine's own Node only.
func ApproveBootstrapCertificates(ctx context.Context, cs kubernetes.Interface) error {
	b := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test:node-autoapprove-bootstrap"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:certificates.k8s.io:certificatesigningrequests:nodeclient"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:bootstrappers"}},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("letting kube-controller-manager approve bootstrap certificates: %w", err)
	}
	return nil
}

package plane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/process"
	"marina.dev/marina/internal/registry"
)

// Default loopback ports. They differ from the usual 6443/2379 so that
// marina runs beside a local Kubernetes without a clash.
const (
	DefaultAPIPort     = 7443
	DefaultEtcdPort    = 7379
	DefaultWebhookPort = 7444
)

// Options configure a management plane.
type Options struct {
	// StateDir holds everything the plane owns (see stateDir).
	StateDir string
	// BinDir holds the pinned components built by make setup.
	BinDir string
	// KubeVersion and EtcdVersion select bin/<component>-<version>.
	KubeVersion string
	EtcdVersion string
	// APIPort is kube-apiserver's port; EtcdPort is etcd's client port, and
	// EtcdPort+1 its peer port. All listen on 127.0.0.1 only.
	APIPort  int
	EtcdPort int
	// WebhookPort is where marina's admission webhook listens, on
	// 127.0.0.1; the plane checks it is free and issues its certificate.
	// Zero: no webhook.
	WebhookPort int
	// RegistryPort is where the OCI registry the real nodes pull their
	// images from listens, on 127.0.0.1; zero: no registry.
	// RegistryVersion selects bin/registry-<version>.
	RegistryPort    int
	RegistryVersion string
	// Progress receives human-readable progress lines; nil discards them.
	Progress io.Writer
}

// Plane is a running management plane.
type Plane struct {
	opts     Options
	state    stateDir
	lockFile *os.File
	spawner  *process.Spawner
	children []*process.Child // in start order
	config   *rest.Config
	failed   chan struct{} // closed when a child exits on its own
	failure  error
	stopping chan struct{} // closed when Stop begins: exits after it are expected
}

// stopGrace is how long a component gets to exit after SIGTERM before SIGKILL.
const stopGrace = 15 * time.Second

// host is where every component listens.
const host = "127.0.0.1"

// Start brings the management plane up and returns once the API server is
// ready. On error everything started so far is stopped again.
func Start(ctx context.Context, opts Options) (_ *Plane, err error) {
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	p := &Plane{opts: opts, state: stateDir(opts.StateDir), failed: make(chan struct{}), stopping: make(chan struct{})}
	if err := p.checkBinaries(); err != nil {
		return nil, err
	}
	if err := p.state.prepare(); err != nil {
		return nil, err
	}
	if p.lockFile, err = p.state.lock(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = p.Stop()
		}
	}()
	ports := []int{opts.APIPort, opts.EtcdPort, opts.EtcdPort + 1}
	if opts.WebhookPort != 0 {
		ports = append(ports, opts.WebhookPort)
	}
	if opts.RegistryPort != 0 {
		ports = append(ports, opts.RegistryPort)
	}
	if err := checkPortsFree(ports...); err != nil {
		return nil, err
	}
	certs, err := p.state.ensurePKI(time.Now())
	if err != nil {
		return nil, err
	}
	server := "https://" + net.JoinHostPort(host, strconv.Itoa(opts.APIPort))
	if err := p.state.writeKubeconfig(p.state.AdminKubeconfig(), server, certs.ca, "admin"); err != nil {
		return nil, err
	}
	if err := p.state.writeKubeconfig(p.state.kubeconfig("controller-manager"), server, certs.ca, "controller-manager"); err != nil {
		return nil, err
	}
	if p.config, err = clientcmd.BuildConfigFromFlags("", p.state.AdminKubeconfig()); err != nil {
		return nil, fmt.Errorf("loading %s: %w", p.state.AdminKubeconfig(), err)
	}

	p.spawner = process.NewSpawner()
	if err := p.startChild("etcd", p.etcdArgs()); err != nil {
		return nil, err
	}
	if err := p.startChild("kube-apiserver", p.apiserverArgs()); err != nil {
		return nil, err
	}
	if opts.RegistryPort != 0 {
		if err := p.startRegistry(); err != nil {
			return nil, err
		}
	}
	if err := p.waitReady(ctx); err != nil {
		return nil, err
	}
	if opts.RegistryPort != 0 {
		if err := registry.WaitReady(ctx, p.RegistryAddress(), time.Minute); err != nil {
			return nil, err
		}
	}
	if err := p.startChild("kube-controller-manager", p.controllerManagerArgs()); err != nil {
		return nil, err
	}
	go p.watchChildren(append([]*process.Child(nil), p.children...))
	return p, nil
}

// RegistryAddress is the registry's host:port (plain HTTP); empty when
// the plane runs none.
func (p *Plane) RegistryAddress() string {
	if p.opts.RegistryPort == 0 {
		return ""
	}
	return net.JoinHostPort(host, strconv.Itoa(p.opts.RegistryPort))
}

// startRegistry writes the registry's configuration (its images are kept
// in the state directory, as the objects are) and starts it.
func (p *Plane) startRegistry() error {
	cfg, err := registry.Config(p.state.path("registry", "data"), p.RegistryAddress())
	if err != nil {
		return err
	}
	file := p.state.path("registry", "config.yml")
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return err
	}
	// 0600: it holds the registry's upload secret.
	if err := files.WriteAtomic(file, cfg, 0o600); err != nil {
		return err
	}
	return p.startChild("registry", []string{"serve", file}, registry.Env...)
}

// Config reaches the API server as the administrator.
func (p *Plane) Config() *rest.Config { return rest.CopyConfig(p.config) }

// AdminKubeconfig is the path of the administrator's kubeconfig.
func (p *Plane) AdminKubeconfig() string { return p.state.AdminKubeconfig() }

// WebhookURL is where the API server reaches marina's admission webhook.
func (p *Plane) WebhookURL() string {
	return "https://" + net.JoinHostPort(host, strconv.Itoa(p.opts.WebhookPort))
}

// WebhookCert is where the admission webhook's serving certificate and key
// are (issued by the plane's CA for 127.0.0.1), as a directory and the two
// file names in it.
func (p *Plane) WebhookCert() (dir, certName, keyName string) {
	return p.state.pki(), "webhook.crt", "webhook.key"
}

// CAData is the plane's CA certificate (PEM): what the API server trusts
// and what clients of the plane verify it with.
func (p *Plane) CAData() []byte { return p.config.CAData }

// Failed is closed when a component exits on its own; Err then says which
// and why.
func (p *Plane) Failed() <-chan struct{} { return p.failed }

// Err is the reason the plane failed, once Failed is closed.
func (p *Plane) Err() error { return p.failure }

// PIDs returns the process ID of every component, by name.
func (p *Plane) PIDs() map[string]int {
	pids := map[string]int{}
	for _, c := range p.children {
		pids[c.Name()] = c.PID()
	}
	return pids
}

// Stop stops the components in reverse start order and releases the state
// directory. It is safe to call more than once.
func (p *Plane) Stop() error {
	select {
	case <-p.stopping:
	default:
		close(p.stopping)
	}
	var errs []error
	for i := len(p.children) - 1; i >= 0; i-- {
		if err := p.children[i].Stop(stopGrace); err != nil {
			errs = append(errs, err)
		}
	}
	p.children = nil
	if p.spawner != nil {
		p.spawner.Close()
		p.spawner = nil
	}
	if p.lockFile != nil {
		p.lockFile.Close()
		p.lockFile = nil
	}
	return errors.Join(errs...)
}

func (p *Plane) bin(component, version string) string {
	return filepath.Join(p.opts.BinDir, component+"-"+version)
}

func (p *Plane) checkBinaries() error {
	bins := []string{
		p.bin("etcd", p.opts.EtcdVersion),
		p.bin("kube-apiserver", p.opts.KubeVersion),
		p.bin("kube-controller-manager", p.opts.KubeVersion),
	}
	if p.opts.RegistryPort != 0 {
		bins = append(bins, p.bin("registry", p.opts.RegistryVersion))
	}
	for _, b := range bins {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%s is missing: run `make setup` in the marina checkout to build it, "+
				"or point --bin-dir (MARINA_BIN_DIR) at a directory that has it", b)
		}
	}
	return nil
}

// checkPortsFree fails early, naming the port and the fix, rather than letting
// a component die with "address already in use" in its log.
func checkPortsFree(ports ...int) error {
	for _, port := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return fmt.Errorf("port %d on %s is already in use (another marina up, or another program): "+
				"stop it, or choose other ports with --api-port, --etcd-port, --webhook-port and --registry-port: %w", port, host, err)
		}
		l.Close()
	}
	return nil
}

func (p *Plane) startChild(name string, args []string, env ...string) error {
	version := p.opts.KubeVersion
	switch name {
	case "etcd":
		version = p.opts.EtcdVersion
	case "registry":
		version = p.opts.RegistryVersion
	}
	fmt.Fprintf(p.opts.Progress, "starting %s %s (log: %s)\n", name, version, p.state.log(name))
	c, err := p.spawner.Start(process.Spec{Name: name, Version: version, Binary: p.bin(name, version), Args: args, Env: env, LogPath: p.state.log(name)})
	if err != nil {
		return err
	}
	p.children = append(p.children, c)
	return nil
}

// watchChildren reports the first component that exits on its own while the
// plane runs; exits caused by Stop are not failures.
func (p *Plane) watchChildren(children []*process.Child) {
	exited := make(chan *process.Child, len(children))
	for _, c := range children {
		go func() { <-c.Done(); exited <- c }()
	}
	select {
	case c := <-exited:
		select {
		case <-p.stopping:
			return
		default:
		}
		p.failure = c.ExitError()
		close(p.failed)
	case <-p.stopping:
	}
}

// waitReady polls /readyz until the API server answers ok, failing fast when a
// component exits, and prints a progress line every few seconds.
func (p *Plane) waitReady(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(p.Config())
	if err != nil {
		return fmt.Errorf("building client: %w", err)
	}
	start := time.Now()
	lastReport := start
	var lastErr error
	for {
		for _, c := range p.children {
			if c.Exited() {
				return c.ExitError()
			}
		}
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			fmt.Fprintf(p.opts.Progress, "kube-apiserver is ready (%s)\n", time.Since(start).Round(100*time.Millisecond))
			return nil
		}
		lastErr = err
		if time.Since(lastReport) >= 3*time.Second {
			fmt.Fprintf(p.opts.Progress, "waiting for kube-apiserver to become ready (%s)\n", time.Since(start).Round(time.Second))
			lastReport = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for kube-apiserver to become ready: %w (last error: %v)", ctx.Err(), lastErr)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

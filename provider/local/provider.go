package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/nodeagent"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/provider"
)

// Name is the provider's name in conditions, events and logs.
const Name = "local"

// Options configure the local provider.
type Options struct {
	// Root is the directory holding one sandbox per machine. It is created
	// (0700) if missing.
	Root string
	// AgentCommand is the argv prefix that starts a node agent, e.g.
	// ["/usr/local/bin/marina", "node-agent"]; "--sandbox DIR" is appended.
	AgentCommand []string
	// LoadBalancerCommand is the argv prefix that starts a cluster's
	// endpoint, e.g. ["/usr/local/bin/marina", "load-balancer"]; "--dir DIR"
	// is appended. Without it the provider makes no endpoints.
	LoadBalancerCommand []string
	// AgentStartTimeout bounds how long Create waits for a started agent to
	// take its sandbox's lock; 30s when zero.
	AgentStartTimeout time.Duration
	// AgentStopTimeout is how long Delete waits after SIGTERM before
	// SIGKILL; 10s when zero.
	AgentStopTimeout time.Duration
	// StateScan is how often WatchStates probes every sandbox for an agent
	// that stopped or started; 2s when zero.
	StateScan time.Duration
	// BinDir holds the components make setup built
	// (kube-apiserver-<version>, ...): the control-plane versions this
	// provider can run. Empty: any version is accepted.
	BinDir string
	// Plane is the id of the management plane this provider works for
	// (marina uses its API server's kube-system namespace UID); see
	// ManagerFile. Empty: the root is this provider's alone.
	Plane string
	// EndpointAddresses are the addresses of this host where a Cluster's
	// own spec.controlPlaneEndpoint may make the provider listen (its end
	// of a bridge to servers, say). A cluster that sets its endpoint at
	// another address of this host is refused: its balancer could take a
	// port the management plane or another service needs (issue 24).
	// Empty: none.
	EndpointAddresses []netip.Prefix
	// Real configures the machines whose kubelet is real.
	Real RealOptions
}

// Provider is the local provider. It is safe for concurrent use; calls for
// one UID are serialised.
type Provider struct {
	root   string
	binDir string // Options.BinDir, absolute
	opts   Options
	locks  sync.Map // types.UID -> *sync.Mutex
}

var (
	_ provider.Provider      = (*Provider)(nil)
	_ provider.VersionLister = (*Provider)(nil)
	_ provider.VersionStager = (*Provider)(nil)
	_ provider.MachineLister = (*Provider)(nil)
	_ provider.Starter       = (*Provider)(nil)
	_ provider.StateWatcher  = (*Provider)(nil)
)

// New returns a local provider keeping its sandboxes under opts.Root.
func New(opts Options) (*Provider, error) {
	if opts.Root == "" {
		return nil, errors.New("local provider: Options.Root is required")
	}
	if len(opts.AgentCommand) == 0 {
		return nil, errors.New("local provider: Options.AgentCommand is required")
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, fmt.Errorf("local provider: resolving root %s: %w", opts.Root, err)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("local provider: creating root %s: %w", root, err)
	}
	if opts.AgentStartTimeout == 0 {
		opts.AgentStartTimeout = 30 * time.Second
	}
	if opts.AgentStopTimeout == 0 {
		opts.AgentStopTimeout = 10 * time.Second
	}
	if opts.StateScan == 0 {
		opts.StateScan = defaultStateScan
	}
	opts.Real = opts.Real.withDefaults()
	opts.AgentCommand = append([]string(nil), opts.AgentCommand...)
	opts.LoadBalancerCommand = append([]string(nil), opts.LoadBalancerCommand...)
	binDir := opts.BinDir
	if binDir != "" {
		if binDir, err = filepath.Abs(binDir); err != nil {
			return nil, fmt.Errorf("local provider: resolving bin dir %s: %w", opts.BinDir, err)
		}
	}
	return &Provider{root: root, binDir: binDir, opts: opts}, nil
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return Name }

// KubernetesVersions implements provider.VersionLister: the releases whose
// kube-apiserver is in Options.BinDir, oldest first.
func (p *Provider) KubernetesVersions() ([]string, error) {
	return KubernetesVersions(p.opts.BinDir)
}

// KubernetesVersions lists the releases whose kube-apiserver is in binDir,
// oldest first; nil when binDir is empty.
func KubernetesVersions(binDir string) ([]string, error) {
	if binDir == "" {
		return nil, nil
	}
	found, err := filepath.Glob(filepath.Join(binDir, "kube-apiserver-v*"))
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", binDir, err)
	}
	versions := make([]string, 0, len(found))
	for _, f := range found {
		versions = append(versions, strings.TrimPrefix(filepath.Base(f), "kube-apiserver-"))
	}
	slices.SortFunc(versions, func(a, b string) int {
		va, err := version.ParseSemantic(a)
		if err != nil {
			return strings.Compare(a, b)
		}
		if c, err := va.Compare(b); err == nil {
			return c
		}
		return strings.Compare(a, b)
	})
	return versions, nil
}

// Kinds implements provider.Provider: LocalMachine.
func (p *Provider) Kinds() []schema.GroupVersionKind {
	return []schema.GroupVersionKind{GroupVersion.WithKind(Kind)}
}

// Validate implements provider.Provider.
func (p *Provider) Validate(raw []byte) error {
	_, err := Decode(raw)
	return err
}

// Create implements provider.Provider. It builds the sandbox if it does
// not exist, and starts its agent if no agent runs (a first start, a crash
// before the start, or an agent that died since). It refreshes the
// bootstrap's server, CA and token before restarting an agent, as the old
// token may have expired; the machine's identity (name, address, labels,
// taints, capacity) stays what it was at creation.
func (p *Provider) Create(ctx context.Context, req *provider.Request) (*provider.Instance, error) {
	if err := checkUID(req.UID); err != nil {
		return nil, err
	}
	m, err := Decode(req.ProviderSpec)
	if err != nil {
		return nil, err
	}
	if m.Spec.Agent == AgentPooled && req.Bootstrap.ControlPlane != nil {
		return nil, &provider.InvalidSpecError{Field: "spec.agent", Message: "a control-plane machine runs its components under an agent process of its own: set agent to Process (or leave it out)"}
	}
	if m.Spec.Kubelet == KubeletReal {
		if req.Bootstrap.ControlPlane != nil {
			return nil, &provider.InvalidSpecError{Field: "spec.kubelet", Message: "control-plane machines do not run a Real kubelet yet: set kubelet to Simulated (or leave it out) on the control plane's class; workers may be Real"}
		}
		if err := p.checkRealHost(ctx); err != nil {
			return nil, err
		}
	}
	defer p.lock(req.UID)()

	dir := p.sandboxDir(req.UID)
	boot, err := sandbox.ReadBootstrap(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if boot, err = p.build(req, m); err != nil {
			return nil, fmt.Errorf("creating sandbox for machine %s/%s: %w", req.Namespace, req.Name, err)
		}
	case err != nil:
		return nil, err
	}
	if err := p.claim(dir); err != nil {
		return nil, err
	}

	if err := p.ensureRunning(ctx, req.UID, dir, boot, &req.Bootstrap); err != nil {
		return nil, fmt.Errorf("starting the agent of machine %s/%s: %w", req.Namespace, req.Name, err)
	}
	return instance(boot, provider.InstanceRunning), nil
}

// Start implements provider.Starter: it starts the agent of a stopped
// machine from its sandbox, which holds everything the machine had (its
// address, Node name, certificates, and on a control-plane machine its
// etcd data and member). A worker whose credential no longer works (see
// nodeagent.CheckCredential) is refused with a *BootstrapNeededError
// unless boot carries a fresh one. It returns once the agent holds its
// lock, before its components run: a stacked etcd member waits for its
// peers' starts, never Start.
func (p *Provider) Start(ctx context.Context, uid types.UID, boot *provider.Bootstrap) (*provider.Instance, error) {
	if err := checkUID(uid); err != nil {
		return nil, err
	}
	defer p.lock(uid)()
	dir := p.sandboxDir(uid)
	b, err := sandbox.ReadBootstrap(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, &provider.NotFoundError{UID: uid}
	}
	if err != nil {
		return nil, err
	}
	if err := p.ensureRunning(ctx, uid, dir, b, boot); err != nil {
		return nil, fmt.Errorf("starting the agent of machine %s: %w", uid, err)
	}
	return instance(b, provider.InstanceRunning), nil
}

// ensureRunning starts the agent of sandbox dir unless one runs (a pooled
// machine's in its pool). fresh, when it holds a token, replaces the
// server, CA and token the worker joins with; nil, the worker must be able
// to start with what it holds. Called under uid's lock.
func (p *Provider) ensureRunning(ctx context.Context, uid types.UID, dir string, boot *sandbox.Bootstrap, fresh *provider.Bootstrap) error {
	poolDir, err := poolOf(dir)
	if err != nil {
		return err
	}
	running, err := sandbox.Held(dir)
	if err != nil {
		return err
	}
	if running {
		if poolDir == "" {
			p.repairPIDFile(dir)
		}
		return nil
	}
	switch {
	case fresh != nil && fresh.Token != "":
		if credentialsChanged(boot, *fresh) {
			boot.Server, boot.CAPEM, boot.Token = fresh.Server, string(fresh.CAData), fresh.Token
			if err := sandbox.WriteBootstrap(dir, boot); err != nil {
				return fmt.Errorf("refreshing the bootstrap: %w", err)
			}
		}
	case fresh == nil:
		if err := nodeagent.CheckCredential(dir, boot, time.Now()); err != nil {
			return &provider.BootstrapNeededError{Reason: err.Error()}
		}
	}
	if poolDir != "" {
		return p.startMember(ctx, uid, dir, poolDir)
	}
	if boot.Real != nil {
		if err := p.ensureNetwork(ctx, uid, boot); err != nil {
			return fmt.Errorf("making the machine's network: %w", err)
		}
	}
	return p.startAgent(ctx, dir, sandboxFlag)
}

// Get implements provider.Provider. The machine is Running while its agent
// holds the sandbox's lock, Stopped otherwise.
func (p *Provider) Get(_ context.Context, uid types.UID) (*provider.Instance, error) {
	if err := checkUID(uid); err != nil {
		return nil, err
	}
	dir := p.sandboxDir(uid)
	boot, err := sandbox.ReadBootstrap(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, &provider.NotFoundError{UID: uid}
	}
	if err != nil {
		return nil, err
	}
	if err := p.claim(dir); err != nil {
		return nil, err
	}
	running, err := sandbox.Held(dir)
	if err != nil {
		return nil, err
	}
	state := provider.InstanceStopped
	if running {
		state = provider.InstanceRunning
	}
	return instance(boot, state), nil
}

// Delete implements provider.Provider: it stops the agent (SIGTERM, then
// SIGKILL after AgentStopTimeout) and removes the sandbox. The Node stays in
// the workload cluster, NotReady, for the machine controller to delete.
func (p *Provider) Delete(ctx context.Context, uid types.UID) error {
	if err := checkUID(uid); err != nil {
		return err
	}
	defer p.lock(uid)()
	dir := p.sandboxDir(uid)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return p.removeLeftovers(uid)
	} else if err != nil {
		return fmt.Errorf("deleting machine %s: %w", uid, err)
	}
	poolDir, err := poolOf(dir)
	if err == nil && poolDir != "" {
		err = p.stopMember(ctx, uid, dir, poolDir)
	} else if err == nil {
		err = p.stopAgent(ctx, dir)
	}
	if err != nil {
		return fmt.Errorf("deleting machine %s: %w", uid, err)
	}
	// Before the rename: a tombstone holds no mount and no process.
	if err := p.removeReal(ctx, uid, dir); err != nil {
		return fmt.Errorf("deleting machine %s: %w", uid, err)
	}
	// A rename is atomic: a crash leaves either the whole sandbox (and the
	// next Delete starts over) or a tombstone (which the next Delete removes).
	tomb := filepath.Join(p.root, fmt.Sprintf("%s%s-%d", tombPrefix, uid, time.Now().UnixNano()))
	if err := os.Rename(dir, tomb); err != nil {
		return fmt.Errorf("deleting machine %s: %w", uid, err)
	}
	sandboxAddresses.Delete(dir)
	if err := files.SyncDir(p.root); err != nil {
		return fmt.Errorf("deleting machine %s: %w", uid, err)
	}
	return p.removeLeftovers(uid)
}

// StageVersions implements provider.VersionStager. The sandboxes run the
// binaries of the management host's bin directory, so there is nothing to
// copy: it checks that the machine exists and that every control-plane
// version v asks for was built here. It writes nothing into the sandbox:
// the agent learns the versions from its Node.
func (p *Provider) StageVersions(_ context.Context, uid types.UID, v provider.Versions) error {
	if err := checkUID(uid); err != nil {
		return err
	}
	defer p.lock(uid)()
	if _, err := sandbox.ReadBootstrap(p.sandboxDir(uid)); errors.Is(err, fs.ErrNotExist) {
		return &provider.NotFoundError{UID: uid}
	} else if err != nil {
		return err
	}
	if p.binDir == "" {
		return nil
	}
	for _, bin := range []string{"kube-apiserver-" + v.ControlPlane.APIServer, "kube-controller-manager-" + v.ControlPlane.ControllerManager,
		"kube-scheduler-" + v.ControlPlane.Scheduler, "etcd-" + v.ControlPlane.Etcd} {
		if strings.HasSuffix(bin, "-") {
			continue // not asked for
		}
		if _, err := os.Stat(filepath.Join(p.binDir, bin)); err != nil {
			return &provider.InvalidSpecError{Message: fmt.Sprintf("%s was not built here (%s): run make setup with its version", bin, p.binDir)}
		}
	}
	return nil
}

// UIDs lists the machines that have a sandbox under the root (not the
// temporary and tombstone directories of unfinished creates and deletes).
func (p *Provider) UIDs() ([]types.UID, error) {
	entries, err := os.ReadDir(p.root)
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	var uids []types.UID
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			uids = append(uids, types.UID(e.Name()))
		}
	}
	return uids, nil
}

// DeleteAll deletes every machine and endpoint under the root, for tearing a whole local
// fleet down (a test suite, a benchmark).
func (p *Provider) DeleteAll(ctx context.Context) error {
	uids, err := p.UIDs()
	if err != nil {
		return err
	}
	// In parallel: a pooled machine's Delete mostly waits for its pool to
	// notice, and a fleet has a thousand of them.
	errs := make([]error, len(uids))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i, uid := range uids {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = p.Delete(ctx, uid)
		})
	}
	wg.Wait()
	endpoints, err := p.EndpointUIDs()
	errs = append(errs, err)
	for _, uid := range endpoints {
		errs = append(errs, p.DeleteEndpoint(ctx, uid))
	}
	return errors.Join(errs...)
}

// AgentPID returns the PID of the agent running for uid: a test's kill
// switch (`kill -9`) for simulating a machine that dies.
func (p *Provider) AgentPID(uid types.UID) (int, error) {
	if err := checkUID(uid); err != nil {
		return 0, err
	}
	dir := p.sandboxDir(uid)
	if _, err := os.Stat(dir); err != nil {
		return 0, fmt.Errorf("machine %s: %w", uid, err)
	}
	pid := p.agentPID(dir)
	if pid == 0 {
		return 0, fmt.Errorf("no agent runs for machine %s", uid)
	}
	return pid, nil
}

// lock serialises the calls for one UID and returns the unlock.
func (p *Provider) lock(uid types.UID) func() {
	mu, _ := p.locks.LoadOrStore(uid, &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	return mu.(*sync.Mutex).Unlock
}

func (p *Provider) sandboxDir(uid types.UID) string { return filepath.Join(p.root, string(uid)) }

// checkUID refuses UIDs that are not a plain directory name: the UID names
// the sandbox, and must not reach outside the root.
func checkUID(uid types.UID) error {
	s := string(uid)
	if s == "" || s != filepath.Base(s) || strings.HasPrefix(s, ".") || strings.ContainsAny(s, `/\`) {
		return fmt.Errorf("local provider: %q is not a usable machine UID", s)
	}
	return nil
}

func credentialsChanged(b *sandbox.Bootstrap, nb provider.Bootstrap) bool {
	return b.Server != nb.Server || b.CAPEM != string(nb.CAData) || b.Token != nb.Token
}

func instance(b *sandbox.Bootstrap, state provider.InstanceState) *provider.Instance {
	return &provider.Instance{
		ProviderID: b.ProviderID,
		Addresses: []clusterv1.MachineAddress{
			{Type: clusterv1.MachineInternalIP, Address: b.Address},
			{Type: clusterv1.MachineHostName, Address: b.NodeName},
		},
		State: state,
	}
}

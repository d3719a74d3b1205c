package ssh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/yaml"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/files"
	"marina.dev/marina/provider"
	"marina.dev/marina/provider/local"
)

// Name is the provider's name in conditions, events and logs.
const Name = "ssh"

// Paths on a host. One host holds at most one machine.
const (
	// HostDir is marina's directory on a host.
	HostDir = "/var/lib/marina"
	// claimDir exists while a machine holds the host; its file uid names
	// the Machine.
	claimDir   = HostDir + "/claim"
	sandboxDir = HostDir + "/machine"
	binDir     = HostDir + "/bin"
	logDir     = HostDir + "/log"
	// LogFile is the provisioning log on the host, kept after the machine
	// goes.
	LogFile = logDir + "/provision.log"
)

// Options configure the SSH provider.
type Options struct {
	// StateDir keeps, per machine, which hosts it may hold and which it
	// claimed (created 0700 if missing): Delete and Get are given only the
	// Machine's UID.
	StateDir string
	// AgentBinary is the marina binary copied to every host to run the
	// node agent (marina node-agent).
	AgentBinary string
	// BinDir holds the component binaries (etcd-<v>,
	// kube-apiserver-<v>, ...) copied to control-plane hosts.
	BinDir string
	// AgentStartTimeout bounds how long Create waits for a started agent
	// to take its lock; 30s when zero.
	AgentStartTimeout time.Duration
	// MinFreeKiB is the room a machine needs under /var/lib/marina, checked
	// by the default templates; 1 GiB when zero.
	MinFreeKiB int64
	// Client reads the Secrets and ConfigMaps machines name, live (not
	// from a cache: a fixed template is seen on the next attempt). Set by
	// SetupWithManager when nil.
	Client client.Reader
	// Recorder records provisioning output as the Machine's events. Set by
	// SetupWithManager when nil.
	Recorder recorder.EventRecorder
}

// Provider is the SSH provider. Calls for one UID are serialised.
type Provider struct {
	opts  Options
	locks sync.Map // types.UID -> *sync.Mutex
}

// Registration: the provider side of marina's contract, with the
// binaries of an InPlace upgrade's versions staged on the host (the agent
// reads the versions to run from its own Node).
var (
	_ provider.Provider      = (*Provider)(nil)
	_ provider.MachineLister = (*Provider)(nil)
	_ provider.VersionLister = (*Provider)(nil)
	_ provider.VersionStager = (*Provider)(nil)
)

// New returns an SSH provider.
func New(opts Options) (*Provider, error) {
	if opts.StateDir == "" {
		return nil, errors.New("ssh provider: Options.StateDir is required")
	}
	if opts.AgentBinary == "" {
		return nil, errors.New("ssh provider: Options.AgentBinary is required")
	}
	if err := os.MkdirAll(opts.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("ssh provider: creating %s: %w", opts.StateDir, err)
	}
	if opts.AgentStartTimeout == 0 {
		opts.AgentStartTimeout = 30 * time.Second
	}
	if opts.MinFreeKiB == 0 {
		opts.MinFreeKiB = 1 << 20
	}
	return &Provider{opts: opts}, nil
}

// SetupWithManager gives the provider the manager's live reader and an
// event recorder, unless Options set them.
func (p *Provider) SetupWithManager(mgr ctrl.Manager) error {
	if p.opts.Client == nil {
		p.opts.Client = mgr.GetAPIReader()
	}
	if p.opts.Recorder == nil {
		p.opts.Recorder = mgr.GetEventRecorder("ssh-provider")
	}
	return nil
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return Name }

// KubernetesVersions implements provider.VersionLister: the releases whose
// components are in Options.BinDir, which are those it can copy.
func (p *Provider) KubernetesVersions() ([]string, error) {
	return local.KubernetesVersions(p.opts.BinDir)
}

// Kinds implements provider.Provider: SSHMachine.
func (p *Provider) Kinds() []schema.GroupVersionKind {
	return []schema.GroupVersionKind{GroupVersion.WithKind(Kind)}
}

// Validate implements provider.Provider.
func (p *Provider) Validate(raw []byte) error {
	_, err := Decode(raw)
	return err
}

// ProviderID is the providerID of the SSH machine with the given UID.
func ProviderID(uid types.UID) string { return "ssh://" + string(uid) }

// Create implements provider.Provider. It finds the host this machine
// claimed before (a retry, a restarted controller) or claims a free one,
// copies the agent, the binaries and the bootstrap bundle, and runs the
// provisioning templates, unless the machine's agent already runs there.
func (p *Provider) Create(ctx context.Context, req *provider.Request) (*provider.Instance, error) {
	if err := checkUID(req.UID); err != nil {
		return nil, err
	}
	m, err := Decode(req.ProviderSpec)
	if err != nil {
		return nil, err
	}
	defer p.lock(req.UID)()
	creds, keep, err := p.readCredentials(ctx, req.Namespace, m.Spec.SecretRef.Name)
	if err != nil {
		return nil, err
	}
	candidates, err := p.candidates(ctx, req.Namespace, &m.Spec)
	if err != nil {
		return nil, err
	}
	tmpls, err := p.templates(ctx, req.Namespace, m.Spec.TemplatesRef)
	if err != nil {
		return nil, err
	}
	if m.Spec.TemplatesRef != nil {
		keep.Deprovision = tmpls.phase(phaseDeprovision)
	}
	// The record first: a host claimed after it is always found again,
	// by Create, Delete and the safety controller.
	rec, err := p.readRecord(req.UID)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		rec = &record{}
	}
	rec.Namespace, rec.Name, rec.Spec = req.Namespace, req.Name, m.Spec
	rec.ControlPlane = req.Bootstrap.ControlPlane != nil
	rec.Candidates = mergeHosts(rec.Candidates, candidates)
	rec.Kept = keep
	if err := p.writeRecord(req.UID, rec); err != nil {
		return nil, err
	}

	c, err := p.claim(ctx, req.UID, rec, candidates, creds)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	running, err := agentRunning(ctx, c)
	if err != nil {
		return nil, err
	}
	if !running {
		if err := p.provision(ctx, c, req, rec, tmpls); err != nil {
			return nil, err
		}
	}
	return instance(req.UID, c.host, provider.InstanceRunning), nil
}

// Get implements provider.Provider: Running while the machine's agent
// holds its lock on the host, Stopped otherwise.
func (p *Provider) Get(ctx context.Context, uid types.UID) (*provider.Instance, error) {
	if err := checkUID(uid); err != nil {
		return nil, err
	}
	rec, err := p.readRecord(uid)
	if err != nil {
		return nil, err
	}
	if rec == nil || rec.Host == nil {
		return nil, &provider.NotFoundError{UID: uid}
	}
	c, err := p.onHost(ctx, uid, rec)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	running, err := agentRunning(ctx, c)
	if err != nil {
		return nil, err
	}
	state := provider.InstanceStopped
	if running {
		state = provider.InstanceRunning
	}
	return instance(uid, *rec.Host, state), nil
}

// Delete implements provider.Provider: on the host it holds, the machine's
// deprovision templates run (the defaults stop the agent and every process
// it started, and remove its files but the provisioning log), then the
// claim is released. Nil when the machine holds no host.
func (p *Provider) Delete(ctx context.Context, uid types.UID) error {
	if err := checkUID(uid); err != nil {
		return err
	}
	defer p.lock(uid)()
	rec, err := p.readRecord(uid)
	if err != nil || rec == nil {
		return err
	}
	creds, err := p.deletionCredentials(ctx, rec)
	if err != nil {
		return fmt.Errorf("deleting machine %s/%s: %w", rec.Namespace, rec.Name, err)
	}
	// The host it holds; or, after a crash between a claim and its
	// record, the one it was claiming. Neither: it never claimed one.
	var hosts []Host
	switch {
	case rec.Host != nil:
		hosts = []Host{*rec.Host}
	case rec.Claiming != nil:
		hosts = []Host{*rec.Claiming}
	}
	for _, h := range hosts {
		if err := p.deprovision(ctx, uid, rec, h, creds); err != nil {
			return fmt.Errorf("deleting machine %s/%s: %w", rec.Namespace, rec.Name, err)
		}
	}
	return p.removeRecord(uid)
}

// deprovision runs the deprovision steps on h and releases its claim, if
// uid holds it.
func (p *Provider) deprovision(ctx context.Context, uid types.UID, rec *record, h Host, creds *Credentials) error {
	c, err := dial(ctx, h, creds)
	if err != nil {
		return err
	}
	defer c.Close()
	holder, err := claimHolder(ctx, c)
	if err != nil {
		return err
	}
	if holder != uid {
		// Another machine's host (or nobody's): only a temporary claim
		// this machine may have left is removed.
		_, err := c.output(ctx, "rm -rf "+shellQuote(tmpClaim(uid)))
		return err
	}
	tmpls, err := p.deletionTemplates(ctx, rec)
	if err != nil {
		return err
	}
	steps, err := tmpls.Render(phaseDeprovision, p.facts(uid, rec, h, ""))
	if err != nil {
		return err
	}
	for _, s := range steps {
		if err := p.runStep(ctx, c, uid, rec, s); err != nil {
			return err
		}
	}
	return release(ctx, c, uid)
}

// StageVersions makes the binaries of v available on the host of the
// machine made for uid, for an InPlace upgrade: a control-plane machine's
// components at v's versions (its agent switches to them when its Node
// asks). A worker's kubelet is the agent itself: nothing to copy.
func (p *Provider) StageVersions(ctx context.Context, uid types.UID, v provider.Versions) error {
	if err := checkUID(uid); err != nil {
		return err
	}
	defer p.lock(uid)()
	rec, err := p.readRecord(uid)
	if err != nil {
		return err
	}
	if rec == nil || rec.Host == nil {
		return &provider.NotFoundError{UID: uid}
	}
	if !rec.ControlPlane {
		return nil
	}
	var bins []string
	for name, want := range map[string]string{
		"kube-apiserver": v.ControlPlane.APIServer, "kube-controller-manager": v.ControlPlane.ControllerManager,
		"kube-scheduler": v.ControlPlane.Scheduler, "etcd": v.ControlPlane.Etcd,
	} {
		if want != "" {
			bins = append(bins, name+"-"+want)
		}
	}
	// The machine controller stages on every pass; checking the host each
	// time cost a login and hashing some 300 MB of binaries there, per
	// control-plane machine per pass. What was copied or found is
	// recorded, and the host is visited again only for a binary it has
	// not been seen to hold.
	sums, err := p.binarySums(bins)
	if err != nil {
		return err
	}
	if rec.holds(sums) {
		return nil
	}
	c, err := p.onHost(ctx, uid, rec)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := p.copyBinaries(ctx, c, bins); err != nil {
		return err
	}
	if rec.Staged == nil {
		rec.Staged = map[string]string{}
	}
	maps.Copy(rec.Staged, sums)
	return p.writeRecord(uid, rec)
}

// binarySums are the SHA-256 sums of the named binaries of the binary
// directory, by name.
func (p *Provider) binarySums(names []string) (map[string]string, error) {
	sums := make(map[string]string, len(names))
	for _, name := range names {
		sum, err := localSum(filepath.Join(p.opts.BinDir, name))
		if err != nil {
			return nil, fmt.Errorf("the binary %s the machine needs: %w", name, err)
		}
		sums[name] = sum
	}
	return sums, nil
}

// onHost connects to the host rec holds for the machine made for uid, and
// checks that the claim there is still that machine's: a *NotFoundError
// when another holds it (or none).
func (p *Provider) onHost(ctx context.Context, uid types.UID, rec *record) (*conn, error) {
	creds, err := p.credentials(ctx, rec.Namespace, rec.Spec.SecretRef.Name)
	if err != nil {
		return nil, err
	}
	c, err := dial(ctx, *rec.Host, creds)
	if err != nil {
		return nil, err
	}
	holder, err := claimHolder(ctx, c)
	if err == nil && holder != uid {
		err = &provider.NotFoundError{UID: uid}
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// MachineUIDs implements provider.MachineLister: the machines that may hold
// a host. A record is written before a host is claimed and removed only
// once it is released, so a claim whose Machine is gone is listed here.
func (p *Provider) MachineUIDs(context.Context) ([]types.UID, error) {
	entries, err := os.ReadDir(p.opts.StateDir)
	if err != nil {
		return nil, fmt.Errorf("listing the ssh provider's machines: %w", err)
	}
	var uids []types.UID
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ".json"); ok && !strings.HasPrefix(name, ".") {
			uids = append(uids, types.UID(name))
		}
	}
	return uids, nil
}

// credentials reads the Secret ns/name.
func (p *Provider) credentials(ctx context.Context, ns, name string) (*Credentials, error) {
	creds, _, err := p.readCredentials(ctx, ns, name)
	return creds, err
}

// errGone is wrapped by the errors that say a Secret or ConfigMap a spec
// names does not exist.
var errGone = errors.New("not found")

// readCredentials is credentials, and the Secret's data they came from.
func (p *Provider) readCredentials(ctx context.Context, ns, name string) (*Credentials, *kept, error) {
	if p.opts.Client == nil {
		return nil, nil, errors.New("ssh provider: no client to read Secrets with (SetupWithManager was not called)")
	}
	var s corev1.Secret
	if err := p.opts.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, fmt.Errorf("Secret %s/%s (spec.secretRef) does not exist: create it with %s and %s (%w)", ns, name, PrivateKeyKey, KnownHostsKey, errGone)
		}
		return nil, nil, fmt.Errorf("reading Secret %s/%s: %w", ns, name, err)
	}
	creds, err := ParseCredentials(s.Data[PrivateKeyKey], s.Data[KnownHostsKey], ns+"/"+name)
	return creds, &kept{PrivateKey: s.Data[PrivateKeyKey], KnownHosts: s.Data[KnownHostsKey]}, err
}

// deletionCredentials are the live Secret's credentials, or those Create
// kept when the Secret is gone.
func (p *Provider) deletionCredentials(ctx context.Context, rec *record) (*Credentials, error) {
	creds, _, err := p.readCredentials(ctx, rec.Namespace, rec.Spec.SecretRef.Name)
	if !errors.Is(err, errGone) || rec.Kept == nil {
		return creds, err
	}
	return ParseCredentials(rec.Kept.PrivateKey, rec.Kept.KnownHosts, fmt.Sprintf("the copy of Secret %s/%s kept for the machine's deletion", rec.Namespace, rec.Spec.SecretRef.Name))
}

// deletionTemplates are the live templates, or the deprovision steps
// Create kept when their ConfigMap is gone.
func (p *Provider) deletionTemplates(ctx context.Context, rec *record) (*Templates, error) {
	tmpls, err := p.templates(ctx, rec.Namespace, rec.Spec.TemplatesRef)
	if !errors.Is(err, errGone) || rec.Kept == nil || rec.Kept.Deprovision == nil {
		return tmpls, err
	}
	return &Templates{Source: fmt.Sprintf("the copy of ConfigMap %s/%s kept for the machine's deletion", rec.Namespace, rec.Spec.TemplatesRef.Name), Data: rec.Kept.Deprovision}, nil
}

// candidates are the hosts spec names that its selector keeps.
func (p *Provider) candidates(ctx context.Context, ns string, spec *SSHMachineSpec) ([]Host, error) {
	hosts := spec.Hosts
	if ref := spec.HostsRef; ref != nil {
		var cm corev1.ConfigMap
		if err := p.opts.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, &cm); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("ConfigMap %s/%s (spec.hostsRef) does not exist: create it with the host list under %s", ns, ref.Name, HostsKey)
			}
			return nil, fmt.Errorf("reading ConfigMap %s/%s: %w", ns, ref.Name, err)
		}
		hosts = nil
		if err := yaml.UnmarshalStrict([]byte(cm.Data[HostsKey]), &hosts); err != nil {
			return nil, fmt.Errorf("ConfigMap %s/%s: %s is not a host list (address, port, user, labels): %w", ns, ref.Name, HostsKey, err)
		}
		if err := checkHosts(fmt.Sprintf("ConfigMap %s/%s %s", ns, ref.Name, HostsKey), hosts); err != nil {
			return nil, err
		}
	}
	out := selected(hosts, spec.HostSelector)
	if len(out) == 0 {
		return nil, fmt.Errorf("no host matches spec.hostSelector %v among the %d listed: no free host", spec.HostSelector, len(hosts))
	}
	return out, nil
}

// templates reads the machine's templates, afresh on every attempt.
func (p *Provider) templates(ctx context.Context, ns string, ref *LocalRef) (*Templates, error) {
	if ref == nil {
		return DefaultTemplates(), nil
	}
	var cm corev1.ConfigMap
	if err := p.opts.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("ConfigMap %s/%s (spec.templatesRef) does not exist: create it, or remove templatesRef to use the defaults (%w)", ns, ref.Name, errGone)
		}
		return nil, fmt.Errorf("reading ConfigMap %s/%s: %w", ns, ref.Name, err)
	}
	return &Templates{Source: fmt.Sprintf("ConfigMap %s/%s", ns, ref.Name), Data: cm.Data}, nil
}

// event records a provisioning event on the Machine.
func (p *Provider) event(uid types.UID, rec *record, warning bool, reason, format string, args ...any) {
	if p.opts.Recorder == nil {
		return
	}
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: rec.Namespace, Name: rec.Name, UID: uid}}
	m.SetGroupVersionKind(clusterv1.GroupVersion.WithKind("Machine"))
	typ := corev1.EventTypeNormal
	if warning {
		typ = corev1.EventTypeWarning
	}
	p.opts.Recorder.Eventf(m, nil, typ, reason, "Provision", format, args...)
}

func (p *Provider) log(ctx context.Context, rec *record) klog.Logger {
	return klog.FromContext(ctx).WithValues("provider", Name, "machine", klog.KRef(rec.Namespace, rec.Name))
}

// lock serialises the calls for one UID and returns the unlock.
func (p *Provider) lock(uid types.UID) func() {
	mu, _ := p.locks.LoadOrStore(uid, &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	return mu.(*sync.Mutex).Unlock
}

// checkUID refuses UIDs that are not a plain file name: they name records
// and go into commands run on hosts.
func checkUID(uid types.UID) error {
	s := string(uid)
	if s == "" || strings.HasPrefix(s, ".") || strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-") != "" {
		return fmt.Errorf("ssh provider: %q is not a usable machine UID", s)
	}
	return nil
}

func instance(uid types.UID, h Host, state provider.InstanceState) *provider.Instance {
	return &provider.Instance{
		ProviderID: ProviderID(uid),
		Addresses:  []clusterv1.MachineAddress{{Type: clusterv1.MachineInternalIP, Address: h.Address}},
		State:      state,
	}
}

// record is what the provider keeps of a machine on the management host.
type record struct {
	Namespace, Name string
	Spec            SSHMachineSpec
	ControlPlane    bool
	// Candidates are every host the machine may have claimed.
	Candidates []Host
	// Host is the host it claimed, once known.
	Host *Host `json:",omitempty"`
	// Claiming is the host it is claiming, until Host is set.
	Claiming *Host `json:",omitempty"`
	// Versions are the versions it was provisioned with, for the steps
	// Start runs again.
	Versions VersionFacts
	// Kept is what Delete needs when the Secret or the templates
	// ConfigMap the spec names are gone.
	Kept *kept `json:",omitempty"`
	// Staged are the binaries StageVersions put on the host or found
	// there, by name, with their SHA-256 sums.
	Staged map[string]string `json:",omitempty"`
}

// holds reports whether every binary of sums was staged on the host with
// that sum.
func (r *record) holds(sums map[string]string) bool {
	for name, sum := range sums {
		if r.Staged[name] != sum {
			return false
		}
	}
	return true
}

// kept is the key to log in with and the deprovision templates, as they
// were when Create last read them. `kubectl delete namespace` removes a
// namespace's Secrets and ConfigMaps first (they have no finalizer) while
// its Machines wait on theirs: without this copy a machine's deletion
// would wait for good and its host stay claimed with its agent running.
// The live objects are used whenever they exist (a rotated key is used
// at once); the record file is 0600 in a 0700 directory.
type kept struct {
	PrivateKey, KnownHosts []byte
	// Deprovision are the deprovision steps of the templates, by key;
	// nil with the default templates.
	Deprovision map[string]string `json:",omitempty"`
}

func (p *Provider) recordPath(uid types.UID) string {
	return filepath.Join(p.opts.StateDir, string(uid)+".json")
}

func (p *Provider) readRecord(uid types.UID) (*record, error) {
	data, err := os.ReadFile(p.recordPath(uid))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the record of machine %s: %w", uid, err)
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", p.recordPath(uid), err)
	}
	return &r, nil
}

func (p *Provider) writeRecord(uid types.UID, r *record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return files.WriteAtomic(p.recordPath(uid), data, 0o600)
}

func (p *Provider) removeRecord(uid types.UID) error {
	if err := os.Remove(p.recordPath(uid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return files.SyncDir(p.opts.StateDir)
}

// mergeHosts is a, then the hosts of b not in a.
func mergeHosts(a, b []Host) []Host {
	out := append([]Host(nil), a...)
	for _, h := range b {
		found := false
		for _, o := range a {
			found = found || o.target() == h.target()
		}
		if !found {
			out = append(out, h)
		}
	}
	return out
}

package local

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/internal/nodenet"
	"marina.dev/marina/provider"
)

// Prefixes of the root's entries that are not sandboxes: a sandbox being
// built, and a sandbox being removed.
const (
	tmpPrefix  = ".tmp-"
	tombPrefix = ".tomb-"
)

// allocMu makes picking an address one step for every Provider of the
// process, so that two machines never get one address.
var allocMu sync.Mutex

// reserved holds, under allocMu, the addresses picked for sandboxes still
// being written. The writes (each file synced) are done outside the lock:
// under it, a benchmark of 1,010 machines had 19 of 32 machine workers
// queued behind one another's fsyncs, about five sandboxes a second.
var reserved = map[string]bool{}

// building holds, under allocMu, the machines whose sandbox is being
// written: a second build of one (another Provider over the same root, as
// after an in-process restart) would remove the first one's temporary
// directory as a crash's leftover.
var building = map[types.UID]bool{}

// sandboxAddresses remembers the address of each sandbox directory seen, as
// it never changes: reading every sandbox's bootstrap on every allocation
// made creating a fleet quadratic (a benchmark of 1,010 machines found 28
// of 32 machine workers waiting on allocMu). A sandbox no longer listed is
// not counted, whatever is remembered.
var sandboxAddresses sync.Map // sandbox directory -> address

// build makes the sandbox of req: it writes the bootstrap into a temporary
// directory and renames it into place, so that a sandbox that exists is
// complete.
func (p *Provider) build(req *provider.Request, m *LocalMachine) (*sandbox.Bootstrap, error) {
	dir := p.sandboxDir(req.UID)
	if b, err := sandbox.ReadBootstrap(dir); err == nil {
		return b, nil // another Provider of this process just built it
	}
	pick := pickAddress
	if m.Spec.Kubelet == KubeletReal {
		pick = func(uid types.UID, used map[string]bool) (string, error) {
			return pickRealAddress(uid, p.opts.Real.Network, used)
		}
	}
	addr, err := p.reserveAddress(req.UID, pick)
	if err != nil {
		return nil, err
	}
	// Released once the sandbox is in place and its address remembered,
	// or given up.
	defer release(req.UID, addr)
	b := bootstrapFor(req, m, addr)
	if m.Spec.Kubelet == KubeletReal {
		b.BinDir = p.binDir
		b.Real = p.realBootstrap(req.UID, addr, m.Spec.Pods)
		b.ContainerRuntimeVersion = "containerd://" + strings.TrimPrefix(p.opts.Real.ContainerdVersion, "v")
	}

	tmp, err := os.MkdirTemp(p.root, tmpPrefix+string(req.UID)+"-")
	if err != nil {
		return nil, err
	}
	if p.opts.Plane != "" {
		// Inside the temporary directory: a sandbox is never in place
		// without its manager, so this plane's orphan sweep sees it as
		// its own from the start.
		if err := files.WriteAtomic(filepath.Join(tmp, ManagerFile), []byte(p.opts.Plane+"\n"), 0o600); err != nil {
			_ = os.RemoveAll(tmp)
			return nil, err
		}
	}
	if doc := req.Bootstrap.ControlPlane; doc != nil {
		b.BinDir = p.binDir
		// Pods of real workers reach the API servers there (the
		// kubernetes Service), through their own machine's relay.
		b.AdvertiseAddress = nodenet.APIAddress(p.opts.Real.Network).String()
		if err := files.WriteAtomic(filepath.Join(tmp, sandbox.ControlPlaneFile), doc, 0o600); err != nil {
			_ = os.RemoveAll(tmp)
			return nil, err
		}
	}
	if m.Spec.Agent == AgentPooled {
		if err := files.WriteAtomic(filepath.Join(tmp, PoolFile), []byte(p.poolDirFor(req)+"\n"), 0o600); err != nil {
			_ = os.RemoveAll(tmp)
			return nil, err
		}
	}
	if kc := req.KubeletConfig; kc != nil {
		b.KubeletConfigName = kc.Name
		if err := files.WriteAtomic(filepath.Join(tmp, sandbox.KubeletConfigFile), kc.Data, 0o600); err != nil {
			_ = os.RemoveAll(tmp)
			return nil, err
		}
	}
	if err := sandbox.WriteBootstrap(tmp, b); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		_ = os.RemoveAll(tmp)
		if other, rerr := sandbox.ReadBootstrap(dir); rerr == nil {
			return other, nil // another process won the race: use its sandbox
		}
		return nil, fmt.Errorf("moving the sandbox into place: %w", err)
	}
	if err := files.SyncDir(p.root); err != nil {
		return nil, err
	}
	sandboxAddresses.Store(dir, b.Address)
	return b, nil
}

// reserveAddress picks a free address for uid's sandbox and holds it
// until release; it first removes what a crash may have left of the
// sandbox.
func (p *Provider) reserveAddress(uid types.UID, pick func(types.UID, map[string]bool) (string, error)) (string, error) {
	allocMu.Lock()
	defer allocMu.Unlock()
	if building[uid] {
		return "", fmt.Errorf("the sandbox of machine %s is being built by another call: try again", uid)
	}
	if err := p.removeLeftovers(uid); err != nil {
		return "", err
	}
	used, err := p.usedAddresses()
	if err != nil {
		return "", err
	}
	addr, err := pick(uid, used)
	if err != nil {
		return "", err
	}
	reserved[addr] = true
	building[uid] = true
	return addr, nil
}

func release(uid types.UID, addr string) {
	allocMu.Lock()
	defer allocMu.Unlock()
	delete(reserved, addr)
	delete(building, uid)
}

// bootstrapFor is what the agent of req's machine needs to know.
func bootstrapFor(req *provider.Request, m *LocalMachine, addr string) *sandbox.Bootstrap {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    m.Spec.CPU,
		corev1.ResourceMemory: m.Spec.Memory,
		corev1.ResourcePods:   *resource.NewQuantity(int64(m.Spec.Pods), resource.DecimalSI),
	}
	if m.Spec.GPUs > 0 {
		capacity[GPUResource] = *resource.NewQuantity(int64(m.Spec.GPUs), resource.DecimalSI)
	}
	if m.Spec.DiskSize != nil {
		capacity[corev1.ResourceEphemeralStorage] = *m.Spec.DiskSize
	}
	var runtimeVersion string
	if rt := req.Machine.ContainerRuntime; rt.Name != "" {
		v := rt.Version
		if v == "" {
			v = "simulated"
		}
		runtimeVersion = rt.Name + "://" + v
	}
	return &sandbox.Bootstrap{
		Server:                  req.Bootstrap.Server,
		CAPEM:                   string(req.Bootstrap.CAData),
		Token:                   req.Bootstrap.Token,
		ClusterDNS:              req.Bootstrap.ClusterDNS,
		ClusterDomain:           req.Bootstrap.ClusterDomain,
		NodeName:                req.Name,
		ProviderID:              ProviderID(req.UID),
		Address:                 addr,
		Labels:                  req.Machine.Labels,
		Taints:                  req.Machine.Taints,
		Annotations:             req.NodeAnnotations,
		Capacity:                capacity,
		KubeletVersion:          string(req.Machine.Versions.Kubelet),
		ContainerRuntimeVersion: runtimeVersion,
	}
}

// ProviderID is the providerID of the local machine with the given UID.
func ProviderID(uid types.UID) string { return "local://" + string(uid) }

// usedAddresses are the addresses of the existing sandboxes and endpoints,
// and those reserved for sandboxes being built; called under allocMu.
func (p *Provider) usedAddresses() (map[string]bool, error) {
	uids, err := p.UIDs()
	if err != nil {
		return nil, err
	}
	used := make(map[string]bool, len(uids))
	for _, uid := range uids {
		dir := p.sandboxDir(uid)
		if addr, ok := sandboxAddresses.Load(dir); ok {
			used[addr.(string)] = true
			continue
		}
		b, err := sandbox.ReadBootstrap(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		sandboxAddresses.Store(dir, b.Address)
		used[b.Address] = true
	}
	for addr := range reserved {
		used[addr] = true
	}
	endpoints, err := p.endpointAddresses()
	if err != nil {
		return nil, err
	}
	for _, addr := range endpoints {
		used[addr] = true
	}
	return used, nil
}

// addressSpace is the number of addresses 127.x.y.z with x in 1..254,
// y in 0..255 and z in 1..254: all of 127/8 but 127.0/16 (127.0.0.1 is the
// host's own) and the .0 and .255 ends.
const addressSpace = 254 * 256 * 254

// pickAddress derives an address from the UID, so that it is stable and
// spread, and probes the next ones until it finds one not in used.
func pickAddress(uid types.UID, used map[string]bool) (string, error) {
	h := fnv.New64a()
	h.Write([]byte(uid))
	start := h.Sum64() % addressSpace
	for i := uint64(0); i < addressSpace; i++ {
		n := (start + i) % addressSpace
		addr := fmt.Sprintf("127.%d.%d.%d", 1+n/(256*254), (n/254)%256, 1+n%254)
		if !used[addr] {
			return addr, nil
		}
	}
	return "", errors.New("no free loopback address is left for a new sandbox")
}

// removeLeftovers removes what a crash may have left of uid's sandbox: a
// half-built temporary directory, or a tombstone not yet removed.
func (p *Provider) removeLeftovers(uid types.UID) error {
	entries, err := os.ReadDir(p.root)
	if err != nil {
		return fmt.Errorf("listing sandboxes: %w", err)
	}
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, tmpPrefix+string(uid)+"-") || strings.HasPrefix(n, tombPrefix+string(uid)+"-") {
			if err := os.RemoveAll(filepath.Join(p.root, n)); err != nil {
				return fmt.Errorf("removing %s: %w", n, err)
			}
		}
	}
	return nil
}

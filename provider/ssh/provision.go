package ssh

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/provider"
	"marina.dev/marina/tools"
)

// agentBinary is the name of the marina binary on the host.
const agentBinary = "marina"

// stepPGIDFile holds the process group of the step running on the host.
const stepPGIDFile = HostDir + "/.step.pgid"

// agentRunning reports whether the machine's agent holds its lock on the
// host.
func agentRunning(ctx context.Context, c *conn) (bool, error) {
	lock := sandboxDir + "/" + sandbox.LockFile
	out, err := c.output(ctx, fmt.Sprintf(`[ -e %[1]s ] || { echo 0; exit 0; }; flock -n -E 75 %[1]s true; echo $?`, lock))
	if err != nil {
		return false, err
	}
	switch strings.TrimSpace(out) {
	case "0":
		return false, nil
	case "75":
		return true, nil
	}
	return false, fmt.Errorf("host %s: cannot tell whether the agent runs (flock %s: %s): is util-linux installed?", c.host.target(), lock, strings.TrimSpace(out))
}

// facts are what uid's templates are rendered with on h.
func (p *Provider) facts(uid types.UID, rec *record, h Host, server string) *Facts {
	role := "worker"
	if rec.ControlPlane {
		role = "control-plane"
	}
	return &Facts{
		Machine:          MachineFacts{Namespace: rec.Namespace, Name: rec.Name, UID: string(uid)},
		Role:             role,
		Host:             h,
		Dir:              HostDir,
		SandboxDir:       sandboxDir,
		BinDir:           binDir,
		LogDir:           logDir,
		AgentCommand:     binDir + "/" + agentBinary + " node-agent --sandbox " + sandboxDir,
		BootstrapFile:    sandboxDir + "/" + sandbox.BootstrapFile,
		ControlPlaneFile: sandboxDir + "/" + sandbox.ControlPlaneFile,
		Server:           server,
		MinFreeKiB:       p.opts.MinFreeKiB,
	}
}

// provision makes req's machine on c's host: the binaries, the bootstrap
// bundle, then the provisioning steps; it returns once the agent holds
// its lock. Every part may run again (a retry after any failure or crash).
func (p *Provider) provision(ctx context.Context, c *conn, req *provider.Request, rec *record, tmpls *Templates) error {
	facts := p.facts(req.UID, rec, c.host, req.Bootstrap.Server)
	facts.Versions.Kubelet = string(req.Machine.Versions.Kubelet)
	bins := []string{agentBinary}
	var cfg bootstrap.Config
	if doc := req.Bootstrap.ControlPlane; doc != nil {
		if err := json.Unmarshal(doc, &cfg); err != nil {
			return fmt.Errorf("decoding the control-plane bootstrap: %w", err)
		}
		etcd := cfg.EtcdVersion
		if etcd == "" {
			etcd = tools.Pinned().Etcd
		}
		facts.Versions.ControlPlane, facts.Versions.Etcd = cfg.Version, etcd
		bins = append(bins, "etcd-"+etcd)
		for _, name := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			bins = append(bins, name+"-"+cfg.Version)
		}
	}
	rec.Versions = facts.Versions
	if err := p.writeRecord(req.UID, rec); err != nil {
		return err
	}
	// The templates first: a broken one fails before anything is copied.
	steps, err := tmpls.Render(phaseProvision, facts)
	if err != nil {
		return err
	}
	if err := p.copyBinaries(ctx, c, bins); err != nil {
		return err
	}
	if err := p.writeBundle(ctx, c, req); err != nil {
		return err
	}
	for _, s := range steps {
		if err := p.runStep(ctx, c, req.UID, rec, s); err != nil {
			return err
		}
	}
	return p.waitAgent(ctx, c)
}

// writeBundle puts the bootstrap bundle in the sandbox, mode 0600: it
// holds a token, and on a control-plane machine the cluster's CA keys.
func (p *Provider) writeBundle(ctx context.Context, c *conn, req *provider.Request) error {
	capacity, err := hostCapacity(ctx, c)
	if err != nil {
		return err
	}
	var runtimeVersion string
	if rt := req.Machine.ContainerRuntime; rt.Name != "" {
		v := rt.Version
		if v == "" {
			v = "unknown"
		}
		runtimeVersion = rt.Name + "://" + v
	}
	b := &sandbox.Bootstrap{
		Server:                  req.Bootstrap.Server,
		CAPEM:                   string(req.Bootstrap.CAData),
		Token:                   req.Bootstrap.Token,
		NodeName:                req.Name,
		ProviderID:              ProviderID(req.UID),
		Address:                 c.host.Address,
		Labels:                  req.Machine.Labels,
		Taints:                  req.Machine.Taints,
		Annotations:             req.NodeAnnotations,
		Capacity:                capacity,
		KubeletVersion:          string(req.Machine.Versions.Kubelet),
		ContainerRuntimeVersion: runtimeVersion,
	}
	if _, err := c.output(ctx, fmt.Sprintf("mkdir -p %[1]s && chmod 0700 %[1]s", sandboxDir)); err != nil {
		return err
	}
	if doc := req.Bootstrap.ControlPlane; doc != nil {
		b.BinDir = binDir
		if err := c.upload(ctx, sandboxDir+"/"+sandbox.ControlPlaneFile, 0o600, strings.NewReader(string(doc))); err != nil {
			return err
		}
	}
	if kc := req.KubeletConfig; kc != nil {
		b.KubeletConfigName = kc.Name
		if err := c.upload(ctx, sandboxDir+"/"+sandbox.KubeletConfigFile, 0o600, strings.NewReader(string(kc.Data))); err != nil {
			return err
		}
	}
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	return c.upload(ctx, sandboxDir+"/"+sandbox.BootstrapFile, 0o600, strings.NewReader(string(data)))
}

// hostCapacity is the host's CPUs and memory, as its Node reports them.
func hostCapacity(ctx context.Context, c *conn) (corev1.ResourceList, error) {
	out, err := c.output(ctx, `nproc; awk '/^MemTotal:/ {print $2}' /proc/meminfo`)
	if err != nil {
		return nil, err
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		return nil, fmt.Errorf("host %s: reading its CPUs and memory gave %q", c.host.target(), out)
	}
	cpus, err1 := strconv.Atoi(f[0])
	memKiB, err2 := strconv.ParseInt(f[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("host %s: reading its CPUs and memory: %w", c.host.target(), err)
	}
	return corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(cpus), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(memKiB*1024, resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(110, resource.DecimalSI),
	}, nil
}

// binaryName is the name of a binary marina copies: the agent, or a
// component and its release version (kube-apiserver-v1.37.2). Versions
// come from a Machine's spec; the webhook checks their format, and this
// keeps one that got past it (an object stored before the check) out of
// a path here and a command on the host.
var binaryName = regexp.MustCompile(`^[a-z][a-z-]*(-v[0-9]+[.][0-9]+[.][0-9]+(-[0-9A-Za-z.-]+)?)?$`)

// copyBinaries copies the named binaries to the host's bin directory,
// those whose copy there differs (by SHA-256) only.
func (p *Provider) copyBinaries(ctx context.Context, c *conn, names []string) error {
	for _, name := range names {
		if !binaryName.MatchString(name) {
			return fmt.Errorf("refusing to copy binary %q: not a component and a release version like kube-apiserver-v1.37.2", name)
		}
		local := filepath.Join(p.opts.BinDir, name)
		if name == agentBinary {
			local = p.opts.AgentBinary
		}
		sum, err := localSum(local)
		if err != nil {
			return fmt.Errorf("the binary %s the machine needs: %w", name, err)
		}
		remote := binDir + "/" + name
		out, err := c.output(ctx, "sha256sum "+shellQuote(remote)+" 2>/dev/null | cut -c1-64; true")
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) == sum {
			continue
		}
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		err = c.upload(ctx, remote, 0o755, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// sums caches the SHA-256 of local binaries by path, size and time.
var sums sync.Map // string -> string

func localSum(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	key := fmt.Sprintf("%s|%d|%d", path, fi.Size(), fi.ModTime().UnixNano())
	if s, ok := sums.Load(key); ok {
		return s.(string), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	s := hex.EncodeToString(h.Sum(nil))
	sums.Store(key, s)
	return s, nil
}

// runStep runs one rendered step with bash on the host, its output
// appended to the host's provisioning log and, its last lines, recorded
// as the Machine's event. A step that fails is an error naming it, where
// it came from and how it ended, with its last lines.
func (p *Provider) runStep(ctx context.Context, c *conn, uid types.UID, rec *record, s Step) error {
	header := fmt.Sprintf("==== %s machine %s/%s step %s", time.Now().UTC().Format(time.RFC3339), rec.Namespace, rec.Name, s.Name)
	// The step runs in a process group of its own, recorded: a step whose
	// controller died (its SSH session closed; without a terminal nothing
	// signals the step) is killed before the next one runs, so that no
	// half-run step is left on the host.
	inner := fmt.Sprintf(`mkdir -p %[1]s
if [ -s %[2]s ]; then kill -KILL -- "-$(cat %[2]s)" 2>/dev/null; rm -f %[2]s; fi
set -o pipefail
{ echo %[3]s; setsid bash -c 'echo $$ > %[2]s; exec bash -s'; } 2>&1 | tee -a %[4]s
rc=$?
rm -f %[2]s
exit $rc`, logDir, stepPGIDFile, shellQuote(header), LogFile)
	_, out, err := c.run(ctx, "bash -c "+shellQuote(inner), strings.NewReader(s.Script))
	tail := lastLines(out, 10)
	if err != nil {
		msg := fmt.Sprintf("host %s: step %s (%s) failed: %v; last lines of its output (all of it in %s there):\n%s",
			c.host.target(), s.Name, s.Source, err, LogFile, tail)
		p.event(uid, rec, true, "ProvisioningStepFailed", "%s", msg)
		return errors.New(msg)
	}
	p.log(ctx, rec).Info("Ran provisioning step", "host", c.host.target(), "step", s.Name)
	p.event(uid, rec, false, "ProvisioningStep", "host %s: step %s done:\n%s", c.host.target(), s.Name, lastLines(out, 3))
	return nil
}

// waitAgent waits until the agent holds its lock.
func (p *Provider) waitAgent(ctx context.Context, c *conn) error {
	deadline := time.Now().Add(p.opts.AgentStartTimeout)
	for {
		running, err := agentRunning(ctx, c)
		if err != nil || running {
			return err
		}
		if time.Now().After(deadline) {
			tail, _ := c.output(ctx, "tail -n 10 "+sandboxDir+"/"+sandbox.LogFile+" 2>/dev/null; true")
			return fmt.Errorf("host %s: the agent did not take its lock within %s; last lines of %s/%s there:\n%s",
				c.host.target(), p.opts.AgentStartTimeout, sandboxDir, sandbox.LogFile, strings.TrimSpace(tail))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"marina.dev/marina/internal/bootstraptoken"
	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/kubeletconfig"
	"marina.dev/marina/internal/manifest"
	"marina.dev/marina/internal/nodeagent/sandbox"
)

// timing are the agent's periods; tests shorten them.
type timing struct {
	// leaseRenew is how often the Lease is renewed (the kubelet's 10s).
	leaseRenew time.Duration
	// leaseDuration is the Lease's leaseDurationSeconds (the kubelet's 40).
	leaseDuration int32
	// statusUpdate is how often the agent compares the Node's status with
	// its own and posts it when they differ (a controller set Ready to
	// Unknown during an outage, a new kubelet version); statusReport is how
	// often it posts it anyway, for the conditions' lastHeartbeatTime. The
	// kubelet's nodeStatusUpdateFrequency and nodeStatusReportFrequency:
	// the Lease is the liveness signal, a status write is not.
	statusUpdate, statusReport time.Duration
	// lockWait is how long a starting agent waits for a lock prober to let
	// go before concluding that another agent runs the sandbox.
	lockWait time.Duration
	// retryMax caps the backoff between failed registrations.
	retryMax time.Duration
	// versionsCheck is how often a control-plane machine's component
	// versions are read and, when they changed, reported.
	versionsCheck time.Duration
	// logCheck is how often the sandbox's logs are looked at, and logMax
	// the size past which one is cut (see keepLogs).
	logCheck time.Duration
	logMax   int64
}

var defaultTiming = timing{
	leaseRenew:    10 * time.Second,
	leaseDuration: 40,
	statusUpdate:  10 * time.Second,
	statusReport:  5 * time.Minute,
	lockWait:      2 * time.Second,
	retryMax:      30 * time.Second,
	versionsCheck: 2 * time.Second,
	logCheck:      10 * time.Second,
	logMax:        10 << 20,
}

// Run runs the node agent of the sandbox dir until ctx ends. It first takes
// the sandbox's agent lock and fails, with an error wrapping
// sandbox.ErrLocked, if another agent holds it. It returns nil when ctx
// ends: stopping leaves the Node and the Lease as they are, for the Node to
// go NotReady as a stopped kubelet's does.
func Run(ctx context.Context, dir string) error {
	return run(ctx, dir, defaultTiming)
}

func run(ctx context.Context, dir string, t timing) error {
	dir, lock, err := lockDir(dir, t, "the node agent of sandbox")
	if err != nil {
		return err
	}
	defer lock.Close()
	go keepLogs(ctx, t, func() []string {
		logs, _ := filepath.Glob(filepath.Join(dir, manifest.LogsDir, "*.log"))
		return append(logs, filepath.Join(dir, sandbox.LogFile))
	})

	b, err := sandbox.ReadBootstrap(dir)
	if err != nil {
		return err
	}
	cpConfig, err := readControlPlane(dir)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", dir, err)
	}
	if err := checkBootstrap(b, cpConfig != nil); err != nil {
		return fmt.Errorf("bootstrap of sandbox %s: %w", dir, err)
	}
	kubeletConfig, err := readKubeletConfig(dir, b)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", dir, err)
	}
	log := klog.FromContext(ctx).WithValues("node", b.NodeName)
	ctx, cancel := context.WithCancel(klog.NewContext(ctx, log))
	defer cancel()
	a := &agent{boot: b, dir: dir, stop: cancel, t: t, log: log, kubeletConfig: kubeletConfig, bootID: string(uuid.NewUUID())}
	a.kubelet.set(b.KubeletVersion)
	// What an upgrade set before a restart holds until the Node says
	// otherwise: the API server may not answer now.
	desired, err := sandbox.ReadVersions(dir)
	if err != nil {
		return err
	}
	if desired.Kubelet != "" {
		a.kubelet.set(desired.Kubelet)
	}
	if cpConfig != nil {
		// The components watch their certificates and configuration
		// through inotify too; a machine that may not raise the limits
		// (not root) runs with what the host gives.
		if err := ensureHostLimits(log); err != nil {
			log.Info("Could not raise the host's inotify limits; the control plane runs with the host's", "err", err)
		}
		if a.cp, a.cs, err = startControlPlane(ctx, dir, b, cpConfig); err != nil {
			return err
		}
		// Every component is stopped before the agent returns: none
		// outlives its machine's agent.
		defer func() { cancel(); <-a.cp.done }()
	} else {
		if a.cs, err = tlsBootstrap(ctx, dir, b); err != nil {
			if ctx.Err() != nil {
				return nil // stopped before it could join
			}
			return err
		}
		go keepNodeCertificate(ctx, dir, b, renewNodeCertificate(dir, b))
		if b.Real != nil {
			if a.real, err = startRealNode(ctx, dir, b, a.kubelet.get()); err != nil {
				return err
			}
			// The kubelet and containerd are stopped before the agent
			// returns; the containers live on, as on a node whose
			// kubelet restarts.
			defer func() { cancel(); <-a.real.done }()
		}
	}
	return a.run(ctx)
}

// keepLogs bounds the logs of a sandbox or pool until ctx ends (issue 25):
// its agent.log and each component's logs/<component>.log are cut once
// larger than logMax (10 MiB), looked at every logCheck (10 s), and the
// last logMax bytes before a cut are kept in <log>.1. A log takes at most
// 2*logMax on disk, plus what is written to it in one logCheck.
func keepLogs(ctx context.Context, t timing, paths func() []string) {
	if t.logCheck <= 0 {
		return
	}
	log := klog.FromContext(ctx)
	files.KeepLogs(ctx, t.logCheck, t.logMax, paths, func(path string, err error) {
		log.Error(err, "Cutting a log failed", "log", path)
	})
}

// lockDir takes the agent lock of dir (a sandbox or a pool), made
// absolute; what names it in the error.
func lockDir(dir string, t timing, what string) (string, *os.File, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", nil, fmt.Errorf("resolving %s %s: %w", what, dir, err)
	}
	lock, err := sandbox.Lock(dir, t.lockWait)
	if err != nil {
		return "", nil, fmt.Errorf("starting %s %s: %w", what, dir, err)
	}
	return dir, lock, nil
}

// checkBootstrap: a control-plane machine has no server or token, it runs
// its own API server and makes its own credential; a worker joins with a
// bootstrap token, whatever runs its control plane (a sandbox of an older
// marina holding a ServiceAccount token is refused; the provider's Start
// asks for a fresh bootstrap for it, see CheckCredential).
func checkBootstrap(b *sandbox.Bootstrap, controlPlane bool) error {
	var missing []error
	required := map[string]string{"nodeName": b.NodeName, "providerID": b.ProviderID, "address": b.Address}
	if !controlPlane {
		required["server"], required["token"] = b.Server, b.Token
		if b.Token != "" && !bootstraptoken.Is(b.Token) {
			missing = append(missing, errors.New("token is not a bootstrap token (<id>.<secret>)"))
		}
	}
	for name, v := range required {
		if v == "" {
			missing = append(missing, fmt.Errorf("%s is empty", name))
		}
	}
	return errors.Join(missing...)
}

// agent is one running node agent.
type agent struct {
	cs kubernetes.Interface
	// cp runs a control-plane machine's components; nil on a worker.
	cp *controlPlane
	// real runs a worker's real kubelet and runtime; nil when the agent
	// plays the kubelet.
	real *realNode
	boot *sandbox.Bootstrap
	// kubelet is the kubelet version reported: boot's, or the desired
	// versions' once an upgrade set it.
	kubelet kubelet
	// kubeletConfig is the configuration the machine was given; nil: the
	// kubelet's defaults.
	kubeletConfig *kubeletconfig.Config
	dir           string
	// bootID changes with every start of the agent, as a host's does at
	// boot: per agent, not per process, as a pool runs many.
	bootID string
	stop   context.CancelFunc
	t      timing
	log    klog.Logger
}

// sandboxGone stops the agent if its sandbox was removed under it (a
// provider that could not signal it, a test's temporary directory): an
// agent outliving its machine would keep a deleted Node alive.
func (a *agent) sandboxGone() bool {
	if _, err := os.Stat(filepath.Join(a.dir, sandbox.BootstrapFile)); errors.Is(err, fs.ErrNotExist) {
		a.log.Info("Sandbox removed, stopping node agent", "sandbox", a.dir)
		a.stop()
		return true
	}
	return false
}

func (a *agent) run(ctx context.Context) error {
	a.log.Info("Starting node agent", "server", a.boot.Server, "providerID", a.boot.ProviderID, "address", a.boot.Address)
	if a.real != nil {
		// The kubelet registers the Node, keeps its Lease and status and
		// runs its pods; the agent keeps the machine's network and
		// versions.
		var wg sync.WaitGroup
		wg.Go(func() { a.keepNetwork(ctx, a.cs) })
		wg.Go(func() { a.watchDesiredVersions(ctx) })
		wg.Wait()
		a.log.Info("Node agent stopped")
		return nil
	}
	// The Lease's owner reference needs the Node's UID: register first.
	node, err := a.registerUntilDone(ctx)
	if err != nil {
		if ctx.Err() != nil {
			a.log.Info("Node agent stopped before its node registered")
			return nil
		}
		return err
	}
	var wg sync.WaitGroup
	wg.Go(func() { a.keepLease(ctx, node) })
	wg.Go(func() { a.keepStatus(ctx) })
	wg.Go(func() { a.runPods(ctx) })
	wg.Go(func() { a.watchDesiredVersions(ctx) })
	if a.cp != nil {
		wg.Go(func() { a.keepVersions(ctx, node) })
	}
	wg.Wait()
	a.log.Info("Node agent stopped")
	return nil
}

// registerUntilDone registers the Node, retrying with backoff (the API
// server may not answer yet) until it succeeds or ctx ends.
func (a *agent) registerUntilDone(ctx context.Context) (node nodeRef, err error) {
	retryMax := a.t.retryMax
	if a.cp != nil {
		// The API server is this machine's own, starting beside the agent:
		// a refused loopback connection costs nothing, while each second
		// waited past its start delays the machine's Ready, which the next
		// control-plane machine waits for.
		retryMax = min(retryMax, 2*time.Second)
	}
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: retryMax}
	for {
		node, err = a.register(ctx)
		if err == nil {
			return node, nil
		}
		if ctx.Err() != nil || a.sandboxGone() {
			return nodeRef{}, context.Canceled
		}
		d := backoff.Step()
		a.log.Error(err, "Registering node failed, retrying", "after", d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nodeRef{}, ctx.Err()
		case <-time.After(d):
		}
	}
}

// every calls f every period (jittered by up to jitter*period) until ctx
// ends. It does not call f first.
func every(ctx context.Context, period time.Duration, jitter float64, f func(context.Context)) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait.Jitter(period, jitter)):
		}
		f(ctx)
	}
}

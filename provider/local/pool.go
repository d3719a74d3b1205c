package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/nodeagent"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/provider"
)

// Pooled workers (LocalMachine spec.agent: Pooled) run as members of their
// cluster's pool: one `marina node-agent --pool DIR` process per cluster
// under <root>/.pools/<namespace>_<cluster>. The sandbox records its pool in
// PoolFile at creation, so the mode of a machine never changes.
const (
	poolsDir = ".pools"
	// PoolFile, in a pooled machine's sandbox, holds its pool's directory.
	PoolFile = "pool"
)

// poolDirFor is the pool of req's cluster. Namespaces hold no "_", so the
// name is unambiguous.
func (p *Provider) poolDirFor(req *provider.Request) string {
	return filepath.Join(p.root, poolsDir, req.Namespace+"_"+req.Machine.ClusterName)
}

// poolOf returns the pool directory of a pooled sandbox, "" for a machine
// running as its own process.
func poolOf(dir string) (string, error) {
	data, err := os.ReadFile(filepath.Join(dir, PoolFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}

// startMember makes the pool run the agent of dir: it starts the pool if
// none runs, asks for a new start of the member, and waits until the
// member's agent holds its sandbox's lock, as startAgent waits for an agent
// process: a member that cannot start is an error Create returns, and the
// machine controller tries again.
func (p *Provider) startMember(ctx context.Context, uid types.UID, dir, poolDir string) error {
	unlock := p.lock(types.UID(poolsDir + "/" + filepath.Base(poolDir)))
	err := p.ensurePool(ctx, poolDir)
	if err == nil {
		gen := strconv.FormatInt(time.Now().UnixNano(), 10)
		err = nodeagent.WriteMember(poolDir, string(uid), nodeagent.Member{Sandbox: dir, Generation: gen})
	}
	unlock()
	if err != nil {
		return err
	}
	logPath := filepath.Join(dir, sandbox.LogFile)
	deadline := time.Now().Add(p.opts.AgentStartTimeout)
	for {
		held, err := sandbox.Held(dir)
		if err != nil || held {
			return err
		}
		if running, err := sandbox.Held(poolDir); err == nil && !running {
			return fmt.Errorf("the agent pool %s stopped; last lines of %s:\n%s", poolDir, filepath.Join(poolDir, sandbox.LogFile), files.Tail(filepath.Join(poolDir, sandbox.LogFile), 10))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the pool did not start the agent within %s; last lines of %s:\n%s", p.opts.AgentStartTimeout, logPath, files.Tail(logPath, 10))
		}
		select {
		case <-ctx.Done():
			return ctx.Err() // the member may still come up: the next Create finds it
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// ensurePool starts the pool process of poolDir unless it runs.
func (p *Provider) ensurePool(ctx context.Context, poolDir string) error {
	if err := os.MkdirAll(filepath.Join(poolDir, nodeagent.PoolMembersDir), 0o700); err != nil {
		return err
	}
	running, err := sandbox.Held(poolDir)
	if err != nil || running {
		return err
	}
	return p.startAgent(ctx, poolDir, poolFlag)
}

// stopMember stops the agent of a pooled sandbox: the pool ends it when its
// member file goes. The last member out stops the pool and removes it. The
// members of one pool stop in parallel: only the last step takes the
// pool's lock.
func (p *Provider) stopMember(ctx context.Context, uid types.UID, dir, poolDir string) error {
	if err := nodeagent.RemoveMember(poolDir, string(uid)); err != nil {
		return fmt.Errorf("removing the member %s from pool %s: %w", uid, poolDir, err)
	}
	released, err := waitReleased(ctx, dir, p.opts.AgentStopTimeout)
	if err != nil {
		return err
	}
	if !released {
		// Killing the pool would take the other machines with it.
		return fmt.Errorf("the pool %s did not stop the agent of %s within %s; see %s", poolDir, dir, p.opts.AgentStopTimeout, filepath.Join(poolDir, sandbox.LogFile))
	}
	// Whether the pool is still needed is decided under its lock, which
	// startMember holds while it adds a member.
	defer p.lock(types.UID(poolsDir + "/" + filepath.Base(poolDir)))()
	members, err := nodeagent.Members(poolDir)
	if err != nil || len(members) > 0 {
		return err
	}
	if err := p.stopAgent(ctx, poolDir); err != nil {
		return err
	}
	return os.RemoveAll(poolDir)
}

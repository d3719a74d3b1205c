package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/nodeagent/sandbox"
)

// A pool is one process running the agents of many worker sandboxes of one
// cluster (issue: scale): a thousand simulated workers cost tens of MiB
// each as processes, and a fraction of that as goroutines. Each member
// keeps what a single agent has: its own sandbox, lock, credential, Node,
// Lease and log. The provider adds a member by writing a file in the
// pool's members directory and stops it by removing the file; the pool
// never restarts a member on its own (a member whose agent ended waits for
// the provider to write its file again, as a dead agent process waits for
// the provider to start it).
const (
	// PoolMembersDir, in the pool's directory, holds one file per member,
	// named by the machine's UID: MemberFile's content.
	PoolMembersDir = "members"
	// poolScan is how often the pool looks at its members; a Create waits
	// for the next look.
	poolScan = 100 * time.Millisecond
)

// Member is what a member file holds: the member's sandbox, and the
// generation of the start the provider asked for. A new generation starts
// an agent that ended; the same generation never does.
type Member struct {
	Sandbox    string
	Generation string
}

// WriteMember asks the pool in poolDir to run the agent of sandbox uid.
func WriteMember(poolDir, uid string, m Member) error {
	dir := filepath.Join(poolDir, PoolMembersDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return files.WriteAtomic(filepath.Join(dir, uid), []byte(m.Sandbox+"\n"+m.Generation+"\n"), 0o600)
}

// RemoveMember asks the pool to stop the agent of uid; nil when it is not a
// member.
func RemoveMember(poolDir, uid string) error {
	err := os.Remove(filepath.Join(poolDir, PoolMembersDir, uid))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// Members lists the UIDs of the pool's members.
func Members(poolDir string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(poolDir, PoolMembersDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var uids []string
	for _, e := range entries {
		if !e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			uids = append(uids, e.Name())
		}
	}
	return uids, nil
}

func readMember(path string) (Member, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Member{}, err
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 2 || !filepath.IsAbs(lines[0]) {
		return Member{}, fmt.Errorf("member file %s is not a sandbox path and a generation", path)
	}
	return Member{Sandbox: lines[0], Generation: lines[1]}, nil
}

// RunPool runs the pool of dir until ctx ends, then stops every member and
// waits for them. It holds dir's agent lock while it runs, so that the
// provider sees whether the pool is up as it sees an agent.
func RunPool(ctx context.Context, dir string) error {
	return runPool(ctx, dir, defaultTiming)
}

func runPool(ctx context.Context, dir string, t timing) error {
	dir, lock, err := lockDir(dir, t, "the agent pool")
	if err != nil {
		return err
	}
	defer lock.Close()
	log := klog.FromContext(ctx).WithValues("pool", dir)
	log.Info("Starting agent pool")
	go keepLogs(ctx, t, func() []string { return []string{filepath.Join(dir, sandbox.LogFile)} })
	p := &pool{dir: dir, t: t, log: log, running: map[string]*member{}}
	defer p.stopAll()
	members := modWatch{path: filepath.Join(dir, PoolMembersDir)}
	for {
		if members.changed() {
			if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
				// Removed under it (a state directory deleted by hand):
				// nobody would stop it, and its members' agents would
				// keep their Nodes alive.
				log.Info("Agent pool directory removed, stopping", "members", len(p.running))
				return nil
			}
			p.scan(ctx)
		}
		select {
		case <-ctx.Done():
			log.Info("Stopping agent pool", "members", len(p.running))
			return nil
		case <-time.After(poolScan):
		}
	}
}

type pool struct {
	dir string
	t   timing
	log klog.Logger
	// running holds the members whose agent was started, by UID; done is
	// closed when the agent has ended.
	running map[string]*member
	wg      sync.WaitGroup
}

type member struct {
	generation string
	cancel     context.CancelFunc
	done       chan struct{}
}

// scan starts the members asked for with a generation not started yet, and
// stops the members whose file is gone.
func (p *pool) scan(ctx context.Context) {
	uids, err := Members(p.dir)
	if err != nil {
		p.log.Error(err, "Listing pool members")
		return
	}
	want := map[string]bool{}
	for _, uid := range uids {
		want[uid] = true
		r, known := p.running[uid]
		if known && !r.ended() {
			// Running: nothing in its file can change that (a new
			// generation starts only an agent that ended), so it is not
			// read, as a scan comes every 100 ms while the directory
			// changes and a pool has hundreds of members.
			continue
		}
		m, err := readMember(filepath.Join(p.dir, PoolMembersDir, uid))
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				p.log.Error(err, "Reading pool member", "uid", uid)
			}
			continue
		}
		if known && r.generation == m.Generation {
			continue // ended; waits for a new start
		}
		p.start(ctx, uid, m)
	}
	for uid, r := range p.running {
		if !want[uid] {
			r.cancel()
			<-r.done
			delete(p.running, uid)
		}
	}
}

// start runs the member's agent, logging to its sandbox's agent.log as a
// single agent process does.
func (p *pool) start(ctx context.Context, uid string, m Member) {
	logFile, err := os.OpenFile(filepath.Join(m.Sandbox, sandbox.LogFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		p.log.Error(err, "Opening a member's log", "uid", uid)
		return
	}
	fmt.Fprintf(logFile, "==== %s: starting the node agent in pool %s\n", time.Now().UTC().Format(time.RFC3339), p.dir)
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logFile)))
	mctx, cancel := context.WithCancel(klog.NewContext(ctx, log))
	r := &member{generation: m.Generation, cancel: cancel, done: make(chan struct{})}
	p.running[uid] = r
	p.wg.Go(func() {
		defer close(r.done)
		defer logFile.Close()
		if err := run(mctx, m.Sandbox, p.t); err != nil {
			log.Error(err, "Node agent ended")
			p.log.Info("A member's agent ended", "uid", uid, "err", err.Error())
		}
	})
}

func (r *member) ended() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (p *pool) stopAll() {
	for _, r := range p.running {
		r.cancel()
	}
	p.wg.Wait()
}

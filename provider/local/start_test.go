package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"

	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/provider"
)

// Issue 25: a stopped machine is started again from its sandbox, the same
// machine; a worker whose credential does not work asks for a fresh one
// instead of starting an agent that cannot join.
func TestStartResumesAStoppedMachine(t *testing.T) {
	ctx := t.Context()
	p := newProvider(t)
	req := request("worker-0")
	made, err := p.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	dir := p.sandboxDir(req.UID)

	t.Log("running: Start leaves it as it is")
	pid, err := p.AgentPID(req.UID)
	if err != nil {
		t.Fatal(err)
	}
	if inst, err := p.Start(ctx, req.UID, nil); err != nil || inst.State != provider.InstanceRunning {
		t.Fatalf("Start of a running machine = %v, %v; want Running", inst, err)
	}
	if now, _ := p.AgentPID(req.UID); now != pid {
		t.Errorf("Start of a running machine changed its agent from %d to %d", pid, now)
	}

	var mu sync.Mutex
	changed := map[types.UID]int{}
	go p.WatchStates(ctx, func(uid types.UID) { mu.Lock(); changed[uid]++; mu.Unlock() })
	time.Sleep(100 * time.Millisecond) // the watcher's first look: it learns the states
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the watcher to name the killed machine", func() error {
		mu.Lock()
		defer mu.Unlock()
		if changed[req.UID] == 0 {
			return errNotYet
		}
		return nil
	})
	if inst, err := p.Get(ctx, req.UID); err != nil || inst.State != provider.InstanceStopped {
		t.Fatalf("Get after the kill = %v, %v; want Stopped", inst, err)
	}

	t.Log("its token is no credential it can start with: Start asks for a fresh one")
	if _, err := p.Start(ctx, req.UID, nil); !provider.IsBootstrapNeeded(err) {
		t.Fatalf("Start with a worker's unusable token: %v, want a BootstrapNeededError", err)
	}
	if n := agentsOf(dir); n != 0 {
		t.Fatalf("%d agents after a refused start, want 0", n)
	}

	inst, err := p.Start(ctx, req.UID, &provider.Bootstrap{Server: "https://127.0.0.1:1", Token: "fresht.0123456789abcdef"})
	if err != nil {
		t.Fatal(err)
	}
	if inst.State != provider.InstanceRunning || inst.ProviderID != made.ProviderID || inst.Addresses[0] != made.Addresses[0] {
		t.Errorf("started: %+v, want Running with the identity it was made with, %+v", inst, made)
	}
	if n := agentsOf(dir); n != 1 {
		t.Errorf("%d agents after Start, want 1", n)
	}
	b, err := sandbox.ReadBootstrap(dir)
	if err != nil {
		t.Fatal(err)
	}
	if b.Token != "fresht.0123456789abcdef" || b.NodeName != req.Name {
		t.Errorf("bootstrap after Start: token %q, node %q; want the fresh token and the same node", b.Token, b.NodeName)
	}

	if _, err := p.Start(ctx, uuid.NewUUID(), nil); !provider.IsNotFound(err) {
		t.Errorf("Start of a machine never made: %v, want NotFound", err)
	}
}

// A pool killed with all its members (a power cut) is started again by
// its first member's Start, and every member resumes, each once.
func TestStartResumesAKilledPool(t *testing.T) {
	ctx := t.Context()
	p := newProvider(t)
	var reqs []*provider.Request
	for _, name := range []string{"pooled-0", "pooled-1", "pooled-2"} {
		req := request(name)
		req.ProviderSpec = []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","agent":"Pooled"}}`)
		if _, err := p.Create(ctx, req); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, req)
	}
	poolPID, err := p.AgentPID(reqs[0].UID)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(poolPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "every member stopped", func() error {
		for _, req := range reqs {
			if inst, err := p.Get(ctx, req.UID); err != nil || inst.State != provider.InstanceStopped {
				return errNotYet
			}
		}
		return nil
	})
	boot := &provider.Bootstrap{Server: "https://127.0.0.1:1", Token: "fresht.0123456789abcdef"}
	for _, req := range reqs {
		if inst, err := p.Start(ctx, req.UID, boot); err != nil || inst.State != provider.InstanceRunning {
			t.Fatalf("Start %s = %v, %v", req.Name, inst, err)
		}
	}
	poolDir := filepath.Join(p.root, poolsDir, "default_minimal")
	if n := agentsOf(poolDir); n != 1 {
		t.Errorf("%d pool processes, want 1", n)
	}
	for _, req := range reqs {
		log, _ := os.ReadFile(filepath.Join(p.sandboxDir(req.UID), sandbox.LogFile))
		if starts := countStarts(string(log)); starts != 2 {
			t.Errorf("%s's agent started %d times in all, want 2 (made, resumed)", req.Name, starts)
		}
	}
}

var errNotYet = errorString("not yet")

type errorString string

func (e errorString) Error() string { return string(e) }

// countStarts counts the starts an agent.log records.
func countStarts(log string) int {
	return strings.Count(log, ": starting the node agent")
}

// Issue 25: a pool whose directory is removed under it (a state directory
// deleted by hand) exits, stopping its members, rather than keep their
// Nodes alive with nothing left to stop it.
func TestPoolExitsWhenItsDirectoryGoes(t *testing.T) {
	ctx := t.Context()
	p := newProvider(t)
	req := request("pooled-0")
	req.ProviderSpec = []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","agent":"Pooled"}}`)
	if _, err := p.Create(ctx, req); err != nil {
		t.Fatal(err)
	}
	poolPID, err := p.AgentPID(req.UID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(poolPID, syscall.SIGKILL) })
	if err := os.RemoveAll(filepath.Join(p.root, poolsDir)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the pool to exit", func() error {
		if err := syscall.Kill(poolPID, 0); !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("pool %d still there (%v)", poolPID, err)
		}
		return nil
	})
	if held, _ := sandbox.Held(p.sandboxDir(req.UID)); held {
		t.Error("the member's lock is still held")
	}
}

package local

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"marina.dev/marina/internal/nodeagent/sandbox"
)

// Two management planes over one root (a move's source and target on one
// host): each lists, for its orphan sweep, only the sandboxes and
// endpoints it manages; the target's first Get of a machine takes it over,
// and from then on the source no longer lists it, so neither plane removes
// the other's machines as orphans.
func TestPlanesSharingARootListOnlyWhatTheyManage(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	newPlane := func(id string) *Provider {
		p, err := New(Options{Root: root, AgentCommand: agentCommand, Plane: id})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	source, target := newPlane("source"), newPlane("target")
	machine := types.UID("7b0d1a52-0000-4000-8000-000000000001")
	dir := source.sandboxDir(machine)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := sandbox.WriteBootstrap(dir, &sandbox.Bootstrap{NodeName: "m1", Address: "127.0.10.2"}); err != nil {
		t.Fatal(err)
	}
	endpoint := types.UID("7b0d1a52-0000-4000-8000-000000000002")
	if err := os.MkdirAll(source.endpointDir(endpoint), 0o700); err != nil {
		t.Fatal(err)
	}

	lists := func(p *Provider) (machines, endpoints []types.UID) {
		t.Helper()
		machines, err := p.MachineUIDs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		endpoints, err = p.ClusterEndpoints(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return machines, endpoints
	}
	check := func(when string, p *Provider, wantMachine, wantEndpoint bool) {
		t.Helper()
		m, e := lists(p)
		if slices.Contains(m, machine) != wantMachine || slices.Contains(e, endpoint) != wantEndpoint {
			t.Errorf("%s: plane %s lists machines %v, endpoints %v; want the machine %v, the endpoint %v", when, p.opts.Plane, m, e, wantMachine, wantEndpoint)
		}
	}
	// Made by a marina without planes: nobody's until claimed.
	check("unclaimed", source, false, false)
	check("unclaimed", target, false, false)

	if _, err := source.Get(ctx, machine); err != nil {
		t.Fatal(err)
	}
	if err := source.claim(source.endpointDir(endpoint)); err != nil {
		t.Fatal(err)
	}
	check("claimed by the source", source, true, true)
	check("claimed by the source", target, false, false)

	if _, err := target.Get(ctx, machine); err != nil {
		t.Fatal(err)
	}
	if err := target.claim(target.endpointDir(endpoint)); err != nil {
		t.Fatal(err)
	}
	check("taken over", source, false, false)
	check("taken over", target, true, true)
	if info, err := os.Stat(filepath.Join(dir, ManagerFile)); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("manager file: %v, %v", info, err)
	}

	// A provider without a plane has the root to itself, as before.
	alone, err := New(Options{Root: root, AgentCommand: agentCommand})
	if err != nil {
		t.Fatal(err)
	}
	check("no plane", alone, true, true)
}

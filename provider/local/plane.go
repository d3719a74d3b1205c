package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"marina.dev/marina/internal/files"
)

// ManagerFile, in a sandbox or an endpoint directory, holds the id of the
// management plane that manages it (Options.Plane). Two management planes
// may share one root: a target of marina move on the same host runs over
// the source's sandboxes. Each lists as its own, for the safety
// controller's orphan sweep, only what it manages, so that neither removes
// the other's machines as orphans; a plane takes a machine or endpoint over
// when its controller first asks for it after the move (Get, Create,
// EnsureEndpoint), before the move deletes the source's objects.
const ManagerFile = "manager"

// claim records this plane as dir's manager, unless it is already.
func (p *Provider) claim(dir string) error {
	if p.opts.Plane == "" || p.manager(dir) == p.opts.Plane {
		return nil
	}
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("claiming %s: %w", dir, err)
	}
	return files.WriteAtomic(filepath.Join(dir, ManagerFile), []byte(p.opts.Plane+"\n"), 0o600)
}

// manager is the plane recorded in dir; "" when none is (a sandbox a
// marina without planes made, until its controller claims it).
func (p *Provider) manager(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, ManagerFile))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// manages reports whether this plane manages dir: always without a plane
// (one management plane per root, as before planes were recorded).
func (p *Provider) manages(dir string) bool {
	return p.opts.Plane == "" || p.manager(dir) == p.opts.Plane
}

// MachineUIDs implements provider.MachineLister: the machines that have a
// sandbox and that this plane manages.
func (p *Provider) MachineUIDs(context.Context) ([]types.UID, error) {
	uids, err := p.UIDs()
	if err != nil {
		return nil, err
	}
	mine := uids[:0]
	for _, uid := range uids {
		if p.manages(p.sandboxDir(uid)) {
			mine = append(mine, uid)
		}
	}
	return mine, nil
}

// ClusterEndpoints implements provider.EndpointLister: the endpoints this
// plane manages.
func (p *Provider) ClusterEndpoints(context.Context) ([]types.UID, error) {
	uids, err := p.EndpointUIDs()
	if err != nil {
		return nil, err
	}
	mine := uids[:0]
	for _, uid := range uids {
		if p.manages(p.endpointDir(uid)) {
			mine = append(mine, uid)
		}
	}
	return mine, nil
}

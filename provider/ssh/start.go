package ssh

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"marina.dev/marina/internal/nodeagent"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/provider"
)

var _ provider.Starter = (*Provider)(nil)

// Start implements provider.Starter: it starts the agent of a machine
// whose host rebooted without systemd, or whose agent was killed, with
// what the host holds (its sandbox: identity, certificates, etcd data),
// by running the provisioning steps again (the defaults check the host
// and start the agent). A worker whose credential no longer works is
// refused with a *BootstrapNeededError unless boot carries a fresh one.
func (p *Provider) Start(ctx context.Context, uid types.UID, boot *provider.Bootstrap) (*provider.Instance, error) {
	if err := checkUID(uid); err != nil {
		return nil, err
	}
	defer p.lock(uid)()
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
	if running, err := agentRunning(ctx, c); err != nil || running {
		return instance(uid, c.host, provider.InstanceRunning), err
	}
	// The bootstrap stays on the host and in memory here: it holds a token.
	out, err := c.output(ctx, "cat "+sandboxDir+"/"+sandbox.BootstrapFile)
	if err != nil {
		return nil, fmt.Errorf("machine %s/%s is not provisioned on its host: %w", rec.Namespace, rec.Name, err)
	}
	var b sandbox.Bootstrap
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		return nil, fmt.Errorf("host %s: decoding %s: %w", c.host.target(), sandbox.BootstrapFile, err)
	}
	switch {
	case boot != nil && boot.Token != "":
		if b.Server != boot.Server || b.CAPEM != string(boot.CAData) || b.Token != boot.Token {
			b.Server, b.CAPEM, b.Token = boot.Server, string(boot.CAData), boot.Token
			data, err := json.MarshalIndent(&b, "", "  ")
			if err != nil {
				return nil, err
			}
			if err := c.upload(ctx, sandboxDir+"/"+sandbox.BootstrapFile, 0o600, strings.NewReader(string(data))); err != nil {
				return nil, err
			}
		}
	case boot == nil && !rec.ControlPlane:
		if err := p.checkCredential(ctx, c, &b); err != nil {
			return nil, &provider.BootstrapNeededError{Reason: err.Error()}
		}
	}
	tmpls, err := p.templates(ctx, rec.Namespace, rec.Spec.TemplatesRef)
	if err != nil {
		return nil, err
	}
	facts := p.facts(uid, rec, c.host, b.Server)
	facts.Versions = rec.Versions
	steps, err := tmpls.Render(phaseProvision, facts)
	if err != nil {
		return nil, err
	}
	for _, s := range steps {
		if err := p.runStep(ctx, c, uid, rec, s); err != nil {
			return nil, err
		}
	}
	if err := p.waitAgent(ctx, c); err != nil {
		return nil, err
	}
	return instance(uid, c.host, provider.InstanceRunning), nil
}

// checkCredential says whether the worker can start with the credential
// it holds: its node certificate (not secret) is fetched into a private
// temporary directory for nodeagent.CheckCredential.
func (p *Provider) checkCredential(ctx context.Context, c *conn, b *sandbox.Bootstrap) error {
	dir, err := os.MkdirTemp("", "marina-ssh-credential-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cert, err := c.output(ctx, "cat "+sandboxDir+"/"+sandbox.NodeCertFile+" 2>/dev/null; true")
	if err != nil {
		return err
	}
	if cert != "" {
		if err := os.WriteFile(filepath.Join(dir, sandbox.NodeCertFile), []byte(cert), 0o600); err != nil {
			return err
		}
	}
	return nodeagent.CheckCredential(dir, b, time.Now())
}

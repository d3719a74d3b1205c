package ssh

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// A claim is the directory claimDir holding a file uid with the Machine's
// UID. It is made by renaming a complete temporary directory into place:
// rename(2) fails when the target is a non-empty directory, so of two
// controllers claiming one host at once exactly one wins, and a claim
// that exists always names its machine. Its release removes the file,
// then the directory with rmdir: a claimant that took the emptied
// directory in between keeps its claim.

func tmpClaim(uid types.UID) string { return HostDir + "/.claim-" + string(uid) }

// claimHolder is the UID of the machine holding the host, or "".
func claimHolder(ctx context.Context, c *conn) (types.UID, error) {
	out, err := c.output(ctx, "cat "+claimDir+"/uid 2>/dev/null || true")
	if err != nil {
		return "", err
	}
	return types.UID(strings.TrimSpace(out)), nil
}

// tryClaim claims the host for uid; it returns the holder, uid when the
// claim is (or already was) uid's.
func tryClaim(ctx context.Context, c *conn, uid types.UID) (types.UID, error) {
	tmp := tmpClaim(uid)
	script := fmt.Sprintf(`set -e
mkdir -p %[1]s
chmod 0755 %[1]s
if [ "$(cat %[2]s/uid 2>/dev/null)" = %[3]s ]; then echo %[3]s; exit 0; fi
rm -rf %[4]s
mkdir -m 0755 %[4]s
echo %[3]s > %[4]s/uid
sync %[4]s/uid 2>/dev/null || true
if mv -T %[4]s %[2]s 2>/dev/null; then echo %[3]s; exit 0; fi
rm -rf %[4]s
cat %[2]s/uid 2>/dev/null || echo unknown
`, HostDir, claimDir, string(uid), tmp)
	out, err := c.output(ctx, script)
	if err != nil {
		return "", fmt.Errorf("claiming: %w", err)
	}
	return types.UID(strings.TrimSpace(out)), nil
}

// release gives the host up, if uid holds it.
func release(ctx context.Context, c *conn, uid types.UID) error {
	script := fmt.Sprintf(`if [ "$(cat %[1]s/uid 2>/dev/null)" = %[2]s ]; then rm -f %[1]s/uid; rmdir %[1]s 2>/dev/null || true; fi
rm -rf %[3]s`, claimDir, string(uid), tmpClaim(uid))
	_, err := c.output(ctx, script)
	return err
}

// claim returns a connection to the host uid holds: the recorded one, else
// one of the candidates that already holds uid's claim (a crash between a
// claim and its record), else a free candidate it claims. Every host
// that cannot be used is named in the error, with why.
func (p *Provider) claim(ctx context.Context, uid types.UID, rec *record, candidates []Host, creds *Credentials) (*conn, error) {
	log := p.log(ctx, rec)
	if rec.Host != nil {
		c, err := dial(ctx, *rec.Host, creds)
		if err != nil {
			return nil, err // its host, unreachable: retried, never another host
		}
		holder, err := claimHolder(ctx, c)
		if err == nil && holder == uid {
			return c, nil
		}
		c.Close()
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("host %s no longer holds the claim of machine %s/%s (it holds %q): it was released outside marina; delete the Machine", rec.Host.target(), rec.Namespace, rec.Name, holder)
	}

	var problems []string
	free := map[string]bool{}
	for _, h := range mergeHosts(rec.Candidates, candidates) {
		c, err := dial(ctx, h, creds)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		holder, err := claimHolder(ctx, c)
		if err == nil && holder == uid {
			return p.recordHost(uid, rec, c)
		}
		c.Close()
		switch {
		case err != nil:
			problems = append(problems, err.Error())
		case holder != "":
			problems = append(problems, fmt.Sprintf("host %s is claimed by machine %s", h.target(), holder))
		default:
			free[h.target()] = true
		}
	}
	for _, h := range candidates {
		if !free[h.target()] {
			continue
		}
		c, err := dial(ctx, h, creds)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		// Recorded before the claim: a crash after it leaves a record that
		// names the one host Delete must look at.
		claiming := h
		rec.Claiming = &claiming
		if err := p.writeRecord(uid, rec); err != nil {
			c.Close()
			return nil, err
		}
		holder, err := tryClaim(ctx, c, uid)
		if err == nil && holder == uid {
			log.Info("Claimed host", "host", h.target())
			p.event(uid, rec, false, "HostClaimed", "claimed host %s", h.target())
			return p.recordHost(uid, rec, c)
		}
		c.Close()
		if err != nil {
			problems = append(problems, err.Error())
		} else {
			problems = append(problems, fmt.Sprintf("host %s was just claimed by machine %s", h.target(), holder))
		}
	}
	return nil, &NoFreeHostError{Machine: rec.Namespace + "/" + rec.Name, Problems: problems}
}

func (p *Provider) recordHost(uid types.UID, rec *record, c *conn) (*conn, error) {
	h := c.host
	rec.Host, rec.Claiming = &h, nil
	if err := p.writeRecord(uid, rec); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// NoFreeHostError says no candidate host could be claimed, and why for
// each.
type NoFreeHostError struct {
	Machine  string
	Problems []string
}

func (e *NoFreeHostError) Error() string {
	return fmt.Sprintf("no free host for machine %s: %s", e.Machine, strings.Join(e.Problems, "; "))
}

// IsNoFreeHost reports whether err is (or wraps) a *NoFreeHostError.
func IsNoFreeHost(err error) bool {
	var e *NoFreeHostError
	return errors.As(err, &e)
}

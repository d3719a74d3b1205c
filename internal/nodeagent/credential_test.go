package nodeagent

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"marina.dev/marina/internal/files"
	"marina.dev/marina/internal/nodeagent/sandbox"
	"marina.dev/marina/internal/pki"
)

// Issue 25: a worker restarted after a reboot reuses its credential while
// it lives another hour, and asks for a fresh one otherwise.
func TestCheckCredential(t *testing.T) {
	now := time.Now()
	jwt := func(exp time.Time) string {
		claims := fmt.Sprintf(`{"iat":%d,"exp":%d}`, now.Add(-time.Hour).Unix(), exp.Unix())
		return "e30." + base64.RawURLEncoding.EncodeToString([]byte(claims)) + ".sig"
	}
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.IssueAt(pki.CertSpec{CommonName: "system:node:w", Usage: pki.ClientAuth}, now)
	if err != nil {
		t.Fatal(err)
	}
	const bootstrapToken = "abcdef.0123456789abcdef"
	for _, tc := range []struct {
		name    string
		token   string
		cert    []byte
		cp      bool
		at      time.Time
		wantErr bool
	}{
		// A worker of an older marina, made with the shared ServiceAccount's
		// token: it has no identity of its own and is made again.
		{name: "a ServiceAccount token with a day left", token: jwt(now.Add(24 * time.Hour)), at: now, wantErr: true},
		{name: "a token of no known form", token: "opaque", cert: leaf.CertPEM(), at: now, wantErr: true},
		{name: "a bootstrap-token worker with its node certificate", token: bootstrapToken, cert: leaf.CertPEM(), at: now},
		{name: "a bootstrap-token worker whose certificate expires within the hour", token: bootstrapToken, cert: leaf.CertPEM(),
			at: leaf.Cert.NotAfter.Add(-30 * time.Minute), wantErr: true},
		{name: "a bootstrap-token worker that never joined", token: bootstrapToken, at: now, wantErr: true},
		{name: "a control-plane machine", cp: true, at: now},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.cert != nil {
				if err := files.WriteAtomic(filepath.Join(dir, sandbox.NodeCertFile), tc.cert, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tc.cp {
				if err := os.WriteFile(filepath.Join(dir, sandbox.ControlPlaneFile), []byte("{}"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err := CheckCredential(dir, &sandbox.Bootstrap{Token: tc.token}, tc.at)
			if (err != nil) != tc.wantErr {
				t.Errorf("CheckCredential = %v, want an error: %v", err, tc.wantErr)
			}
		})
	}
}

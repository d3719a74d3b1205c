package ownedflags

import (
	"os"
	"strings"
	"testing"
)

func TestOwned(t *testing.T) {
	for _, tc := range []struct {
		component, flag string
		want            Reason // "" means the user's to set
	}{
		// The attacks of issue 24, finding 1.
		{APIServer, "bind-address", Address},
		{APIServer, "authorization-mode", Authorization},
		{APIServer, "etcd-servers", Etcd},
		{APIServer, "etcd-prefix", Etcd},
		{ControllerManager, "cluster-signing-cert-file", Keys},
		{ControllerManager, "cluster-signing-key-file", Keys},
		// Paths and addresses no rule names are caught by their words.
		{APIServer, "audit-log-path", File},
		{APIServer, "audit-policy-file", File},
		{ControllerManager, "flex-volume-plugin-dir", File},
		{ControllerManager, "pv-recycler-pod-template-filepath-nfs", File},
		{APIServer, "service-node-port-range", Address},
		{APIServer, "service-account-jwks-uri", Keys},
		{Scheduler, "config", File},
		{Scheduler, "master", Cluster},
		{Scheduler, "leader-elect", Set},
		{ControllerManager, "controllers", Set},
		{APIServer, "version", Set},
		{APIServer, "enable-logs-handler", File},
		{Scheduler, "allow-metric-labels-manifest", File},
		// The components read '_' as '-' (component-base's cli.Run sets
		// WordSepNormalizeFunc): authorization_mode is authorization-mode.
		{APIServer, "authorization_mode", Authorization},
		{APIServer, "enable_admission_plugins", Authorization},
		{APIServer, "anonymous_auth", Authentication},
		{APIServer, "service_account_issuer", Keys},
		{ControllerManager, "cluster_signing_duration", Keys},
		{APIServer, "allow_privileged", Set},
		// A component without extraArgs owns every flag.
		{"etcd", "quota-backend-bytes", Set},
		{"kubelet", "v", Set},
		// Tuning stays the user's.
		{APIServer, "v", ""},
		{APIServer, "audit-log-maxage", ""},
		{APIServer, "feature-gates", ""},
		{APIServer, "runtime-config", ""},
		{APIServer, "max-requests-inflight", ""},
		{ControllerManager, "node-monitor-grace-period", ""},
		{ControllerManager, "concurrent-deployment-syncs", ""},
		{ControllerManager, "leader-elect-lease-duration", ""},
		{Scheduler, "profiling", ""},
		// "directives" is not the word "dir".
		{APIServer, "strict-transport-security-directives", ""},
	} {
		got, owned := Owned(tc.component, tc.flag)
		if got != tc.want || owned != (tc.want != "") {
			t.Errorf("Owned(%s, %s) = %q, %v; want %q", tc.component, tc.flag, got, owned, tc.want)
		}
	}
}

// docs/security.md states the list for operators: every rule and word of
// the code is there, so the two cannot drift apart.
func TestTheDocsStateTheList(t *testing.T) {
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	mentioned := func(s string) bool { return strings.Contains(string(doc), "`"+s+"`") }
	for _, c := range Components {
		for _, rs := range [][]rule{common, byComponent[c]} {
			for _, r := range rs {
				if !mentioned(r.pattern) {
					t.Errorf("docs/security.md does not list `%s` (%s)", r.pattern, c)
				}
			}
		}
	}
	for _, w := range append(append([]string(nil), fileWords...), addressWords...) {
		if !mentioned(w) {
			t.Errorf("docs/security.md does not list the word `%s`", w)
		}
	}
}

package ssh

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"marina.dev/marina/provider"
)

func TestDecodeNamesTheBadField(t *testing.T) {
	const head = `{"apiVersion":"ssh.marina.dev/v1alpha1","kind":"SSHMachine","spec":`
	for _, tc := range []struct {
		name, raw, field string
	}{
		{"ok inline", head + `{"hosts":[{"address":"10.0.0.1"}],"secretRef":{"name":"k"}}}`, ""},
		{"ok ref", head + `{"hostsRef":{"name":"h"},"hostSelector":{"role":"worker"},"secretRef":{"name":"k"},"templatesRef":{"name":"t"}}}`, ""},
		{"empty", ``, ""},
		{"other kind", `{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{}}`, "kind"},
		{"other version", `{"apiVersion":"ssh.marina.dev/v1","kind":"SSHMachine","spec":{}}`, "apiVersion"},
		{"no hosts", head + `{"secretRef":{"name":"k"}}}`, "spec.hosts"},
		{"both", head + `{"hosts":[{"address":"10.0.0.1"}],"hostsRef":{"name":"h"},"secretRef":{"name":"k"}}}`, "spec.hostsRef"},
		{"no secret", head + `{"hosts":[{"address":"10.0.0.1"}]}}`, "spec.secretRef.name"},
		{"bad secret name", head + `{"hosts":[{"address":"10.0.0.1"}],"secretRef":{"name":"Not_A_Name"}}}`, "spec.secretRef.name"},
		{"host name not IP", head + `{"hosts":[{"address":"server-1.lab"}],"secretRef":{"name":"k"}}}`, "spec.hosts[0].address"},
		{"bad port", head + `{"hosts":[{"address":"10.0.0.1","port":70000}],"secretRef":{"name":"k"}}}`, "spec.hosts[0].port"},
		{"twice", head + `{"hosts":[{"address":"10.0.0.1"},{"address":"10.0.0.1","port":22}],"secretRef":{"name":"k"}}}`, "spec.hosts[1]"},
		{"unknown field", head + `{"hosts":[{"address":"10.0.0.1"}],"secretRef":{"name":"k"},"password":"x"}}`, "spec.password"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Decode([]byte(tc.raw))
			if tc.field == "" && tc.name != "empty" {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				for _, h := range m.Spec.Hosts {
					if h.Port != 22 || h.User != "root" {
						t.Errorf("host %+v: want the defaults port 22, user root", h)
					}
				}
				return
			}
			var ise *provider.InvalidSpecError
			if !errors.As(err, &ise) {
				t.Fatalf("Decode = %v, want an InvalidSpecError", err)
			}
			if ise.Field != tc.field {
				t.Errorf("field %q, want %q (%v)", ise.Field, tc.field, err)
			}
		})
	}
}

func TestSelectedKeepsHostsWithEveryLabel(t *testing.T) {
	hosts := []Host{
		{Address: "10.0.0.1", Labels: map[string]string{"role": "control-plane"}},
		{Address: "10.0.0.2", Labels: map[string]string{"role": "worker", "rack": "a"}},
		{Address: "10.0.0.3", Labels: map[string]string{"role": "worker", "rack": "b"}},
	}
	for _, tc := range []struct {
		selector map[string]string
		want     string
	}{
		{nil, "10.0.0.1 10.0.0.2 10.0.0.3"},
		{map[string]string{"role": "worker"}, "10.0.0.2 10.0.0.3"},
		{map[string]string{"role": "worker", "rack": "b"}, "10.0.0.3"},
		{map[string]string{"role": "gpu"}, ""},
	} {
		var got []string
		for _, h := range selected(hosts, tc.selector) {
			got = append(got, h.Address)
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("selected(%v) = %v, want %s", tc.selector, got, tc.want)
		}
	}
}

func TestTemplatesRunInKeyOrderWithTheFacts(t *testing.T) {
	tm := &Templates{Source: "ConfigMap ns/t", Data: map[string]string{
		"provision-20-b.sh":   "echo {{.Role}} {{.Host.Address}}",
		"provision-10-a.sh":   "echo {{.Machine.Name}}",
		"deprovision-10-x.sh": "echo bye",
	}}
	steps, err := tm.Render(phaseProvision, &Facts{Machine: MachineFacts{Name: "m"}, Role: "worker", Host: Host{Address: "10.0.0.2"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 2 || steps[0].Name != "10-a" || steps[1].Name != "20-b" || steps[0].Script != "echo m" || steps[1].Script != "echo worker 10.0.0.2" {
		t.Errorf("steps = %+v", steps)
	}
	if !strings.Contains(steps[1].Source, "ConfigMap ns/t key provision-20-b.sh") {
		t.Errorf("source %q does not name the key", steps[1].Source)
	}

	for name, data := range map[string]map[string]string{
		"a key that is not a step":       {"install.sh": "echo"},
		"a template that does not parse": {"provision-10-a.sh": "echo {{.Role"},
		"an unknown fact":                {"provision-10-a.sh": "echo {{.Password}}"},
	} {
		if _, err := (&Templates{Source: "ConfigMap ns/t", Data: data}).Render(phaseProvision, &Facts{}); err == nil || !strings.Contains(err.Error(), "ConfigMap ns/t") {
			t.Errorf("%s: Render = %v, want an error naming the ConfigMap", name, err)
		}
	}
	// quote makes a value one shell word, whatever it holds.
	quoted, err := (&Templates{Source: "t", Data: map[string]string{"provision-10-a.sh": "printf %s {{quote .Machine.Name}}"}}).Render(phaseProvision, &Facts{Machine: MachineFacts{Name: "it's; $(id)"}})
	if err != nil || quoted[0].Script != `printf %s 'it'\''s; $(id)'` {
		t.Errorf("quote rendered %+v, %v", quoted, err)
	}
	// The defaults render for both roles and both phases.
	for _, role := range []string{"worker", "control-plane"} {
		for _, phase := range []string{phaseProvision, phaseDeprovision} {
			steps, err := DefaultTemplates().Render(phase, &Facts{Role: role})
			if err != nil || len(steps) == 0 {
				t.Errorf("default %s templates for a %s: %d steps, %v", phase, role, len(steps), err)
			}
		}
	}
}

// A binary name made of a version that got past admission (an object
// stored before the check) never reaches a path or a shell command.
func TestCopyBinariesRefusesWhatIsNotAComponentAndAVersion(t *testing.T) {
	for _, name := range []string{"etcd-v3.6.16;id", "kube-apiserver-v1.37.2/../../sh", "../marina", "kube-scheduler-$(id)"} {
		if err := (&Provider{}).copyBinaries(t.Context(), nil, []string{name}); err == nil || !strings.Contains(err.Error(), "refusing to copy binary") {
			t.Errorf("copyBinaries(%q) = %v, want a refusal", name, err)
		}
	}
	for _, name := range []string{"marina", "etcd-v3.6.16", "kube-apiserver-v1.38.0-rc.1"} {
		if !binaryName.MatchString(name) {
			t.Errorf("%q is a binary marina copies, refused", name)
		}
	}
}

// marina move copies the ConfigMaps an SSHMachine spec names with the
// machines (issue 36, finding 4) and refuses to move SSH machines at all.
func TestMovingNamesTheConfigMapsOfTheSpec(t *testing.T) {
	refs := Moving.References(map[string]any{"hostsRef": map[string]any{"name": "rack-a"}, "templatesRef": map[string]any{"name": "prov"}, "secretRef": map[string]any{"name": "keys"}})
	want := []provider.ObjectRef{{Kind: "ConfigMap", Name: "rack-a"}, {Kind: "ConfigMap", Name: "prov"}}
	if !slices.Equal(refs, want) {
		t.Errorf("References = %v, want %v", refs, want)
	}
	if Moving.Refusal == "" {
		t.Error("SSH machines may move, although their records stay on the source plane")
	}
}

package ssh

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"
	"text/template"
)

//go:embed templates/*.sh
var defaultTemplates embed.FS

// Phases of provisioning templates: the prefix of their keys.
const (
	phaseProvision   = "provision"
	phaseDeprovision = "deprovision"
)

// stepKey is a template's key: <phase>-<NN>-<step>.sh.
var stepKey = regexp.MustCompile(`^(provision|deprovision)-([0-9]{2})-([a-z0-9][a-z0-9-]*)\.sh$`)

// Step is one rendered provisioning script.
type Step struct {
	// Name is the step's name, e.g. "20-start-agent".
	Name string
	// Source says where it came from, e.g. "ConfigMap default/prov key
	// provision-20-start-agent.sh".
	Source string
	// Script is the rendered script, run by bash on the host.
	Script string
}

// Templates are the provisioning templates of a machine, by key.
type Templates struct {
	// Source names them: "the defaults" or "ConfigMap ns/name".
	Source string
	Data   map[string]string
}

// DefaultTemplates are the templates shipped with marina.
func DefaultTemplates() *Templates {
	t := &Templates{Source: "the default templates", Data: map[string]string{}}
	entries, _ := fs.ReadDir(defaultTemplates, "templates")
	for _, e := range entries {
		data, _ := fs.ReadFile(defaultTemplates, "templates/"+e.Name())
		t.Data[e.Name()] = string(data)
	}
	return t
}

// Check refuses keys that are not steps, and templates that do not parse.
func (t *Templates) Check() error {
	for key, text := range t.Data {
		if !stepKey.MatchString(key) {
			return fmt.Errorf("%s: key %q is not a step: name steps provision-NN-name.sh or deprovision-NN-name.sh (NN orders them)", t.Source, key)
		}
		if _, err := parse(key, text); err != nil {
			return fmt.Errorf("%s: key %s does not parse: %w", t.Source, key, err)
		}
	}
	return nil
}

// phase is the templates of phase, by key.
func (t *Templates) phase(phase string) map[string]string {
	out := map[string]string{}
	for key, text := range t.Data {
		if m := stepKey.FindStringSubmatch(key); m != nil && m[1] == phase {
			out[key] = text
		}
	}
	return out
}

// Render renders the steps of phase with facts, in key order.
func (t *Templates) Render(phase string, facts *Facts) ([]Step, error) {
	if err := t.Check(); err != nil {
		return nil, err
	}
	var keys []string
	for key := range t.Data {
		if m := stepKey.FindStringSubmatch(key); m != nil && m[1] == phase {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	steps := make([]Step, 0, len(keys))
	for _, key := range keys {
		tmpl := template.Must(parse(key, t.Data[key]))
		var b bytes.Buffer
		if err := tmpl.Execute(&b, facts); err != nil {
			return nil, fmt.Errorf("%s: rendering key %s: %w", t.Source, key, err)
		}
		m := stepKey.FindStringSubmatch(key)
		steps = append(steps, Step{Name: m[2] + "-" + m[3], Source: t.Source + " key " + key, Script: b.String()})
	}
	return steps, nil
}

// parse parses a template with the function quote, which makes a value one
// word of a POSIX shell: {{quote .SandboxDir}}. marina's own values are
// checked (paths it makes, DNS names, an IP address, release versions),
// and a template quotes them all the same.
func parse(key, text string) (*template.Template, error) {
	return template.New(key).Option("missingkey=error").Funcs(template.FuncMap{"quote": shellQuote}).Parse(text)
}

// Facts are what templates are rendered with.
type Facts struct {
	Machine MachineFacts
	// Role is control-plane or worker.
	Role string
	// Host is the claimed host.
	Host Host
	// Dir is marina's directory on the host, /var/lib/marina.
	Dir string
	// SandboxDir holds the machine's agent files: BootstrapFile, and on a
	// control-plane machine ControlPlaneFile, its certificates and etcd's
	// data.
	SandboxDir string
	// BinDir holds the agent (marina) and the component binaries.
	BinDir string
	// LogDir holds the provisioning log, kept after the machine goes.
	LogDir string
	// AgentCommand starts the node agent, as one shell-ready line.
	AgentCommand string
	// BootstrapFile and ControlPlaneFile are the bootstrap bundle's paths
	// (mode 0600; the second only on a control-plane machine).
	BootstrapFile, ControlPlaneFile string
	// Server is the control-plane endpoint the machine joins.
	Server string
	// Versions are the components' versions.
	Versions VersionFacts
	// MinFreeKiB is the room the machine needs under Dir.
	MinFreeKiB int64
}

// MachineFacts name the Machine.
type MachineFacts struct{ Namespace, Name, UID string }

// VersionFacts are the versions the machine runs.
type VersionFacts struct {
	Kubelet string
	// ControlPlane and Etcd are empty on a worker.
	ControlPlane, Etcd string
}

// String is the step's name, for logs.
func (s Step) String() string { return strings.TrimSpace(s.Name) }

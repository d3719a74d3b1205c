// Package manifest is the format of a component manifest on a machine: the
// desired state of one process (etcd, kube-apiserver, ...) in a sandbox
// directory. The control-plane bootstrap (internal/bootstrap) writes
// manifests and the node agent's supervisor (internal/nodeagent/components)
// runs them; this package sits below both, so neither imports the other for
// it (issue 22).
package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"marina.dev/marina/internal/files"
)

// Directories of a sandbox that manifests, logs and statuses live in.
const (
	// Dir holds one Manifest per component, <component>.json.
	Dir = "manifests"
	// LogsDir receives each component's output, <component>.log.
	LogsDir = "logs"
	// StatusDir holds one Status per component, <component>.json.
	StatusDir = "status"
)

// Manifest is the desired state of one component on one machine.
type Manifest struct {
	// Version is the version of the component this manifest runs, e.g.
	// v1.37.2; reported in Status.Version. It is what was asked, not what
	// the binary says it is.
	Version string `json:"version"`
	// Binary is the absolute path of the program.
	Binary string `json:"binary"`
	// Args are the program's arguments. Secrets must not be passed here:
	// name key and token files by path instead.
	Args []string `json:"args,omitempty"`
	// Env is added to the component's minimal environment (PATH, HOME).
	Env map[string]string `json:"env,omitempty"`
	// NetNS, when set, is the network namespace file (/run/netns/<name>)
	// the component runs in: a real kubelet's machine's own.
	NetNS string `json:"netns,omitempty"`
}

// namePattern is what a component may be called: a DNS label, so that the
// name is a safe file name and reads well in a Node's status.
var namePattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// ValidName reports whether name can name a component.
func ValidName(name string) error {
	if !namePattern.MatchString(name) {
		return fmt.Errorf("component name %q is not a DNS label (lower-case letters, digits and '-', at most 63)", name)
	}
	return nil
}

// Validate says what is wrong with m, if anything.
func (m *Manifest) Validate() error {
	var errs []error
	if m.Version == "" {
		errs = append(errs, errors.New("version is empty"))
	}
	if !filepath.IsAbs(m.Binary) {
		errs = append(errs, fmt.Errorf("binary %q is not an absolute path", m.Binary))
	}
	if m.NetNS != "" && !filepath.IsAbs(m.NetNS) {
		errs = append(errs, fmt.Errorf("netns %q is not an absolute path", m.NetNS))
	}
	for k := range m.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			errs = append(errs, fmt.Errorf("environment variable name %q is invalid", k))
		}
	}
	return errors.Join(errs...)
}

// Environ is m.Env as KEY=value entries, sorted so that the same manifest
// always gives the same environment.
func (m *Manifest) Environ() []string {
	env := make([]string, 0, len(m.Env))
	for k, v := range m.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return env
}

// Path is where the manifest of component name lives in sandbox dir.
func Path(dir, name string) string {
	return filepath.Join(dir, Dir, name+".json")
}

// LogPath is where the output of component name goes in sandbox dir.
func LogPath(dir, name string) string { return filepath.Join(dir, LogsDir, name+".log") }

// StatusPath is where the status of component name lives in sandbox dir.
func StatusPath(dir, name string) string { return filepath.Join(dir, StatusDir, name+".json") }

// Write writes the manifest of component name into sandbox dir
// atomically (a running Supervisor sees the old manifest or the new one,
// never a part), readable by its owner only.
func Write(dir, name string, m *Manifest) error {
	if err := ValidName(name); err != nil {
		return err
	}
	if err := m.Validate(); err != nil {
		return fmt.Errorf("manifest of %s: %w", name, err)
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the manifest of %s: %w", name, err)
	}
	if err := os.MkdirAll(filepath.Join(dir, Dir), 0o700); err != nil {
		return fmt.Errorf("writing the manifest of %s: %w", name, err)
	}
	return files.WriteAtomic(Path(dir, name), append(data, '\n'), 0o600)
}

// Remove removes the manifest of component name from sandbox dir:
// a running Supervisor stops the component. Removing a missing manifest is
// not an error.
func Remove(dir, name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	if err := os.Remove(Path(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the manifest of %s: %w", name, err)
	}
	return files.SyncDir(filepath.Join(dir, Dir))
}

// File is one manifest as read from disk.
type File struct {
	// Manifest is nil when Err is set.
	Manifest *Manifest
	// Key is the canonical encoding: equal keys, same desired state.
	Key string
	// Err says why the file cannot be used.
	Err error
}

// decode parses and checks one manifest file. Unknown fields are
// errors: a misspelt field would otherwise silently run the wrong thing.
func decode(data []byte) File {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return File{Err: fmt.Errorf("decoding: %w", err)}
	}
	if dec.More() {
		return File{Err: errors.New("decoding: data after the manifest")}
	}
	if err := m.Validate(); err != nil {
		return File{Err: err}
	}
	key, err := json.Marshal(&m) // map keys sorted: a canonical form
	if err != nil {
		return File{Err: err}
	}
	return File{Manifest: &m, Key: string(key)}
}

// Read reads every <component>.json in dir/manifests. Files with
// other names (the temporary files of WriteAtomic among them) are not
// manifests; names that are not valid component names are returned in
// badNames. A missing directory holds no manifests.
func Read(dir string) (manifests map[string]File, badNames []string, err error) {
	entries, err := os.ReadDir(filepath.Join(dir, Dir))
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]File{}, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading the manifests directory: %w", err)
	}
	manifests = map[string]File{}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(e.Name(), ".") || e.IsDir() {
			continue
		}
		if ValidName(name) != nil {
			badNames = append(badNames, e.Name())
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, Dir, e.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since ReadDir
		}
		if err != nil {
			manifests[name] = File{Err: err}
			continue
		}
		manifests[name] = decode(data)
	}
	return manifests, badNames, nil
}

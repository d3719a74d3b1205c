package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/files"
)

// VersionsFile holds the versions the machine's components should run
// now, when they differ from those it was made with: an in-place upgrade
// (M12) rewrites it one component at a time, and the agent restarts just
// that component.
const VersionsFile = "versions.json"

// Versions is the content of VersionsFile. Empty fields keep the versions
// the machine was made with.
type Versions struct {
	Kubelet      string                      `json:"kubelet,omitempty"`
	ControlPlane clusterv1.ComponentVersions `json:"controlPlane,omitempty"`
	// Settings are the component settings by version, for the versions
	// an upgrade moved components to; a component at another version
	// runs the settings the machine was made with.
	Settings map[string]clusterv1.ControlPlaneComponents `json:"settings,omitempty"`
}

// ReadVersions reads dir's versions; a missing file is no override.
func ReadVersions(dir string) (Versions, error) {
	var v Versions
	data, err := os.ReadFile(filepath.Join(dir, VersionsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return v, nil
	}
	if err != nil {
		return v, fmt.Errorf("reading the versions of sandbox %s: %w", dir, err)
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return v, fmt.Errorf("decoding %s: %w", filepath.Join(dir, VersionsFile), err)
	}
	return v, nil
}

// WriteVersions writes v into dir atomically; it writes nothing when the
// file already says v, so that calling it again changes nothing.
func WriteVersions(dir string, v Versions) error {
	if have, err := ReadVersions(dir); err == nil && reflect.DeepEqual(have, v) {
		return nil
	}
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the versions: %w", err)
	}
	return files.WriteAtomic(filepath.Join(dir, VersionsFile), data, 0o600)
}

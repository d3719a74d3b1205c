package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"

	"marina.dev/marina/internal/desiredversions"
	"marina.dev/marina/internal/files"
)

// DesiredVersionsFile is the machine's own record of the versions its
// components should run, when they differ from those it was made with.
// Only the machine's agent writes it: it copies there the desired versions
// it read from its Node (annotation cluster.marina.dev/desired-versions)
// before it acts on them, so that an agent restarted while its API server
// is down (the one it was restarting, on a lone control-plane machine)
// starts the components at the versions it last applied. The management
// host never writes into a running machine.
const DesiredVersionsFile = "desired-versions.json"

// ReadVersions reads dir's desired versions; a missing file is no
// override.
func ReadVersions(dir string) (desiredversions.Versions, error) {
	var v desiredversions.Versions
	data, err := os.ReadFile(filepath.Join(dir, DesiredVersionsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return v, nil
	}
	if err != nil {
		return v, fmt.Errorf("reading the desired versions of sandbox %s: %w", dir, err)
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return v, fmt.Errorf("decoding %s: %w", filepath.Join(dir, DesiredVersionsFile), err)
	}
	return v, nil
}

// WriteVersions writes v into dir atomically (and durably: it is what a
// restarted agent starts the components with); it writes nothing when the
// file already says v, so that calling it again changes nothing.
func WriteVersions(dir string, v desiredversions.Versions) error {
	if have, err := ReadVersions(dir); err == nil && reflect.DeepEqual(have, v) {
		return nil
	}
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the versions: %w", err)
	}
	return files.WriteAtomic(filepath.Join(dir, DesiredVersionsFile), data, 0o600)
}

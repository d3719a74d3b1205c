// Package version says which marina this is: its version, the source
// revision it was built from, and the controller image of that version,
// which marina init installs by default (issue 28). make build and make
// image stamp the same values into both (LDFlags), so the binary on a
// laptop and the image in a cluster agree on what they are.
package version

import (
	"fmt"
	"runtime/debug"
)

// Set at build time with -ldflags "-X ..." (see LDFlags and the Makefile).
// A plain `go build` leaves them empty and Get falls back to what the Go
// toolchain recorded.
var (
	version   string
	revision  string
	imageRepo string
)

// DefaultVersion names a build that was not stamped (go build, go test).
const DefaultVersion = "v0.0.0-dev"

// DefaultImageRepo is where an unstamped build expects its image: the name
// make image tags it with, which `podman load` or `kind load image-archive`
// keep. Teams that publish marina stamp their registry's repository with
// make IMAGE_REPO=... build image.
const DefaultImageRepo = "localhost/marina"

// Info is what marina version prints.
type Info struct {
	// Version is a semantic version (a git tag, or v0.0.0-dev.<revision>).
	Version string `json:"version"`
	// Revision is the git commit the binary was built from, with "-dirty"
	// when the tree had changes; empty when unknown.
	Revision string `json:"revision"`
	// Image is the controller image of this version: what marina init
	// installs unless told otherwise.
	Image string `json:"image"`
}

// Get returns this binary's Info.
func Get() Info {
	i := Info{Version: version, Revision: revision}
	if i.Revision == "" {
		i.Revision = buildRevision()
	}
	if i.Version == "" {
		i.Version = DefaultVersion
	}
	repo := imageRepo
	if repo == "" {
		repo = DefaultImageRepo
	}
	i.Image = repo + ":" + i.Version
	return i
}

// LDFlags are the linker flags that stamp v, rev and repo into a marina
// binary; tests use them to build what make builds.
func LDFlags(v, rev, repo string) string {
	const pkg = "marina.dev/marina/internal/version"
	return fmt.Sprintf("-X %s.version=%s -X %s.revision=%s -X %s.imageRepo=%s", pkg, v, pkg, rev, pkg, repo)
}

// buildRevision is the VCS revision go build recorded, if it did.
func buildRevision() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" && dirty {
		rev += "-dirty"
	}
	return rev
}

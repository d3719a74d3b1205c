// Command registry is the CNCF distribution registry built from its
// published Go module at the version pinned in tools/versions.env, with
// the filesystem storage driver and no others.
package main

import (
	"os"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
)

func main() {
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}

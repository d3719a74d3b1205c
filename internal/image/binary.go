package image

import (
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// BinaryOptions say what goes into an image that holds one static binary
// and nothing else, as the pause image of a pod sandbox does: no users,
// no CA certificates, no shell.
type BinaryOptions struct {
	// Binary is the path of a statically linked Linux binary (CGO_ENABLED=0)
	// built for Arch.
	Binary string
	// Entrypoint is the binary's absolute path in the image, which the
	// image runs, e.g. /pause.
	Entrypoint string
	// Arch is the binary's GOARCH, e.g. amd64.
	Arch string
	// User is the "uid:gid" the image runs as; empty runs it as root.
	// Numbers need no /etc/passwd in the image.
	User string
	// Title and Version are stamped into the labels.
	Title, Version string
	// Created is the image's creation time and the files' modification
	// time: the source commit's time keeps the build reproducible.
	Created time.Time
}

// BuildBinary assembles an image of o.Binary alone, at o.Entrypoint with
// mode 0755, in one layer.
func BuildBinary(o BinaryOptions) (v1.Image, error) {
	if o.Binary == "" || o.Arch == "" || o.Title == "" || o.Version == "" {
		return nil, fmt.Errorf("building an image: the binary, its architecture, title and version must be given")
	}
	if !path.IsAbs(o.Entrypoint) || path.Clean(o.Entrypoint) != o.Entrypoint || o.Entrypoint == "/" {
		return nil, fmt.Errorf("building the %s image: entrypoint %q is not a clean absolute path of a file", o.Title, o.Entrypoint)
	}
	bin, err := os.ReadFile(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("reading the %s binary: %w", o.Title, err)
	}
	created := o.Created.UTC()
	rel := o.Entrypoint[1:]
	// A runtime creates missing parents itself, but with mode 0755 only by
	// custom; saying so keeps the unpacked tree the same everywhere.
	var files []file
	for i, c := range rel {
		if c == '/' {
			files = append(files, file{name: rel[:i+1], mode: 0o755})
		}
	}
	files = append(files, file{name: rel, mode: 0o755, data: bin})
	l, err := layer(created, files)
	if err != nil {
		return nil, err
	}
	return assemble(o.Arch, created, v1.Config{
		Entrypoint: []string{o.Entrypoint},
		User:       o.User,
		Env:        []string{"PATH=/"},
		Labels: map[string]string{
			LabelTitle:   o.Title,
			LabelVersion: o.Version,
			LabelCreated: created.Format(time.RFC3339),
		},
	}, mutate.Addendum{Layer: l, History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "marina: " + o.Entrypoint + " " + o.Version}})
}

// SourceDateEpoch is the time $SOURCE_DATE_EPOCH holds, in seconds since
// the epoch (reproducible-builds.org), or the epoch when it is unset: the
// creation time of an image whose bytes must not depend on when it was
// built.
func SourceDateEpoch() (time.Time, error) {
	s := strings.TrimSpace(os.Getenv("SOURCE_DATE_EPOCH"))
	if s == "" {
		return time.Unix(0, 0), nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
	}
	return time.Unix(v, 0), nil
}

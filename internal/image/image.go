// Package image builds marina's controller image without a container
// daemon (issue 28): a static marina binary on a minimal root (CA
// certificates, a non-root user), its labels carrying the version and
// source revision. It builds the images of one static binary that real
// worker nodes import the same way (BuildBinary, NodeImages). The build is
// reproducible: the same binary, version and creation time give the same
// digest, so a digest printed by one build can be checked against another.
package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The image's fixed facts, which the Deployment of config/manager relies on.
const (
	// BinaryPath is where the marina binary lives in the image; the
	// Deployment's command names it.
	BinaryPath = "/marina"
	// UID and GID of the user the image runs as: not root, so a cluster
	// that enforces runAsNonRoot runs it as it is. 65532 is the "nonroot"
	// user of the distroless images, a number clusters' policies know.
	UID = 65532
	GID = 65532
	// CACertsPath is the CA bundle in the image, where Go's crypto/x509
	// looks first on Linux.
	CACertsPath = "/etc/ssl/certs/ca-certificates.crt"
)

// OCI annotation keys used as image labels
// (github.com/opencontainers/image-spec, annotations.md).
const (
	LabelTitle    = "org.opencontainers.image.title"
	LabelVersion  = "org.opencontainers.image.version"
	LabelRevision = "org.opencontainers.image.revision"
	LabelCreated  = "org.opencontainers.image.created"
)

// Options say what goes into the image.
type Options struct {
	// Binary is the path of a statically linked marina binary for Linux
	// (CGO_ENABLED=0), built for Arch.
	Binary string
	// Arch is the binary's GOARCH, e.g. amd64.
	Arch string
	// Version and Revision are stamped into the labels; they should be the
	// ones stamped into the binary.
	Version, Revision string
	// Created is the image's creation time and every file's modification
	// time: the source commit's time keeps the build reproducible.
	Created time.Time
	// CACerts is the path of the CA bundle to copy into the image (Debian's
	// ca-certificates package on the build host).
	CACerts string
}

// Build assembles the image: one layer with the root (users, CA
// certificates, an empty /tmp) and one with the binary, so that a new
// marina changes only the second.
func Build(o Options) (v1.Image, error) {
	if o.Binary == "" || o.Arch == "" || o.Version == "" {
		return nil, fmt.Errorf("building the image: the binary, its architecture and its version must be given")
	}
	bin, err := os.ReadFile(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("reading the marina binary: %w", err)
	}
	certs, err := os.ReadFile(o.CACerts)
	if err != nil {
		return nil, fmt.Errorf("reading the CA bundle for the image: %w (install Debian's ca-certificates package)", err)
	}
	created := o.Created.UTC()
	root, err := layer(created, []file{
		{name: "etc/", mode: 0o755},
		{name: "etc/passwd", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", UID, GID))},
		{name: "etc/group", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", GID))},
		{name: "etc/ssl/", mode: 0o755},
		{name: "etc/ssl/certs/", mode: 0o755},
		{name: CACertsPath[1:], mode: 0o644, data: certs},
		{name: "home/", mode: 0o755},
		{name: "home/nonroot/", mode: 0o700, uid: UID, gid: GID},
		{name: "tmp/", mode: 0o1777},
	})
	if err != nil {
		return nil, err
	}
	binary, err := layer(created, []file{{name: BinaryPath[1:], mode: 0o755, data: bin}})
	if err != nil {
		return nil, err
	}
	return assemble(o.Arch, created, v1.Config{
		Entrypoint: []string{BinaryPath},
		Cmd:        []string{"controller"},
		User:       fmt.Sprintf("%d:%d", UID, GID),
		WorkingDir: "/home/nonroot",
		Env:        []string{"PATH=/", "HOME=/home/nonroot", "SSL_CERT_FILE=" + CACertsPath},
		Labels: map[string]string{
			LabelTitle:    "marina",
			LabelVersion:  o.Version,
			LabelRevision: o.Revision,
			LabelCreated:  created.Format(time.RFC3339),
		},
	},
		mutate.Addendum{Layer: root, History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "marina: root (users, CA certificates)"}},
		mutate.Addendum{Layer: binary, History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "marina: " + BinaryPath + " " + o.Version}},
	)
}

// assemble stacks layers on an empty image and gives it config, for linux
// on arch, created at created: what every image built here shares.
func assemble(arch string, created time.Time, config v1.Config, layers ...mutate.Addendum) (v1.Image, error) {
	img, err := mutate.Append(empty.Image, layers...)
	if err != nil {
		return nil, fmt.Errorf("assembling the image: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the image's config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS = "linux"
	cfg.Architecture = arch
	cfg.Created = v1.Time{Time: created}
	cfg.Config = config
	return mutate.ConfigFile(img, cfg)
}

// Write saves img under ref as a tarball that `podman load`, `docker load`,
// `kind load image-archive` and `crane push` read, and returns its digest:
// the manifest's, which a registry keeps when the tarball is pushed.
func Write(file string, ref name.Tag, img v1.Image) (v1.Hash, error) {
	return WriteTags(file, []name.Tag{ref}, img)
}

// WriteTags is Write with several tags for the one image, each of which
// `ctr images import` and `docker load` create. The tarball lists the tags
// in no fixed order; the image, and so its digest, is the same.
func WriteTags(file string, tags []name.Tag, img v1.Image) (v1.Hash, error) {
	if len(tags) == 0 {
		return v1.Hash{}, fmt.Errorf("writing %s: the image has no tag", file)
	}
	refs := make(map[name.Reference]v1.Image, len(tags))
	for _, t := range tags {
		refs[t] = img
	}
	if err := tarball.MultiRefWriteToFile(file, refs); err != nil {
		return v1.Hash{}, fmt.Errorf("writing %s: %w", file, err)
	}
	return img.Digest()
}

// file is one entry of a layer; a name ending in / is a directory.
type file struct {
	name     string
	mode     int64
	uid, gid int
	data     []byte
}

// layer makes a gzip-compressed layer of files, every entry stamped with
// the same time and in the given order, so the bytes depend only on what
// goes in.
func layer(mtime time.Time, files []file) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.gid, ModTime: mtime, Format: tar.FormatPAX}
		if strings.HasSuffix(f.name, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("writing %s into a layer: %w", f.name, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("writing %s into a layer: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing a layer: %w", err)
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithCompressedCaching)
}

package image_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"marina.dev/marina/internal/image"
)

// The images of real nodes hold their binary alone, at the entrypoint with
// mode 0755, and the tarball names them by every tag: the pause image by
// containerd's default sandbox image, so that no node pulls it.
func TestBuildBinary(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "program")
	content := []byte("\x7fELF not really a program")
	if err := os.WriteFile(bin, content, 0o700); err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	type testCase struct {
		name string
		img  image.NodeImage
		// dirs are the parents the layer must hold before the binary.
		dirs []string
	}
	cases := []testCase{
		{name: "nested entrypoint", img: image.NodeImage{Name: "nested", Entrypoint: "/usr/bin/nested", Version: "v0", Tags: []string{"marina.local/nested:v0"}}, dirs: []string{"usr/", "usr/bin/"}},
	}
	// Every image make images builds.
	for _, n := range image.NodeImages {
		cases = append(cases, testCase{name: n.Name, img: n})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.img
			img, err := image.BuildBinary(n.Options(bin, "arm64", created))
			if err != nil {
				t.Fatal(err)
			}
			var tags []name.Tag
			for _, s := range n.Tags {
				tag, err := name.NewTag(s)
				if err != nil {
					t.Fatal(err)
				}
				tags = append(tags, tag)
			}
			file := filepath.Join(t.TempDir(), n.Name+".tar")
			digest, err := image.WriteTags(file, tags, img)
			if err != nil {
				t.Fatal(err)
			}
			again, err := image.BuildBinary(n.Options(bin, "arm64", created))
			if err != nil {
				t.Fatal(err)
			}
			if d, _ := again.Digest(); d != digest {
				t.Errorf("a second build has digest %s, the first %s", d, digest)
			}

			m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(file) })
			if err != nil {
				t.Fatalf("reading the tarball's manifest: %v", err)
			}
			if len(m) != 1 {
				t.Fatalf("the tarball holds %d images, want 1", len(m))
			}
			got := slices.Sorted(slices.Values(m[0].RepoTags))
			want := slices.Sorted(slices.Values(n.Tags))
			if !slices.Equal(got, want) {
				t.Errorf("tags %q, want %q", got, want)
			}
			for _, tag := range tags {
				loaded, err := tarball.ImageFromPath(file, &tag)
				if err != nil {
					t.Fatalf("opening %s in the tarball: %v", tag, err)
				}
				if d, err := loaded.Digest(); err != nil || d != digest {
					t.Errorf("%s in the tarball has digest %s (%v), WriteTags returned %s", tag, d, err, digest)
				}
			}

			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.OS != "linux" || cfg.Architecture != "arm64" {
				t.Errorf("platform %s/%s, want linux/arm64", cfg.OS, cfg.Architecture)
			}
			if !slices.Equal(cfg.Config.Entrypoint, []string{n.Entrypoint}) || len(cfg.Config.Cmd) != 0 {
				t.Errorf("entrypoint %q cmd %q, want [%s] and no cmd", cfg.Config.Entrypoint, cfg.Config.Cmd, n.Entrypoint)
			}
			if cfg.Config.User != n.User {
				t.Errorf("user %q, want %q", cfg.Config.User, n.User)
			}
			if cfg.Config.Labels[image.LabelTitle] != n.Name || cfg.Config.Labels[image.LabelVersion] != n.Version {
				t.Errorf("labels %v, want title %s version %s", cfg.Config.Labels, n.Name, n.Version)
			}
			if !cfg.Created.Time.Equal(created) {
				t.Errorf("created %s, want %s", cfg.Created, created)
			}

			layers, err := img.Layers()
			if err != nil {
				t.Fatal(err)
			}
			if len(layers) != 1 {
				t.Fatalf("%d layers, want 1", len(layers))
			}
			entries := layerEntries(t, layers[0])
			wantNames := append(slices.Clone(tc.dirs), n.Entrypoint[1:])
			var names []string
			for _, e := range entries {
				names = append(names, e.hdr.Name)
			}
			if !slices.Equal(names, wantNames) {
				t.Fatalf("layer holds %q, want %q", names, wantNames)
			}
			for _, e := range entries {
				if e.hdr.Mode != 0o755 || e.hdr.Uid != 0 || e.hdr.Gid != 0 || !e.hdr.ModTime.Equal(created) {
					t.Errorf("%s: mode %o owner %d:%d time %s, want 0755 root:root %s", e.hdr.Name, e.hdr.Mode, e.hdr.Uid, e.hdr.Gid, e.hdr.ModTime, created)
				}
			}
			last := entries[len(entries)-1]
			if last.hdr.Typeflag != tar.TypeReg || !bytes.Equal(last.data, content) {
				t.Errorf("%s: type %c, %d bytes; want the binary's %d bytes in a regular file", last.hdr.Name, last.hdr.Typeflag, len(last.data), len(content))
			}
		})
	}
}

func TestBuildBinaryRejects(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "program")
	if err := os.WriteFile(bin, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	ok := image.BinaryOptions{Binary: bin, Entrypoint: "/program", Arch: "amd64", Title: "program", Version: "v1"}
	for name, mutate := range map[string]func(*image.BinaryOptions){
		"no binary":             func(o *image.BinaryOptions) { o.Binary = "" },
		"a missing binary":      func(o *image.BinaryOptions) { o.Binary += ".missing" },
		"no architecture":       func(o *image.BinaryOptions) { o.Arch = "" },
		"no version":            func(o *image.BinaryOptions) { o.Version = "" },
		"a relative entrypoint": func(o *image.BinaryOptions) { o.Entrypoint = "program" },
		"an unclean entrypoint": func(o *image.BinaryOptions) { o.Entrypoint = "/usr/../program" },
		"a directory":           func(o *image.BinaryOptions) { o.Entrypoint = "/usr/" },
		"the root":              func(o *image.BinaryOptions) { o.Entrypoint = "/" },
	} {
		t.Run(name, func(t *testing.T) {
			o := ok
			mutate(&o)
			if _, err := image.BuildBinary(o); err == nil {
				t.Errorf("BuildBinary(%+v) succeeded, want an error", o)
			}
		})
	}
	if _, err := image.BuildBinary(ok); err != nil {
		t.Errorf("the valid options fail: %v", err)
	}
}

type entry struct {
	hdr  *tar.Header
	data []byte
}

// layerEntries reads a layer's tar entries in order.
func layerEntries(t *testing.T, l v1.Layer) []entry {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var out []entry
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("reading the layer: %v", err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, entry{hdr: h, data: data})
	}
}

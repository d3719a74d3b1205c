package image_test

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"marina.dev/marina/internal/image"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/internal/version"
)

// Issue 28: the image make image builds is opened as a registry or runtime
// would open it (no daemon): its config runs /marina as a non-root user
// with the version's labels, and the binary in its layers, run from the
// extracted file, says the version it was built as.
func TestImageRunsTheBuiltMarinaAsNonRoot(t *testing.T) {
	const (
		v    = "v9.8.7-test.1"
		rev  = "0123456789abcdef0123456789abcdef01234567"
		repo = "registry.test/team/marina"
	)
	dir := t.TempDir()
	bin, err := testenv.BuildStaticMarina(dir, version.LDFlags(v, rev, repo))
	if err != nil {
		t.Fatal(err)
	}
	opts := image.Options{Binary: bin, Arch: runtime.GOARCH, Version: v, Revision: rev,
		Created: time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC), CACerts: "/etc/ssl/certs/ca-certificates.crt"}
	img, err := image.Build(opts)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewTag(repo + ":" + v)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "marina-image.tar")
	digest, err := image.Write(file, ref, img)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("the same inputs give the same digest", func(t *testing.T) {
		again, err := image.Build(opts)
		if err != nil {
			t.Fatal(err)
		}
		d, err := again.Digest()
		if err != nil {
			t.Fatal(err)
		}
		if d != digest {
			t.Errorf("a second build has digest %s, the first %s", d, digest)
		}
	})

	loaded, err := tarball.ImageFromPath(file, &ref)
	if err != nil {
		t.Fatalf("opening the written image: %v", err)
	}
	if d, err := loaded.Digest(); err != nil || d != digest {
		t.Errorf("the tarball's image has digest %s (%v); Write printed %s, which a push would not keep", d, err, digest)
	}

	t.Run("config", func(t *testing.T) {
		cfg, err := loaded.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
			t.Errorf("platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
		}
		if !slices.Equal(cfg.Config.Entrypoint, []string{"/marina"}) {
			t.Errorf("entrypoint %q, want [/marina] (the Deployment's command names it)", cfg.Config.Entrypoint)
		}
		if user := cfg.Config.User; user == "" || user == "0" || strings.HasPrefix(user, "0:") || strings.HasPrefix(user, "root") {
			t.Errorf("user %q: the image must not run as root", user)
		}
		for k, want := range map[string]string{image.LabelVersion: v, image.LabelRevision: rev, image.LabelTitle: "marina"} {
			if got := cfg.Config.Labels[k]; got != want {
				t.Errorf("label %s = %q, want %q", k, got, want)
			}
		}
	})

	files := extract(t, loaded, dir)
	t.Run("files", func(t *testing.T) {
		marina, ok := files["marina"]
		if !ok {
			t.Fatalf("no /marina in the image's layers; it has %v", keys(files))
		}
		if marina.Typeflag != tar.TypeReg || marina.Mode&0o111 == 0 || marina.Mode&0o022 != 0 {
			t.Errorf("/marina: type %c mode %o, want an executable regular file nobody else may write", marina.Typeflag, marina.Mode)
		}
		for _, want := range []string{"etc/passwd", "etc/group", "etc/ssl/certs/ca-certificates.crt", "tmp"} {
			if _, ok := files[want]; !ok {
				t.Errorf("no /%s in the image", want)
			}
		}
		passwd, err := os.ReadFile(filepath.Join(dir, "rootfs", "etc", "passwd"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(passwd), ":65532:65532:") {
			t.Errorf("/etc/passwd names no user 65532:\n%s", passwd)
		}
	})

	t.Run("the extracted binary says what it was built as", func(t *testing.T) {
		out, err := exec.Command(filepath.Join(dir, "rootfs", "marina"), "version").CombinedOutput()
		if err != nil {
			t.Fatalf("marina version from the image: %v\n%s", err, out)
		}
		for _, want := range []string{"marina " + v + "\n", "revision " + rev + "\n", "image " + repo + ":" + v + "\n"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("marina version from the image does not say %q:\n%s", strings.TrimSpace(want), out)
			}
		}
	})
}

// extract writes the image's flattened file system under dir/rootfs, as
// a runtime would unpack it, and returns its entries by path.
func extract(t *testing.T, img v1.Image, dir string) map[string]*tar.Header {
	t.Helper()
	root := filepath.Join(dir, "rootfs")
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	out := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("reading the image's file system: %v", err)
		}
		out[strings.TrimSuffix(h.Name, "/")] = h
		target := filepath.Join(root, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(target, root+string(filepath.Separator)) {
			t.Fatalf("the image holds a path outside its root: %q", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode).Perm())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func keys(m map[string]*tar.Header) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

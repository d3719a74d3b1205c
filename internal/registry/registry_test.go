package registry_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"marina.dev/marina/internal/image"
	"marina.dev/marina/internal/registry"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/tools"
)

// TestPushedImagesAreServedByTheirPath: make images' tarballs pushed to
// the real registry are served, with the digest they were built with,
// under the name a node's containerd asks for (any registry's name, by
// its path), and an image never pushed is not found (the node's pull
// then fails with ErrImagePull, as anywhere).
func TestPushedImagesAreServedByTheirPath(t *testing.T) {
	binDir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	images := filepath.Join(binDir, "images")
	addr := testenv.StartRegistry(t)
	ctx := context.Background()

	pushed, err := registry.PushDir(ctx, addr, images)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"pause:3.10.2": true, "hello:v1": true, "coredns/coredns:" + tools.Pinned().CoreDNS: true}
	for _, p := range pushed {
		if !want[p] {
			t.Errorf("pushed %s, which is no image of make images or is there twice (%v)", p, pushed)
		}
		delete(want, p)
	}
	if len(want) != 0 {
		t.Errorf("pushed %v, missing %v", pushed, want)
	}

	for _, tc := range []struct{ tarball, ref string }{
		{"hello.tar", image.HelloImage},
		{"pause.tar", image.SandboxImage},
		{"pause.tar", image.LocalSandboxImage},
		{"coredns.tar", image.CoreDNSImage},
	} {
		tag, err := name.NewTag(tc.ref)
		if err != nil {
			t.Fatal(err)
		}
		img, err := tarball.ImageFromPath(filepath.Join(images, tc.tarball), &tag)
		if err != nil {
			t.Fatal(err)
		}
		built, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		served, err := registry.Digest(ctx, addr, tc.ref)
		if err != nil {
			t.Errorf("%s: %v", tc.ref, err)
		} else if served != built {
			t.Errorf("%s: the registry serves %s, the tarball holds %s", tc.ref, served, built)
		}
	}

	if _, err := registry.Digest(ctx, addr, "docker.io/library/nginx:latest"); !errors.Is(err, registry.ErrNotFound) {
		t.Errorf("an image never pushed: got %v, want ErrNotFound", err)
	}

	// A second push (every marina up pushes at its start) keeps them.
	if _, err := registry.PushDir(ctx, addr, images); err != nil {
		t.Fatalf("pushing again: %v", err)
	}
	if _, err := registry.Digest(ctx, addr, image.HelloImage); err != nil {
		t.Error(err)
	}
}

// TestPushDirWithoutImagesSaysWhatToRun: marina up says what is missing.
func TestPushDirWithoutImagesSaysWhatToRun(t *testing.T) {
	_, err := registry.PushDir(context.Background(), "127.0.0.1:1", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "make images") {
		t.Fatalf("got %v, want an error naming make images", err)
	}
}

func TestRepositoryDropsTheRegistry(t *testing.T) {
	for ref, want := range map[string]string{
		"registry.k8s.io/pause:3.10.2":            "pause:3.10.2",
		"registry.k8s.io/coredns/coredns:v1.14.6": "coredns/coredns:v1.14.6",
		"marina.local/hello:v1":                   "hello:v1",
		"nginx":                                   "library/nginx:latest",
		"localhost:5000/team/app:1":               "team/app:1",
	} {
		tag, err := name.NewTag(ref)
		if err != nil {
			t.Fatal(err)
		}
		if got := registry.Repository(tag); got != want {
			t.Errorf("Repository(%s) = %s, want %s", ref, got, want)
		}
	}
}

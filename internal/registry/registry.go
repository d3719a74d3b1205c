// Package registry is marina's side of the OCI registry the real nodes
// pull their images from (issue 32): the CNCF distribution registry that
// make setup builds and marina up runs, its configuration, and the push
// of make images' tarballs into it.
//
// A node's containerd asks this one registry for every image, whatever
// registry its name says (its hosts.toml `_default`), so the registry
// keeps each image under its path alone: registry.k8s.io/pause:3.10.2 is
// pause:3.10.2 here, nginx (docker.io/library/nginx) would be
// library/nginx.
package registry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// DefaultPort is the registry's port on 127.0.0.1 beside the management
// plane's (plane.DefaultAPIPort and the next ones).
const DefaultPort = 7445

// Env turns off the registry's trace export: without it the registry
// sends its spans to an OTLP collector on localhost that nobody runs.
var Env = []string{"OTEL_TRACES_EXPORTER=none", "OTEL_SDK_DISABLED=true"}

// Config is the registry's configuration: its images under dataDir, HTTP
// on addr (a loopback address: the nodes reach it through their agent's
// relay), no deletion, no access log (a node's pulls are not news).
func Config(dataDir, addr string) ([]byte, error) {
	// The secret signs upload state between requests; a registry
	// without one makes a random one and warns.
	secret := make([]byte, 16)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, `version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %q
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: %q
  secret: %q
`, dataDir, addr, hex.EncodeToString(secret)), nil
}

// in is ref's name in the registry at addr (plain HTTP).
func in(addr string, ref name.Tag) (name.Tag, error) {
	return name.NewTag(addr+"/"+Repository(ref), name.Insecure)
}

// Repository is where the registry keeps ref: its path and tag, without
// its registry (see the package comment).
func Repository(ref name.Tag) string {
	return ref.RepositoryStr() + ":" + ref.TagStr()
}

// WaitReady polls the registry's API root at addr until it answers 200.
func WaitReady(ctx context.Context, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v2/", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET /v2/: %s", resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the registry at %s: %w (last error: %v)", addr, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// PushDir pushes every image tarball (*.tar, as make images writes them)
// of dir to the registry at addr, and returns the names it pushed, in
// the registry's terms (Repository), sorted. A tarball's blobs the
// registry has are not sent again.
func PushDir(ctx context.Context, addr, dir string) ([]string, error) {
	tars, err := filepath.Glob(filepath.Join(dir, "*.tar"))
	if err != nil {
		return nil, err
	}
	if len(tars) == 0 {
		return nil, fmt.Errorf("no image tarballs in %s: run make images", dir)
	}
	var pushed []string
	for _, file := range tars {
		names, err := PushTarball(ctx, addr, file)
		if err != nil {
			return pushed, err
		}
		pushed = append(pushed, names...)
	}
	// One image may be there under two registries' names (the pause
	// image is registry.k8s.io's and marina.local's): one path here.
	sort.Strings(pushed)
	return slices.Compact(pushed), nil
}

// PushTarball pushes each tag of the docker-save tarball file to the
// registry at addr (plain HTTP), under Repository's names.
func PushTarball(ctx context.Context, addr, file string) ([]string, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(file) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, fmt.Errorf("reading the image tarball %s: %w", file, err)
	}
	var pushed []string
	for _, d := range m {
		for _, t := range d.RepoTags {
			src, err := name.NewTag(t)
			if err != nil {
				return pushed, fmt.Errorf("tag %q of %s: %w", t, file, err)
			}
			img, err := tarball.Image(opener, &src)
			if err != nil {
				return pushed, fmt.Errorf("reading %s from %s: %w", t, file, err)
			}
			dst, err := in(addr, src)
			if err != nil {
				return pushed, err
			}
			if err := remote.Write(dst, img, remote.WithContext(ctx)); err != nil {
				return pushed, fmt.Errorf("pushing %s to the registry at %s: %w", t, addr, err)
			}
			pushed = append(pushed, Repository(src))
		}
	}
	if len(pushed) == 0 {
		return nil, fmt.Errorf("the image tarball %s names no tag", file)
	}
	return pushed, nil
}

// Digest is the digest of the manifest the registry at addr keeps for
// ref (any registry's name, as a node asks for it); an error wrapping
// ErrNotFound when it has none.
func Digest(ctx context.Context, addr, ref string) (v1.Hash, error) {
	src, err := name.NewTag(ref)
	if err != nil {
		return v1.Hash{}, err
	}
	at, err := in(addr, src)
	if err != nil {
		return v1.Hash{}, err
	}
	d, err := remote.Head(at, remote.WithContext(ctx))
	if err != nil {
		var terr *transport.Error
		if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
			return v1.Hash{}, fmt.Errorf("the registry at %s has no %s: %w", addr, ref, ErrNotFound)
		}
		return v1.Hash{}, fmt.Errorf("asking the registry at %s for %s: %w", addr, ref, err)
	}
	return d.Digest, nil
}

// ErrNotFound says the registry has no such image.
var ErrNotFound = errors.New("image not found")

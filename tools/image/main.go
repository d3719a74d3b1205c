// Command image builds marina's controller image from a static marina
// binary, without a container daemon, and writes it as a tarball (make
// image). It prints the image's reference and digest.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"marina.dev/marina/internal/image"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run() error {
	o := image.Options{Arch: runtime.GOARCH, CACerts: "/etc/ssl/certs/ca-certificates.crt"}
	var repo, out string
	var created int64
	flag.StringVar(&o.Binary, "binary", "", "static marina binary for linux/"+runtime.GOARCH)
	flag.StringVar(&o.Arch, "arch", o.Arch, "the binary's GOARCH")
	flag.StringVar(&o.Version, "version", "", "marina's version: the image's tag and version label")
	flag.StringVar(&o.Revision, "revision", "", "source revision for the revision label")
	flag.StringVar(&o.CACerts, "ca-certs", o.CACerts, "CA bundle to put into the image")
	flag.StringVar(&repo, "repo", "", "image repository, e.g. registry.example.com/marina")
	flag.StringVar(&out, "out", "", "tarball to write")
	flag.Int64Var(&created, "created", 0, "creation time, seconds since the epoch (default: $SOURCE_DATE_EPOCH, else 0)")
	flag.Parse()
	o.Created = time.Unix(created, 0)
	if created == 0 {
		t, err := image.SourceDateEpoch()
		if err != nil {
			return err
		}
		o.Created = t
	}
	if repo == "" || out == "" {
		return fmt.Errorf("-repo and -out must be given")
	}
	ref, err := name.NewTag(repo + ":" + o.Version)
	if err != nil {
		return fmt.Errorf("image reference from -repo %q and -version %q: %w", repo, o.Version, err)
	}
	img, err := image.Build(o)
	if err != nil {
		return err
	}
	digest, err := image.Write(out, ref, img)
	if err != nil {
		return err
	}
	st, err := os.Stat(out)
	if err != nil {
		return err
	}
	fmt.Printf("image   %s (linux/%s)\ndigest  %s\nwritten %s (%.1f MiB)\n", ref, o.Arch, digest, out, float64(st.Size())/(1<<20))
	return nil
}

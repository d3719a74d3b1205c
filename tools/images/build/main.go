// Command build builds the images a real worker node imports into its
// containerd (image.NodeImages: the pause image of pod sandboxes and the
// hello test server, and CoreDNS as make setup built it) without a
// container daemon, and writes each as
// <out>/<name>.tar, which `ctr -n k8s.io images import` reads (make
// images). Every program is compiled static for linux/<arch>; with
// $SOURCE_DATE_EPOCH set, the images' digests depend only on the sources.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"marina.dev/marina/internal/image"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run() error {
	out := flag.String("out", "", "directory to write <name>.tar (and the binary <name>) into")
	binDir := flag.String("bin", "bin", "directory of the binaries make setup built (an image's Built)")
	arch := flag.String("arch", runtime.GOARCH, "GOARCH of the images")
	flag.Parse()
	if *out == "" {
		return fmt.Errorf("-out must be given")
	}
	created, err := image.SourceDateEpoch()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	for _, n := range image.NodeImages {
		if err := build(n, *out, *binDir, *arch, created); err != nil {
			return err
		}
	}
	return nil
}

func build(n image.NodeImage, out, binDir, arch string, created time.Time) error {
	bin := filepath.Join(out, n.Name)
	if n.Built != "" {
		// Built for this host by make setup.
		if arch != runtime.GOARCH {
			return fmt.Errorf("the %s image holds %s, built for %s, not %s", n.Name, n.Built, runtime.GOARCH, arch)
		}
		bin = filepath.Join(binDir, n.Built)
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("the %s image needs %s: run make setup first: %w", n.Name, bin, err)
		}
	} else {
		// -trimpath and -buildvcs=false: the binary, and so the digest,
		// must not depend on where the clone is or whether its tree is
		// clean.
		cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w", "-o", bin,
			"marina.dev/marina/tools/images/"+n.Name)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building the %s program: %w", n.Name, err)
		}
	}
	img, err := image.BuildBinary(n.Options(bin, arch, created))
	if err != nil {
		return err
	}
	var tags []name.Tag
	for _, t := range n.Tags {
		tag, err := name.NewTag(t)
		if err != nil {
			return fmt.Errorf("tag %q of the %s image: %w", t, n.Name, err)
		}
		tags = append(tags, tag)
	}
	file := filepath.Join(out, n.Name+".tar")
	digest, err := image.WriteTags(file, tags, img)
	if err != nil {
		return err
	}
	fmt.Printf("image   %s %v (linux/%s)\ndigest  %s\nwritten %s\n", n.Name, n.Tags, arch, digest, file)
	return nil
}

package image

import (
	"time"

	"marina.dev/marina/tools"
)

// The images a real worker node pulls (make images writes them as
// bin/images/<Name>.tar; marina up pushes them to its registry), so that
// a pod starts with no public registry.
const (
	// SandboxImage is the default sandbox image of containerd 2.3's CRI
	// plugin (DefaultSandboxImage in its internal/cri/config), the pause
	// of Kubernetes 1.37: under this name, a containerd that is not
	// told which to use runs it too.
	SandboxImage = "registry.k8s.io/pause:3.10.2"
	// LocalSandboxImage is the same pause image under marina's own name,
	// for a containerd configured to use it explicitly.
	LocalSandboxImage = "marina.local/pause:3.10.2"
	// HelloImage is a test HTTP server on port 8080 that answers with its
	// host name (tools/images/hello).
	HelloImage = "marina.local/hello:v1"
)

// CoreDNSImage is the cluster DNS addon's image (internal/addons), under
// the name kubeadm gives it, of the CoreDNS make setup builds.
var CoreDNSImage = "registry.k8s.io/coredns/coredns:" + tools.Pinned().CoreDNS

// NodeImage is one image of a real node, built from the Go program
// marina.dev/marina/tools/images/<Name>, or of a binary make setup built.
type NodeImage struct {
	// Name is the program's directory under tools/images and the
	// tarball's name.
	Name string
	// Built, when set, is the binary's name in bin/ (make setup builds it
	// from a pinned module): the image holds it instead of a program of
	// tools/images.
	Built string
	// Entrypoint is the program's path in the image.
	Entrypoint string
	// User is the "uid:gid" the image runs as.
	User string
	// Version is the image's version label.
	Version string
	// Tags are the references the tarball names the image by.
	Tags []string
}

// NodeImages are the images make images builds.
var NodeImages = []NodeImage{
	// User 65535 as in Kubernetes' own pause image (build/pause/Dockerfile).
	{Name: "pause", Entrypoint: "/pause", User: "65535:65535", Version: "3.10.2", Tags: []string{SandboxImage, LocalSandboxImage}},
	// The nonroot user of marina's image; 8080 needs no privilege.
	{Name: "hello", Entrypoint: "/hello", User: "65532:65532", Version: "v1", Tags: []string{HelloImage}},
	// Not root: its pods bind port 53 with the safe sysctl
	// net.ipv4.ip_unprivileged_port_start instead of a capability.
	{Name: "coredns", Built: "coredns-" + tools.Pinned().CoreDNS, Entrypoint: "/coredns", User: "65532:65532", Version: tools.Pinned().CoreDNS, Tags: []string{CoreDNSImage}},
}

// Options returns what BuildBinary needs to build the image from binary.
func (n NodeImage) Options(binary, arch string, created time.Time) BinaryOptions {
	return BinaryOptions{Binary: binary, Entrypoint: n.Entrypoint, Arch: arch, User: n.User,
		Title: n.Name, Version: n.Version, Created: created}
}

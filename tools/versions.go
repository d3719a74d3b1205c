// Package tools holds the versions of the real components marina builds from
// source (versions.env, read by tools/build.sh too), so that the marina binary
// and the tests agree with the set-up step on what sits in bin/.
package tools

import (
	_ "embed"
	"strings"
)

//go:embed versions.env
var versionsEnv string

// Versions are the pinned component versions.
type Versions struct {
	// Etcd is the etcd release, e.g. "v3.6.16".
	Etcd string
	// Containerd is the containerd release real worker nodes run, e.g.
	// "v2.3.7".
	Containerd string
	// CoreDNS is the cluster DNS addon's release, e.g. "v1.14.6".
	CoreDNS string
	// Registry is the distribution registry's release, e.g. "v3.1.2".
	Registry string
	// Kube are the Kubernetes releases, oldest first, e.g. ["v1.36.3", "v1.37.2"].
	Kube []string
}

// NewestKube is the newest pinned Kubernetes release: the management plane
// runs it, and bin/kubectl is of this version.
func (v Versions) NewestKube() string { return v.Kube[len(v.Kube)-1] }

// Pinned returns the versions in versions.env.
func Pinned() Versions {
	var v Versions
	for _, line := range strings.Split(versionsEnv, "\n") {
		name, value, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		value = strings.Trim(value, `"`)
		switch name {
		case "ETCD_VERSION":
			v.Etcd = value
		case "CONTAINERD_VERSION":
			v.Containerd = value
		case "COREDNS_VERSION":
			v.CoreDNS = value
		case "REGISTRY_VERSION":
			v.Registry = value
		case "KUBE_VERSIONS":
			v.Kube = strings.Fields(value)
		}
	}
	return v
}

package tools

import (
	"regexp"
	"testing"
)

// The build script and the Go code read the same file; a typo there must not
// leave the binary without versions.
func TestPinnedVersionsParse(t *testing.T) {
	v := Pinned()
	semver := regexp.MustCompile(`^v\d+\.\d+\.\d+$`)
	if !semver.MatchString(v.Etcd) {
		t.Errorf("etcd version %q is not vX.Y.Z", v.Etcd)
	}
	if !semver.MatchString(v.Containerd) {
		t.Errorf("containerd version %q is not vX.Y.Z", v.Containerd)
	}
	if !semver.MatchString(v.CoreDNS) {
		t.Errorf("coredns version %q is not vX.Y.Z", v.CoreDNS)
	}
	if !semver.MatchString(v.Registry) {
		t.Errorf("registry version %q is not vX.Y.Z", v.Registry)
	}
	if len(v.Kube) < 2 {
		t.Fatalf("want at least two Kubernetes releases to upgrade between, got %v", v.Kube)
	}
	for _, k := range v.Kube {
		if !semver.MatchString(k) {
			t.Errorf("kubernetes version %q is not vX.Y.Z", k)
		}
	}
	if v.NewestKube() != v.Kube[len(v.Kube)-1] {
		t.Errorf("newest = %s, want the last listed", v.NewestKube())
	}
}

package upgrade

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
)

// Check applies the version rules of M19 to an upgrade from the oldest
// version any API server runs (from) to desired, before any step is taken.
// available are the versions the binaries were built for (make setup); an
// empty list skips that rule (a provider that brings its own images).
func Check(from, desired string, available []string) error {
	to, err := version.ParseSemantic(desired)
	if err != nil {
		return fmt.Errorf("version %q is not a Kubernetes version like v1.37.2: %w", desired, err)
	}
	if len(available) > 0 && !slices.Contains(available, desired) {
		return fmt.Errorf("version %s was not built here: available are %s", desired, strings.Join(available, ", "))
	}
	if from == "" {
		return nil
	}
	old, err := version.ParseSemantic(from)
	if err != nil {
		return fmt.Errorf("the running API server reports %q, not a Kubernetes version: %w", from, err)
	}
	switch {
	case to.Major() != old.Major():
		return fmt.Errorf("upgrade from %s to %s changes the major version: not supported", from, desired)
	case to.Minor() < old.Minor():
		return fmt.Errorf("downgrade from %s to %s crosses a minor version: etcd's data may already use the newer API; restore a backup instead", from, desired)
	case to.Minor() > old.Minor()+1:
		return fmt.Errorf("upgrade from %s to %s skips a minor version: upgrade to v%d.%d first (Kubernetes version skew policy)", from, desired, old.Major(), old.Minor()+1)
	}
	return nil
}

// KubeletAllowed reports whether a kubelet at kubelet may run against API
// servers whose oldest is apiServer: never newer (version skew policy).
func KubeletAllowed(kubelet, apiServer string) error {
	k, err := version.ParseSemantic(kubelet)
	if err != nil {
		return fmt.Errorf("kubelet version %q: %w", kubelet, err)
	}
	a, err := version.ParseSemantic(apiServer)
	if err != nil {
		return fmt.Errorf("API server version %q: %w", apiServer, err)
	}
	if k.GreaterThan(a) {
		return fmt.Errorf("kubelet %s would be newer than the oldest API server %s", kubelet, apiServer)
	}
	return nil
}

// FlagChange is one entry of the table of what changes between versions:
// a component's flag renamed or removed from a version on. Steps that
// differ between version pairs are rows here, not branches in the code.
type FlagChange struct {
	Component Component
	// Since is the first minor version (1.37) where Old is gone.
	Since string
	Old   string
	// New replaces Old; empty means Old is dropped.
	New string
}

// FlagChanges is the table. It is empty between the releases built today
// (v1.36 and v1.37 take the same flags marina sets); a row added here is
// applied by RewriteFlags and tested in rules_test.go.
var FlagChanges []FlagChange

// RewriteFlags returns extra flags (names without dashes) for component at
// target, with the rows of table that apply renamed or dropped.
func RewriteFlags(table []FlagChange, component Component, target string, flags map[string]string) (map[string]string, error) {
	v, err := version.ParseSemantic(target)
	if err != nil {
		return nil, fmt.Errorf("version %q: %w", target, err)
	}
	out := make(map[string]string, len(flags))
	for k, val := range flags {
		out[k] = val
	}
	for _, c := range table {
		if c.Component != component {
			continue
		}
		since, err := version.ParseGeneric(c.Since)
		if err != nil {
			return nil, fmt.Errorf("flag table row %s: since %q: %w", c.Old, c.Since, err)
		}
		if v.LessThan(since) {
			continue
		}
		val, ok := out[c.Old]
		if !ok {
			continue
		}
		delete(out, c.Old)
		if c.New != "" {
			out[c.New] = val
		}
	}
	return out, nil
}

// Package names derives object names that stay within Kubernetes' limits:
// a machine's name is its Node's name and the value of the Node's
// kubernetes.io/hostname label, so it must be a DNS label (63 characters).
package names

import (
	"fmt"
	"hash/fnv"
	"strings"
)

// Fit returns base+suffix when it is at most limit characters long; else
// a prefix of base, a hash of all of base and suffix, together limit or
// shorter, so that two long bases that share a prefix still differ and
// one base always gives the same name. limit must leave room for suffix and
// nine characters of hash.
func Fit(base, suffix string, limit int) string {
	if len(base)+len(suffix) <= limit {
		return base + suffix
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(base))
	sum := fmt.Sprintf("%08x", h.Sum32())
	keep := limit - len(suffix) - len(sum) - 1
	prefix := strings.TrimRight(base[:max(keep, 0)], "-.")
	if prefix == "" {
		return sum + suffix
	}
	return prefix + "-" + sum + suffix
}

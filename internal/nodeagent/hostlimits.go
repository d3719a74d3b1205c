package nodeagent

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/klog/v2"
)

// inotifyMinimums are the host's inotify limits a machine needs. Every
// kubelet, containerd, kube-proxy and API server watches files through
// inotify, and the limits count per user across the whole host: a real
// worker holds about 9 instances (kubelet 6, containerd 2, kube-proxy 1),
// an API server or a controller-manager 3, and make test reached 135 of
// Debian's default 128 (CI failed with "too many open files" from a
// webhook's certificate watcher). kind asks its users to raise the same
// two limits; a machine sets them itself, as the kubelet sets the
// kernel's sysctls it depends on.
var inotifyMinimums = []hostLimit{
	{Key: "fs.inotify.max_user_instances", Min: 8192},
	{Key: "fs.inotify.max_user_watches", Min: 524288},
}

// hostLimit is a host-wide sysctl a machine needs at least Min of.
type hostLimit struct {
	Key string
	Min int64
}

// ensureHostLimits raises the host's inotify limits to what a machine
// needs, and says so in the log; a host that gives more keeps it.
func ensureHostLimits(log klog.Logger) error {
	return raiseLimits(log, "/proc/sys", inotifyMinimums)
}

// raiseLimits raises each of limits, under the sysctl tree procSys, to
// its minimum where it is lower.
func raiseLimits(log klog.Logger, procSys string, limits []hostLimit) error {
	for _, l := range limits {
		path := filepath.Join(procSys, strings.ReplaceAll(l.Key, ".", "/"))
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("reading %s: %w", l.Key, err)
		}
		current, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return fmt.Errorf("reading %s: %q is not a number: %w", l.Key, b, err)
		}
		if current >= l.Min {
			continue
		}
		if err := os.WriteFile(path, []byte(strconv.FormatInt(l.Min, 10)), 0o644); err != nil {
			return fmt.Errorf("raising %s from %d to %d: %w", l.Key, current, l.Min, err)
		}
		log.Info("Raised a host limit the machine needs", "sysctl", l.Key, "from", current, "to", l.Min)
	}
	return nil
}

package nodeagent

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"k8s.io/klog/v2"
)

// inotifyMinimums are the host's inotify limits a real node needs. Every
// kubelet, containerd and kube-proxy watches files through inotify, and
// the limits count per user across the whole host: a real worker holds
// about 9 instances (kubelet 6, containerd 2, kube-proxy 1), an API server
// or a controller-manager 3, and make test reached 115 of Debian's default
// 128 (CI failed with "too many open files" from a webhook's certificate
// watcher). kind asks its users to raise the same two limits; a machine
// sets them itself, as the kubelet sets the kernel's sysctls it depends
// on.
var inotifyMinimums = []hostLimit{
	{Key: "fs.inotify.max_user_instances", Min: 8192},
	{Key: "fs.inotify.max_user_watches", Min: 524288},
}

// hostLimit is a host-wide sysctl a real node needs at least Min of.
type hostLimit struct {
	Key string
	Min int64
}

// raiseTo says what a limit now at current must be set to: Min when it
// is lower, and nothing (0, false) when it is already enough; a host that
// gives more keeps what it gives.
func (l hostLimit) raiseTo(current int64) (int64, bool) {
	if current >= l.Min {
		return 0, false
	}
	return l.Min, true
}

// ensureHostLimits raises the host's inotify limits to what a machine
// needs, and says so in the log; it never lowers one.
func ensureHostLimits(log klog.Logger) error {
	for _, l := range inotifyMinimums {
		path := "/proc/sys/" + strings.ReplaceAll(l.Key, ".", "/")
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("reading %s: %w", l.Key, err)
		}
		current, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return fmt.Errorf("reading %s: %q is not a number: %w", l.Key, b, err)
		}
		v, raise := l.raiseTo(current)
		if !raise {
			continue
		}
		if err := os.WriteFile(path, []byte(strconv.FormatInt(v, 10)), 0o644); err != nil {
			return fmt.Errorf("raising %s from %d to %d: %w", l.Key, current, v, err)
		}
		log.Info("Raised a host limit a real node needs", "sysctl", l.Key, "from", current, "to", v)
	}
	return nil
}

// Package mounts finds and removes the mounts below a directory: what a
// real kubelet and its container runtime leave mounted in a local
// machine's directories (volumes, the containers' root filesystems, pod
// network namespaces) when they are killed rather than stopped, which a
// deleted machine must not leave behind (issue 32).
package mounts

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// Under lists the mount points at dir or below it, deepest first, as
// this process's mount namespace sees them.
func Under(dir string) ([]string, error) {
	dir = filepath.Clean(dir)
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var points []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescape(fields[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	sort.Slice(points, func(i, j int) bool {
		if di, dj := strings.Count(points[i], "/"), strings.Count(points[j], "/"); di != dj {
			return di > dj
		}
		return points[i] > points[j]
	})
	return points, nil
}

// unescape undoes mountinfo's octal escapes of space, tab, newline and
// backslash.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// UnmountAll unmounts everything at dir or below it (lazily, so that a
// mount still in use by a dying process does not stop the others) until
// none is left.
func UnmountAll(dir string) error {
	for range 10 {
		points, err := Under(dir)
		if err != nil {
			return err
		}
		if len(points) == 0 {
			return nil
		}
		var errs []error
		for _, p := range points {
			if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("unmounting %s: %w", p, err))
			}
		}
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
	}
	points, _ := Under(dir)
	return fmt.Errorf("mounts below %s remain after unmounting: %v", dir, points)
}

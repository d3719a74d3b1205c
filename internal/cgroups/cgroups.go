// Package cgroups holds a local machine with a real kubelet in cgroups of
// its own (issue 32): its agent joins /marina/<machine> in every cgroup v1
// hierarchy of the host, so that everything the machine starts (kubelet,
// containerd, the containers' shims, and the containers, whose cgroups the
// kubelet makes below the same parent) can be found, and ended, from one
// place when the machine is deleted. This host's cgroups are v1 (hybrid),
// which is what the package handles; a v2-only host has one hierarchy and
// the same paths.
package cgroups

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Root is where the cgroup hierarchies are mounted.
const Root = "/sys/fs/cgroup"

// Hierarchies lists the mounted hierarchies' directories: one per v1
// controller (or named hierarchy), or the v2 root alone on a v2 host.
func Hierarchies() ([]string, error) { return hierarchies(false) }

// allHierarchies adds, on a hybrid host, the unified hierarchy, where
// runc makes a container's groups too: what removal must look at.
func allHierarchies() ([]string, error) { return hierarchies(true) }

func hierarchies(withUnified bool) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var dirs []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		// <id> <parent> <maj:min> <root> <mount point> <opts> ... - <fstype> <source> <super opts>
		left, right, ok := strings.Cut(s.Text(), " - ")
		if !ok {
			continue
		}
		fields, after := strings.Fields(left), strings.Fields(right)
		if len(fields) < 5 || len(after) < 1 {
			continue
		}
		switch after[0] {
		case "cgroup":
			dirs = append(dirs, fields[4])
		case "cgroup2":
			if fields[4] == Root {
				return []string{Root}, nil // a v2 host: one hierarchy
			}
			if withUnified {
				dirs = append(dirs, fields[4])
			}
			// The hybrid layout's unified mount holds no controllers the
			// kubelet uses; the v1 hierarchies are the machine's.
		}
	}
	sort.Strings(dirs)
	return dirs, s.Err()
}

// Join moves process pid into group (a path such as /marina/<machine>) in
// every hierarchy, making the group where it is missing. cpuset groups
// are given their parent's cpus and mems, which a new cpuset lacks.
func Join(group string, pid int) error {
	hs, err := Hierarchies()
	if err != nil {
		return fmt.Errorf("listing cgroup hierarchies: %w", err)
	}
	for _, h := range hs {
		if err := mkdirCgroup(h, group); err != nil {
			return err
		}
		procs := filepath.Join(h, group, "cgroup.procs")
		if err := os.WriteFile(procs, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("moving process %d into %s: %w", pid, filepath.Join(h, group), err)
		}
	}
	return nil
}

// mkdirCgroup makes group below hierarchy h, one level at a time.
func mkdirCgroup(h, group string) error {
	cur := h
	for _, part := range strings.Split(strings.Trim(group, "/"), "/") {
		parent := cur
		cur = filepath.Join(cur, part)
		if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("making cgroup %s: %w", cur, err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if v, _ := os.ReadFile(filepath.Join(cur, f)); len(strings.TrimSpace(string(v))) > 0 {
					continue
				}
				v, err := os.ReadFile(filepath.Join(parent, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(cur, f), v, 0o644); err != nil {
					return fmt.Errorf("setting %s of %s: %w", f, cur, err)
				}
			}
		}
	}
	return nil
}

// Processes lists the processes in group and every group below it, in
// any hierarchy.
func Processes(group string) ([]int, error) {
	hs, err := allHierarchies()
	if err != nil {
		return nil, err
	}
	seen := map[int]bool{}
	for _, h := range hs {
		err := filepath.WalkDir(filepath.Join(h, group), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			data, err := os.ReadFile(path)
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	return pids, nil
}

// KillAll sends SIGKILL to every process of group and below until none
// is left (a process may fork while it is being killed), then removes the
// groups, deepest first, in every hierarchy, for at most timeout. A
// killed process leaves cgroup.procs before the kernel lets go of its
// group: until then rmdir says EBUSY, and KillAll tries again.
func KillAll(group string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids, err := Processes(group)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			err := Remove(group)
			if err == nil || !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				return err
			}
		} else if time.Now().After(deadline) {
			return fmt.Errorf("processes %v of cgroup %s are still alive after SIGKILL for %s", pids, group, timeout)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Remove removes group and the groups below it, deepest first, in every
// hierarchy; a group that still holds a process cannot be removed and is
// an error.
func Remove(group string) error {
	hs, err := allHierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, group), func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// RemoveEmpty removes group itself, in every hierarchy where it has no
// process and no group below it; elsewhere it stays. For a parent shared
// by several machines, removed with the last one.
func RemoveEmpty(group string) {
	hs, err := allHierarchies()
	if err != nil {
		return
	}
	for _, h := range hs {
		_ = syscall.Rmdir(filepath.Join(h, group))
	}
}

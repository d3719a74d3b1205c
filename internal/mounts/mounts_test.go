package mounts

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestUnmountAllRemovesNestedMounts mounts two tmpfs, one inside the
// other, and a bind mount beside them, and expects none left.
func TestUnmountAllRemovesNestedMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir := t.TempDir()
	outer, inner, bind := filepath.Join(dir, "a"), filepath.Join(dir, "a", "b c"), filepath.Join(dir, "d")
	for _, d := range []string{outer, bind} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mount("tmpfs", outer, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mounting tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = UnmountAll(dir) })
	if err := os.MkdirAll(inner, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", inner, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mounting tmpfs: %v", err)
	}
	if err := syscall.Mount(outer, bind, "", syscall.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount: %v", err)
	}
	got, err := Under(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != inner {
		t.Fatalf("Under(%s) = %q, want 3 mounts, the deepest (%s) first", dir, got, inner)
	}
	if err := UnmountAll(dir); err != nil {
		t.Fatalf("UnmountAll: %v", err)
	}
	if got, _ := Under(dir); len(got) != 0 {
		t.Fatalf("mounts left below %s: %q", dir, got)
	}
}

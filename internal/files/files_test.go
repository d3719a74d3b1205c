package files

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteAtomicReplacesWholeFileWithMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secret")
	for _, content := range []string{"first version, longer", "second"} {
		if err := WriteAtomic(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != content {
			t.Fatalf("read %q (%v), want %q", got, err, content)
		}
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("%d entries in the directory, want only the file (no temporary left)", len(entries))
	}
}

func TestTailKeepsTheLastLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(path, []byte("a\nb\nc\nd\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := Tail(path, 2); got != "    c\n    d" {
		t.Errorf("Tail = %q", got)
	}
	if got := Tail(filepath.Join(t.TempDir(), "missing"), 2); !strings.Contains(got, "no such file") {
		t.Errorf("Tail of a missing file = %q, want the error", got)
	}
}

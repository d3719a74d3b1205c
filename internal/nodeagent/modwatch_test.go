package nodeagent

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestModWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "members")
	w := modWatch{path: path}
	if !w.changed() {
		t.Error("a missing file reads as unchanged: the caller would never learn it is missing")
	}
	// Issue 25: a file that does not exist yet (a worker's versions file,
	// before issue 26) was read every second all the same.
	if w.changed() {
		t.Error("a file still missing reads as changed at every look")
	}
	write := func(content string, mtime time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	hourAgo := time.Now().Add(-time.Hour)
	write("a", hourAgo)
	if !w.changed() {
		t.Error("a new file reads as unchanged")
	}
	if w.changed() {
		t.Error("an old file not touched since reads as changed")
	}
	write("b", hourAgo.Add(time.Minute))
	if !w.changed() {
		t.Error("a rewritten file reads as unchanged")
	}
	write("c", time.Now())
	if !w.changed() || !w.changed() {
		t.Error("a file written just now must read as changed on every look")
	}
	write("d", hourAgo.Add(2*time.Minute))
	w.changed()
	w.retry()
	if !w.changed() {
		t.Error("after retry, an unchanged file reads as unchanged: a failed apply would never be tried again")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if !w.changed() {
		t.Error("a removed file reads as unchanged")
	}
	if w.changed() {
		t.Error("a removed file reads as changed again")
	}
	write("e", hourAgo)
	if !w.changed() {
		t.Error("a file written again after it was removed reads as unchanged")
	}
}

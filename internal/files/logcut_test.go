package files

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Issue 25: a chatty writer past the bound keeps at most the stated size
// on disk (2*max plus one period's output), and its log still reads as
// lines: the writer, appending, goes on at the cut file's new end.
func TestKeepLogsBoundsAChattyWriter(t *testing.T) {
	const max = 64 << 10
	const period = 20 * time.Millisecond
	path := filepath.Join(t.TempDir(), "agent.log")
	// As a process's standard output is: opened once, appending.
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		KeepLogs(ctx, period, max, func() []string { return []string{path} }, func(p string, err error) { t.Errorf("cutting %s: %v", p, err) })
	}()

	line := []byte(strings.Repeat("x", 99) + "\n")
	var written atomic.Int64
	// 1 KiB a millisecond at most: a period's output is at most ~20 KiB,
	// far more than a real agent writes.
	deadline := time.Now().Add(2 * time.Second)
	largest := int64(0)
	for time.Now().Before(deadline) {
		for range 10 {
			n, err := f.Write(line)
			if err != nil {
				t.Fatal(err)
			}
			written.Add(int64(n))
		}
		time.Sleep(time.Millisecond)
		if total := diskSize(path) + diskSize(path+".1"); total > largest {
			largest = total
		}
	}
	cancel()
	<-kept
	t.Logf("wrote %d KiB; the log and its .1 took at most %d KiB", written.Load()>>10, largest>>10)
	if written.Load() < 10*max {
		t.Fatalf("the writer wrote only %d bytes: no test of the bound", written.Load())
	}
	// The bound, with room for a period's worth written at the test's rate
	// and the scheduling of a loaded machine.
	if bound := int64(2*max + 256<<10); largest > bound {
		t.Errorf("the log took %d bytes on disk, more than %d", largest, bound)
	}
	for _, p := range []string{path, path + ".1"} {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.IndexByte(data, 0) >= 0 {
			t.Errorf("%s holds NUL bytes: the writer did not go on at the cut file's end", p)
		}
	}
	if info, err := os.Stat(path + ".1"); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("%s.1: %v, %v; want mode 0600", path, info, err)
	}
}

func diskSize(path string) int64 {
	info, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return info.Size()
}

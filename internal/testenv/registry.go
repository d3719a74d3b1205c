package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"marina.dev/marina/internal/registry"
	"marina.dev/marina/tools"
)

// StartRegistry runs the image registry make setup built, as marina up
// runs it, empty, storing under a temporary directory, until the test
// ends; it returns its host:port.
func StartRegistry(t testing.TB) string {
	t.Helper()
	binDir, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	addr := "127.0.0.1:" + strconv.Itoa(FreePorts(t, 1))
	cfg, err := registry.Config(filepath.Join(dir, "data"), addr)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(file, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "registry-"+tools.Pinned().Registry), "serve", file)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, registry.Env...)
	logPath := filepath.Join(dir, "registry.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if err := registry.WaitReady(context.Background(), addr, 30*time.Second); err != nil {
		out, _ := os.ReadFile(logPath)
		t.Fatalf("%v\n%s", err, out)
	}
	return addr
}

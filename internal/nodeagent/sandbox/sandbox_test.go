package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestLockAndHeld(t *testing.T) {
	dir := t.TempDir()
	if held, err := Held(dir); err != nil || held {
		t.Fatalf("Held before any agent = %v, %v; want false", held, err)
	}
	lock, err := Lock(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	if held, err := Held(dir); err != nil || !held {
		t.Fatalf("Held while locked = %v, %v; want true", held, err)
	}
	if _, err := Lock(dir, 50*time.Millisecond); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Lock = %v, want ErrLocked", err)
	}
	lock.Close()
	if held, err := Held(dir); err != nil || held {
		t.Fatalf("Held after release = %v, %v; want false", held, err)
	}
}

func TestBootstrapRoundTripIsPrivate(t *testing.T) {
	dir := t.TempDir()
	want := &Bootstrap{Server: "https://127.0.0.1:6443", Token: "secret", NodeName: "n", Address: "127.1.0.1"}
	if err := WriteBootstrap(dir, want); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, BootstrapFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	got, err := ReadBootstrap(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Server != want.Server || got.Token != want.Token || got.NodeName != want.NodeName || got.Address != want.Address {
		t.Errorf("read %+v, want %+v", got, want)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
}

package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"marina.dev/marina/internal/testenv"
)

// klogLine is the start of a line of the controllers' log.
var klogLine = regexp.MustCompile(`(?m)^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ `)

// marina up shows a person its progress and the ready banner; the
// controllers' log (some fifty lines of webhook registration before the
// banner alone) goes to a file in the state directory, which the banner
// names.
func TestUpShowsProgressNotTheControllersLog(t *testing.T) {
	t.Parallel()
	stateDir := t.TempDir()
	u := startUp(t, stateDir)
	// startUp returns at the banner's first line.
	testenv.Eventually(t, 10*time.Second, "the whole banner", func() error {
		if !strings.Contains(u.out.String(), "Press Ctrl-C to stop") {
			return errors.New("not printed yet")
		}
		return nil
	})
	out := u.out.String()
	t.Logf("marina up printed:\n%s", out)
	if lines := klogLine.FindAllString(out, -1); len(lines) > 0 {
		t.Errorf("marina up printed %d lines of the controllers' log before its banner", len(lines))
	}
	logFile := filepath.Join(stateDir, "logs", "marina.log")
	for _, want := range []string{"starting etcd", "kube-apiserver is ready", "The marina management plane is up",
		"export KUBECONFIG=" + filepath.Join(stateDir, "admin.kubeconfig"), "The controllers log to " + logFile} {
		if !strings.Contains(out, want) {
			t.Errorf("marina up does not print %q", want)
		}
	}
	data, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatalf("the controllers' log: %v", err)
	}
	if !klogLine.Match(data) || !strings.Contains(string(data), "webhook") {
		t.Errorf("%s does not hold the controllers' log:\n%s", logFile, data)
	}
	if st, err := os.Stat(logFile); err == nil && st.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", logFile, st.Mode().Perm())
	}
	u.stopAndCheckNoLeftovers(t, syscall.SIGTERM)
}

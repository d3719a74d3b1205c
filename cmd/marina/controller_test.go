package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Issue 24: the webhook's key is not kept under a fixed name in the shared
// temporary directory, but in marina's own state directory.
func TestControllerKeepsTheWebhookKeyInTheStateDir(t *testing.T) {
	state := t.TempDir()
	t.Setenv("MARINA_STATE_DIR", state)
	dir := newControllerCommand().Flags().Lookup("webhook-cert-dir").DefValue
	if dir != filepath.Join(state, "webhook-certs") {
		t.Errorf("--webhook-cert-dir defaults to %s, want %s", dir, filepath.Join(state, "webhook-certs"))
	}
	if strings.HasPrefix(dir, os.TempDir()+string(filepath.Separator)+"marina-webhook") {
		t.Errorf("--webhook-cert-dir defaults to the shared %s", dir)
	}
}

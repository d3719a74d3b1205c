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

// --endpoint-addresses takes IPs and CIDRs, and says which argument it
// cannot read.
func TestParseEndpointAddresses(t *testing.T) {
	got, err := parseEndpointAddresses([]string{"10.77.0.1", "192.168.5.7/24", "::1"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.77.0.1/32", "192.168.5.0/24", "::1/128"}
	if len(got) != len(want) {
		t.Fatalf("parsed %v, want %v", got, want)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("parsed %v, want %v", got, want)
		}
	}
	if _, err := parseEndpointAddresses([]string{"bridge0"}); err == nil || !strings.Contains(err.Error(), `"bridge0"`) {
		t.Errorf("parsing bridge0: %v, want an error naming it", err)
	}
}

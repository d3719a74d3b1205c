package bootstrap

import (
	"slices"
	"testing"
)

// The last line behind resolve's refusal: an extra flag naming one marina
// sets never replaces marina's value, nor is given a second time.
func TestWithExtraArgsNeverReplacesAFlagMarinaSets(t *testing.T) {
	got := withExtraArgs([]flag{{"bind-address", "127.0.0.5"}, {"secure-port", "6443"}},
		map[string]string{"bind-address": "0.0.0.0", "v": "2", "audit-log-maxage": "30"})
	want := []string{"--bind-address=127.0.0.5", "--secure-port=6443", "--audit-log-maxage=30", "--v=2"}
	if !slices.Equal(got, want) {
		t.Errorf("withExtraArgs = %q, want %q", got, want)
	}
}

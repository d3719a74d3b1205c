package local

import (
	"context"
	"errors"
	"strings"
	"testing"

	"marina.dev/marina/internal/testenv"
)

// TestRealHostNeedsARegistryWithThePauseImage: a real machine pulls every
// image from the registry it is given, so the host check names a missing
// registry, and a registry without the pause image (make images was not
// pushed), instead of leaving the pods stuck in ErrImagePull (issue 32).
func TestRealHostNeedsARegistryWithThePauseImage(t *testing.T) {
	empty := testenv.StartRegistry(t)
	for _, tc := range []struct {
		registry string
		want     string
	}{
		{"", "a registry to pull images from (marina up runs one; marina controller takes --registry)"},
		{empty, "the pause image registry.k8s.io/pause:3.10.2 in the registry at " + empty + " (make images, then restart marina up)"},
	} {
		p, err := New(Options{Root: t.TempDir(), AgentCommand: []string{"true"}, Real: RealOptions{Registry: tc.registry}})
		if err != nil {
			t.Fatal(err)
		}
		err = p.checkRealHost(context.Background())
		var notReady *HostNotReadyError
		if !errors.As(err, &notReady) {
			t.Fatalf("registry %q: got %v, want a HostNotReadyError", tc.registry, err)
		}
		found := false
		for _, m := range notReady.Missing {
			found = found || strings.HasPrefix(m, tc.want)
		}
		if !found {
			t.Errorf("registry %q: missing %q, want it to name %q", tc.registry, notReady.Missing, tc.want)
		}
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"marina.dev/marina/internal/describe"
)

// --wait ends at once, with the API server's answer, when waiting cannot
// change it; other errors (the API server restarting) are waited out.
func TestFollowStopsOnErrorsWaitingCannotFix(t *testing.T) {
	clusters := schema.GroupResource{Group: "cluster.marina.dev", Resource: "clusters"}
	for _, tc := range []struct {
		name      string
		err       error
		permanent bool
	}{
		{"NotFound", apierrors.NewNotFound(clusters, "dev"), true},
		{"Forbidden", apierrors.NewForbidden(clusters, "dev", errors.New("user cannot get")), true},
		{"Unauthorized", apierrors.NewUnauthorized("token expired"), true},
		{"connection refused", errors.New("dial tcp 127.0.0.1:7443: connect: connection refused"), false},
		{"server timeout", apierrors.NewServerTimeout(clusters, "get", 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			polls := 0
			poll := func(context.Context) ([]describe.Stage, string, error) {
				polls++
				return nil, "", fmt.Errorf("reading cluster default/dev: %w", tc.err) // as clusterObjects wraps it
			}
			const timeout = 1200 * time.Millisecond
			start := time.Now()
			err := follow(context.Background(), io.Discard, timeout, poll)
			if !errors.Is(err, tc.err) {
				t.Fatalf("follow returned %v, want it to wrap %v", err, tc.err)
			}
			if tc.permanent {
				if polls != 1 || strings.Contains(err.Error(), "timed out") {
					t.Errorf("follow polled %d times in %s and returned %q; want it to stop at the first answer", polls, time.Since(start).Round(time.Millisecond), err)
				}
				return
			}
			if polls < 2 || !strings.Contains(err.Error(), "timed out") {
				t.Errorf("follow polled %d times and returned %q; want it to keep polling until the timeout", polls, err)
			}
		})
	}
}

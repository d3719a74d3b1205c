package main

import (
	"context"
	"fmt"
	"io"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"marina.dev/marina/internal/describe"
)

// pollStages reads the stages of what is being followed, and why it
// cannot succeed (empty while it may).
type pollStages func(ctx context.Context) (stages []describe.Stage, failed string, err error)

// follow shows stages until all are done: a line for each stage as it
// ends, with the time since the start; on a terminal the stage under way
// is redrawn in place with a bar for counted stages, in a pipe a line is
// printed when its count changes. It fails with the reason when poll
// reports one, at once with poll's error when waiting cannot mend it (see
// permanent), and when timeout passes.
func follow(ctx context.Context, w io.Writer, timeout time.Duration, poll pollStages) error {
	tty := isTerminal(w)
	start := time.Now()
	deadline := start.Add(timeout)
	printed := map[string]bool{}
	lastCount := map[string]int{}
	redraw := false
	clear := func() {
		if redraw {
			fmt.Fprint(w, "\r\x1b[K")
			redraw = false
		}
	}
	for {
		stages, failed, err := poll(ctx)
		elapsed := time.Since(start).Round(100 * time.Millisecond)
		if err == nil {
			var current *describe.Stage
			for i := range stages {
				s := &stages[i]
				if !s.Done {
					if current == nil {
						current = s
					}
					continue
				}
				if !printed[s.Name] {
					clear()
					fmt.Fprintf(w, "✓ %-40s %8s\n", s.String(), elapsed)
					printed[s.Name] = true
				}
			}
			if current == nil {
				fmt.Fprintf(w, "done in %s\n", elapsed)
				return nil
			}
			switch {
			case tty:
				clear()
				fmt.Fprintf(w, "… %-40s %8s %s", current.String(), elapsed, describe.Bar(current.Count, current.Total, 20))
				redraw = true
			case current.Total > 0 && lastCount[current.Name] != current.Count:
				fmt.Fprintf(w, "… %-40s %8s\n", current.String(), elapsed)
			}
			lastCount[current.Name] = current.Count
			if failed != "" {
				clear()
				return fmt.Errorf("%s (after %s, at stage %q)", failed, elapsed, current.Name)
			}
		}
		if permanent(err) {
			clear()
			return fmt.Errorf("after %s: %w", elapsed, err)
		}
		if time.Now().After(deadline) {
			clear()
			if err != nil {
				return fmt.Errorf("timed out after %s: %w", timeout, err)
			}
			return fmt.Errorf("timed out after %s; marina describe cluster shows what waits", timeout)
		}
		select {
		case <-ctx.Done():
			clear()
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// permanent: err is an answer of the API server that waiting does not
// change (the object is gone, or the user may not read it), unlike a
// refused connection while the API server restarts.
func permanent(err error) bool {
	return apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)
}

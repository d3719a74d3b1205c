package loadbalancer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"
)

// startCheckerLocked starts be's health checks; the first runs at once.
func (b *Balancer) startCheckerLocked(be *backend) {
	ctx, cancel := context.WithCancel(b.ctx)
	be.stop = cancel
	b.wg.Add(1)
	go b.runChecker(ctx, be)
}

func (b *Balancer) runChecker(ctx context.Context, be *backend) {
	defer b.wg.Done()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		b.mu.Lock()
		hc, client := b.hc, b.client
		b.mu.Unlock()
		err := check(ctx, client, hc, be.addr)
		if ctx.Err() != nil {
			return
		}
		b.record(be, hc, err)
		timer.Reset(hc.Interval)
	}
}

// check runs one health check of addr.
func check(ctx context.Context, client *http.Client, hc HealthCheck, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, hc.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+hc.Path, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	if resp.StatusCode != http.StatusOK {
		// The first line of /readyz's answer names the failing check.
		line, _, _ := bytes.Cut(bytes.TrimSpace(body), []byte("\n"))
		return fmt.Errorf("GET %s: %s: %q", hc.Path, resp.Status, line)
	}
	return nil
}

// record applies one check's outcome to be's health.
func (b *Balancer) record(be *backend, hc HealthCheck, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if be.removed || b.closed {
		return
	}
	if err == nil {
		be.fails, be.lastErr = 0, ""
		if be.healthy {
			return
		}
		be.rises++
		if be.everHealthy && be.rises < hc.RiseThreshold {
			return
		}
		be.healthy, be.everHealthy, be.rises, be.quiet = true, true, 0, false
		be.stopDrain()
		b.log.Info("Backend is healthy", "backend", be.addr)
		return
	}
	prev := be.lastErr
	be.rises, be.lastErr = 0, err.Error()
	if !be.healthy {
		// Once per reason: a backend that never comes up says why, and
		// its checks every second do not flood the log.
		log := b.log.V(1)
		if be.lastErr != prev {
			log = b.log
		}
		log.Info("Backend is not healthy", "backend", be.addr, "err", be.lastErr)
		return
	}
	be.fails++
	if be.fails < hc.FailThreshold {
		b.log.V(1).Info("Backend failed a check", "backend", be.addr, "failures", be.fails, "err", be.lastErr)
		return
	}
	be.healthy, be.fails = false, 0
	be.quiet = unanswered(err)
	b.log.Info("Backend is unhealthy, taking it out", "backend", be.addr, "failures", hc.FailThreshold,
		"err", be.lastErr, "connections", be.active, "closingThemIn", b.drainPeriod(be))
	b.drainLocked(be)
}

// unanswered reports whether a check failed for want of an answer: it
// timed out, or nothing listens. Such a backend is slow, frozen, or going
// away (an API server shutting down closes its listener first, then
// finishes its requests and closes its connections itself), not known to
// be sick: only one that answers "not ready" is.
func unanswered(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &ne) && ne.Timeout()
}

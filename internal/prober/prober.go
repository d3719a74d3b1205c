// Package prober sends a steady stream of reads and writes to a workload
// cluster's API (or the caller's requests, to an app) and counts the
// requests that fail: the measure of an upgrade that keeps the API and
// the apps serving (M13). Tests and benchmarks use it.
package prober

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Result is what a prober saw.
type Result struct {
	Requests, Failures int
	// Errors are the first failures, when and what.
	Errors []string
	// Elapsed is how long it ran.
	Elapsed time.Duration
	// LongestOutage is the longest time one kind of request kept failing:
	// from its first failure to its next success (or the end of the run).
	LongestOutage time.Duration
}

// Rate is requests per second over the run.
func (r Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// Prober runs until Stop.
type Prober struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	start  time.Time

	mu  sync.Mutex
	res Result
}

// maxErrors bounds the errors kept.
const maxErrors = 20

// Start begins probing: one goroutine writes a ConfigMap, one reads it,
// one lists the namespaces, each one request per period (100ms: 30 per
// second). The client should
// not be rate-limited below that (rest.Config QPS).
func Start(ctx context.Context, cs kubernetes.Interface, namespace string, period time.Duration) (*Prober, error) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "marina-prober", Namespace: namespace}, Data: map[string]string{"n": "0"}}
	if _, err := cs.CoreV1().ConfigMaps(namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating the prober's configmap: %w", err)
	}
	n := 0
	return StartProbes(ctx, period,
		func(ctx context.Context) error {
			n++
			c := cm.DeepCopy()
			c.Data["n"] = fmt.Sprint(n)
			// No resourceVersion: an unconditional update, never a conflict.
			_, err := cs.CoreV1().ConfigMaps(namespace).Update(ctx, c, metav1.UpdateOptions{})
			return err
		},
		func(ctx context.Context) error {
			_, err := cs.CoreV1().ConfigMaps(namespace).Get(ctx, cm.Name, metav1.GetOptions{})
			return err
		},
		func(ctx context.Context) error {
			_, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{Limit: 10})
			return err
		}), nil
}

// StartProbes begins probing with the caller's probes (an app's Service,
// for instance), each in a goroutine of its own sending one request per
// period, with a 5 s timeout; an error is a failed request.
func StartProbes(ctx context.Context, period time.Duration, probes ...func(context.Context) error) *Prober {
	ctx, cancel := context.WithCancel(ctx)
	p := &Prober{cancel: cancel, start: time.Now()}
	for _, probe := range probes {
		p.loop(ctx, period, probe)
	}
	return p
}

func (p *Prober) loop(ctx context.Context, period time.Duration, probe func(context.Context) error) {
	p.wg.Go(func() {
		tick := time.NewTicker(period)
		defer tick.Stop()
		var failingSince time.Time
		outage := func(now time.Time) {
			if !failingSince.IsZero() {
				p.mu.Lock()
				p.res.LongestOutage = max(p.res.LongestOutage, now.Sub(failingSince))
				p.mu.Unlock()
			}
		}
		defer func() { outage(time.Now()) }()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := probe(rctx)
			cancel()
			if ctx.Err() != nil {
				return // stopped mid-request: not the cluster's failure
			}
			now := time.Now()
			switch {
			case err != nil && failingSince.IsZero():
				failingSince = now
			case err == nil:
				outage(now)
				failingSince = time.Time{}
			}
			p.mu.Lock()
			p.res.Requests++
			if err != nil {
				p.res.Failures++
				if len(p.res.Errors) < maxErrors {
					p.res.Errors = append(p.res.Errors, time.Now().Format("15:04:05.000")+" "+err.Error())
				}
			}
			p.mu.Unlock()
		}
	})
}

// Stop ends the probing and returns what it saw.
func (p *Prober) Stop() Result {
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.res.Elapsed = time.Since(p.start)
	return p.res
}

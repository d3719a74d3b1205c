// Package safety runs the safety controller (issue: health and safety).
// Every period it:
//   - lists the machines each provider made and the Machine objects of the
//     management plane, and removes the provider machines no Machine owns
//     once they have been orphans for a grace period. An orphan is what a
//     crash, or a finalizer stripped by hand, leaves: a machine that costs
//     money (or, locally, runs processes) and that nothing would ever
//     delete;
//   - freezes a MachineSet that has had more machines than replicas +
//     maxSurge for a period (a runaway: it creates no more until it is back
//     in bounds), and thaws it once it is.
package safety

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/metrics"
	"marina.dev/marina/internal/safety"
	"marina.dev/marina/provider"
)

// Options configure the safety controller.
type Options struct {
	Providers *provider.Registry
	// Period between looks; 30s when zero.
	Period time.Duration
	// Grace is how long a provider machine must have been seen without a
	// Machine before it is removed; 2m when zero. It covers a Machine
	// list that lags (none does: the list is read past the cache) and a
	// person who strips a finalizer and re-creates the object.
	Grace time.Duration
	// FreezeAfter is how long a MachineSet must have been above its bound
	// before it is frozen; Period when zero, so two looks in a row.
	FreezeAfter time.Duration
}

// Controller is a leader-elected manager runnable.
type Controller struct {
	client   client.Client
	live     client.Reader
	recorder recorder.EventRecorder
	opts     Options
	log      logr.Logger
	seen     map[types.UID]time.Time
	// over holds when each MachineSet was first seen above its bound.
	over map[types.UID]time.Time
}

// The safety controller freezes and thaws MachineSets (config/rbac).
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machinesets,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=cluster.marina.dev,resources=machinedeployments,verbs=get;list;watch

// SetupWithManager adds the safety controller to mgr.
func SetupWithManager(mgr ctrl.Manager, opts Options) error {
	if opts.Period == 0 {
		opts.Period = 30 * time.Second
	}
	if opts.Grace == 0 {
		opts.Grace = 2 * time.Minute
	}
	if opts.FreezeAfter == 0 {
		opts.FreezeAfter = opts.Period
	}
	return mgr.Add(&Controller{
		client: mgr.GetClient(), live: mgr.GetAPIReader(), recorder: mgr.GetEventRecorder("safety-controller"),
		opts: opts, log: mgr.GetLogger().WithName("safety"),
		seen: map[types.UID]time.Time{}, over: map[types.UID]time.Time{},
	})
}

// NeedLeaderElection: one replica removes orphans.
func (c *Controller) NeedLeaderElection() bool { return true }

// Start looks every period until ctx ends.
func (c *Controller) Start(ctx context.Context) error {
	tick := time.NewTicker(c.opts.Period)
	defer tick.Stop()
	for {
		if err := c.sweep(ctx); err != nil && ctx.Err() == nil {
			c.log.Error(err, "Looking for orphan machines failed")
		}
		if err := c.freeze(ctx); err != nil && ctx.Err() == nil {
			c.log.Error(err, "Looking for runaway MachineSets failed")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// sweep lists, decides and removes once.
func (c *Controller) sweep(ctx context.Context) error {
	var listers []provider.Provider
	for _, p := range c.opts.Providers.Providers() {
		if _, ok := p.(provider.MachineLister); ok {
			listers = append(listers, p)
		}
	}
	if len(listers) == 0 {
		return nil
	}
	// The providers are listed before the Machines: a machine made in
	// between has its Machine already (the Machine's UID names it).
	made := map[provider.Provider][]types.UID{}
	for _, p := range listers {
		uids, err := p.(provider.MachineLister).MachineUIDs(ctx)
		if err != nil {
			return err
		}
		made[p] = uids
	}
	var machines clusterv1.MachineList
	if err := c.live.List(ctx, &machines); err != nil {
		return err
	}
	known := make(map[types.UID]bool, len(machines.Items))
	for _, m := range machines.Items {
		known[m.UID] = true
	}
	now := time.Now()
	next := map[types.UID]time.Time{}
	for _, p := range listers {
		remove, seen := safety.Orphans(made[p], known, c.seen, now, c.opts.Grace)
		for uid, at := range seen {
			next[uid] = at
		}
		for _, uid := range remove {
			if err := p.Delete(ctx, uid); err != nil {
				c.log.Error(err, "Removing an orphan machine failed", "provider", p.Name(), "uid", uid)
				next[uid] = c.seen[uid]
				continue
			}
			metrics.OrphansRemoved.WithLabelValues(p.Name()).Inc()
			c.log.Info("Removed a machine no Machine owns", "provider", p.Name(), "uid", uid, "orphanFor", c.opts.Grace)
		}
	}
	c.seen = next
	return nil
}

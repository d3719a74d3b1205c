// Package safety runs the safety controller (issue: health and safety).
// Every period it:
//   - lists the machines each provider made and the Machine objects of the
//     management plane, and removes the provider machines no Machine owns
//     once they have been orphans for a grace period. An orphan is what a
//     crash, or a finalizer stripped by hand, leaves: a machine that costs
//     money (or, locally, runs processes) and that nothing would ever
//     delete;
//   - does the same for the control-plane endpoints (load balancers) of
//     Clusters that are gone;
//   - freezes a MachineSet that has had more machines than replicas +
//     maxSurge for a period (a runaway: it creates no more until it is back
//     in bounds), and thaws it once it is.
package safety

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
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
	// kinds are the orphans looked for: machines, then endpoints.
	kinds []*orphanKind
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
	c := &Controller{
		client: mgr.GetClient(), live: mgr.GetAPIReader(), recorder: mgr.GetEventRecorder("safety-controller"),
		opts: opts, log: mgr.GetLogger().WithName("safety"), over: map[types.UID]time.Time{},
	}
	c.kinds = []*orphanKind{c.machineKind(), c.endpointKind()}
	return mgr.Add(c)
}

// NeedLeaderElection: one replica removes orphans.
func (c *Controller) NeedLeaderElection() bool { return true }

// Start looks every period until ctx ends.
func (c *Controller) Start(ctx context.Context) error {
	tick := time.NewTicker(c.opts.Period)
	defer tick.Stop()
	for {
		for _, k := range c.kinds {
			if err := c.sweep(ctx, k); err != nil && ctx.Err() == nil {
				c.log.Error(err, "Looking for orphans failed", "kind", k.name)
			}
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

// orphanKind is one kind of thing providers make for an object of the
// management plane, keyed by that object's UID.
type orphanKind struct {
	name string
	// list returns what p made; ok is false when p lists none of the kind.
	list func(ctx context.Context, p provider.Provider) (uids []types.UID, ok bool, err error)
	// owners lists the UIDs of the objects that own them.
	owners func(ctx context.Context) (map[types.UID]bool, error)
	remove func(ctx context.Context, p provider.Provider, uid types.UID) error
	// removed counts removals, by provider.
	removed *prometheus.CounterVec
	// seen holds when each orphan was first seen.
	seen map[types.UID]time.Time
}

func (c *Controller) machineKind() *orphanKind {
	return &orphanKind{
		name: "machine",
		list: func(ctx context.Context, p provider.Provider) ([]types.UID, bool, error) {
			l, ok := p.(provider.MachineLister)
			if !ok {
				return nil, false, nil
			}
			uids, err := l.MachineUIDs(ctx)
			return uids, true, err
		},
		owners: func(ctx context.Context) (map[types.UID]bool, error) {
			var list clusterv1.MachineList
			if err := c.live.List(ctx, &list); err != nil {
				return nil, err
			}
			known := make(map[types.UID]bool, len(list.Items))
			for _, m := range list.Items {
				known[clusterv1.InstanceKey(&m)] = true
			}
			return known, nil
		},
		remove:  func(ctx context.Context, p provider.Provider, uid types.UID) error { return p.Delete(ctx, uid) },
		removed: metrics.OrphansRemoved,
		seen:    map[types.UID]time.Time{},
	}
}

func (c *Controller) endpointKind() *orphanKind {
	return &orphanKind{
		name: "endpoint",
		list: func(ctx context.Context, p provider.Provider) ([]types.UID, bool, error) {
			l, ok := p.(provider.EndpointLister)
			if _, canDelete := p.(provider.EndpointProvider); !ok || !canDelete {
				return nil, false, nil
			}
			uids, err := l.ClusterEndpoints(ctx)
			return uids, true, err
		},
		owners: func(ctx context.Context) (map[types.UID]bool, error) {
			var list clusterv1.ClusterList
			if err := c.live.List(ctx, &list); err != nil {
				return nil, err
			}
			known := make(map[types.UID]bool, len(list.Items))
			for _, cl := range list.Items {
				known[clusterv1.InstanceKey(&cl)] = true
			}
			return known, nil
		},
		remove: func(ctx context.Context, p provider.Provider, uid types.UID) error {
			return p.(provider.EndpointProvider).DeleteEndpoint(ctx, uid)
		},
		removed: metrics.OrphanEndpointsRemoved,
		seen:    map[types.UID]time.Time{},
	}
}

// sweep lists, decides and removes the orphans of one kind once.
func (c *Controller) sweep(ctx context.Context, k *orphanKind) error {
	// The providers are listed before the owners: a thing made in between
	// has its owner already (the owner's UID names it).
	made := map[provider.Provider][]types.UID{}
	for _, p := range c.opts.Providers.Providers() {
		uids, ok, err := k.list(ctx, p)
		if err != nil {
			return err
		}
		if ok {
			made[p] = uids
		}
	}
	if len(made) == 0 {
		return nil
	}
	known, err := k.owners(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	next := map[types.UID]time.Time{}
	for p, uids := range made {
		remove, seen := safety.Orphans(uids, known, k.seen, now, c.opts.Grace)
		for uid, at := range seen {
			next[uid] = at
		}
		for _, uid := range remove {
			if err := k.remove(ctx, p, uid); err != nil {
				c.log.Error(err, "Removing an orphan failed", "kind", k.name, "provider", p.Name(), "uid", uid)
				next[uid] = k.seen[uid]
				continue
			}
			k.removed.WithLabelValues(p.Name()).Inc()
			c.log.Info("Removed an orphan", "kind", k.name, "provider", p.Name(), "uid", uid, "orphanFor", c.opts.Grace)
		}
	}
	k.seen = next
	return nil
}

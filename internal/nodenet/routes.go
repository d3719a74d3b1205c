package nodenet

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
)

// Peer is another Node as routing needs it: its pod CIDR, reached through
// its address.
type Peer struct {
	PodCIDR netip.Prefix
	Via     netip.Addr
}

// Route is one route of a machine's namespace to another Node's pods.
type Route struct {
	To  netip.Prefix
	Via netip.Addr
}

func (r Route) String() string { return r.To.String() + " via " + r.Via.String() }

// RoutePlan is what to change in a namespace's routes to peers' pods.
type RoutePlan struct {
	Add    []Route // added, or replaced when the gateway changed
	Remove []Route
}

// Routes plans the routes of a machine's namespace to the other Nodes'
// pods, as kind's kindnet does: each peer's pod CIDR through that peer's
// address, when the address is on the machine's own network (a peer
// elsewhere, an SSH host, is not reachable in one hop and gets no route).
// own is the machine's own pod CIDR, which its pods' bridge serves; have
// are the routes to pods the namespace holds now. The result is sorted.
func Routes(network netip.Prefix, own netip.Prefix, peers []Peer, have []Route) RoutePlan {
	want := map[netip.Prefix]netip.Addr{}
	for _, p := range peers {
		if !p.PodCIDR.IsValid() || !p.Via.IsValid() || p.PodCIDR == own || !network.Contains(p.Via) {
			continue
		}
		if prev, ok := want[p.PodCIDR]; ok && prev.Less(p.Via) {
			continue // two Nodes claim one CIDR: keep one, stably
		}
		want[p.PodCIDR] = p.Via
	}
	var plan RoutePlan
	haveBy := map[netip.Prefix]netip.Addr{}
	for _, r := range have {
		haveBy[r.To] = r.Via
		if via, ok := want[r.To]; !ok || via != r.Via {
			if !ok {
				plan.Remove = append(plan.Remove, r)
			}
		}
	}
	for to, via := range want {
		if cur, ok := haveBy[to]; !ok || cur != via {
			plan.Add = append(plan.Add, Route{To: to, Via: via})
		}
	}
	sortRoutes(plan.Add)
	sortRoutes(plan.Remove)
	return plan
}

func sortRoutes(rs []Route) {
	sort.Slice(rs, func(i, j int) bool { return rs[i].To.String() < rs[j].To.String() })
}

// PodRoutes lists the routes of namespace ns that go through a gateway on
// eth0 (those Apply made), the default route aside.
func PodRoutes(ctx context.Context, ns string) ([]Route, error) {
	out, err := ipOutput(ctx, ns, "-4", "route", "show", "dev", "eth0")
	if err != nil {
		return nil, err
	}
	var routes []Route
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] == "default" || f[1] != "via" {
			continue
		}
		to, err1 := netip.ParsePrefix(f[0])
		via, err2 := netip.ParseAddr(f[2])
		if err1 != nil || err2 != nil {
			continue
		}
		routes = append(routes, Route{To: to, Via: via})
	}
	return routes, nil
}

// Apply carries plan out in namespace ns.
func Apply(ctx context.Context, ns string, plan RoutePlan) error {
	for _, r := range plan.Remove {
		if err := ip(ctx, ns, "route", "del", r.To.String(), "via", r.Via.String(), "dev", "eth0"); err != nil {
			return fmt.Errorf("removing the route %s: %w", r, err)
		}
	}
	for _, r := range plan.Add {
		if err := ip(ctx, ns, "route", "replace", r.To.String(), "via", r.Via.String(), "dev", "eth0"); err != nil {
			return fmt.Errorf("adding the route %s: %w", r, err)
		}
	}
	return nil
}

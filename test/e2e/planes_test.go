package e2e

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
)

// Issue 34: management planes side by side on one host (as the e2e tests
// now run) never take one another's addresses or ports. Three marina up
// run at once, each makes examples/minimal, all three clusters are Ready
// together, and no port of a plane, no machine's address and no cluster
// endpoint is held by two of them.
func TestThreePlanesAtOnceShareNoAddressOrPort(t *testing.T) {
	t.Parallel()
	type plane struct {
		u *upProcess
		c client.Client
	}
	var planes []plane
	for range 3 {
		u, _, c := startUpWithClient(t)
		planes = append(planes, plane{u, c})
	}
	// Applied together, so that the three planes pick their machines' and
	// endpoints' addresses at the same time.
	for _, p := range planes {
		p.u.applyExample(t, "minimal")
	}
	ctx := context.Background()
	key := types.NamespacedName{Namespace: "default", Name: "minimal"}
	for i, p := range planes {
		testenv.Eventually(t, 4*time.Minute, fmt.Sprintf("plane %d: cluster minimal Ready with its 3 machines Running", i), func() error { return clusterReady(ctx, p.c, key, 3) })
	}

	holder := map[string]string{}
	hold := func(what, by string) {
		if other, ok := holder[what]; ok {
			t.Errorf("%s is held by %s and by %s", what, other, by)
		}
		holder[what] = by
	}
	for i, p := range planes {
		for _, port := range p.u.ports {
			hold(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), fmt.Sprintf("plane %d", i))
		}
		cluster := &clusterv1.Cluster{}
		if err := p.c.Get(ctx, key, cluster); err != nil {
			t.Fatal(err)
		}
		// An endpoint, like a machine, takes its whole address.
		hold(cluster.Spec.ControlPlaneEndpoint.Host, fmt.Sprintf("plane %d's cluster endpoint", i))
		machines := &clusterv1.MachineList{}
		if err := p.c.List(ctx, machines); err != nil {
			t.Fatal(err)
		}
		for _, m := range machines.Items {
			ips := 0
			for _, a := range m.Status.Addresses {
				if net.ParseIP(a.Address) != nil { // not its host name
					hold(a.Address, fmt.Sprintf("plane %d's machine %s", i, m.Name))
					ips++
				}
			}
			if ips == 0 {
				t.Errorf("plane %d: machine %s reports no IP address: %v", i, m.Name, m.Status.Addresses)
			}
		}
	}
	t.Logf("%d addresses and ports, each held once: %v", len(holder), holder)
}

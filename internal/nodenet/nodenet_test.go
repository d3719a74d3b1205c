package nodenet

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
)

// TestEnsureAndRemove makes a bridge and two machines' networks twice (a
// second call changes nothing), checks each machine's address and route,
// then removes them and finds nothing left.
func TestEnsureAndRemove(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	ctx := context.Background()
	b := Bridge{Name: fmt.Sprintf("mtb%d", os.Getpid()%100000), Gateway: netip.MustParsePrefix("10.232.0.1/16")}
	machines := []Machine{
		ForMachine(fmt.Sprintf("test-a-%d", os.Getpid()), netip.MustParsePrefix("10.232.0.11/16")),
		ForMachine(fmt.Sprintf("test-b-%d", os.Getpid()), netip.MustParsePrefix("10.232.0.12/16")),
	}
	for i := range machines {
		machines[i].APIAddress = APIAddress(b.Gateway)
	}
	t.Cleanup(func() {
		for _, m := range machines {
			_ = Remove(ctx, m)
		}
		_ = RemoveBridge(ctx, b.Name)
	})
	for range 2 {
		if err := EnsureBridge(ctx, b); err != nil {
			t.Fatal(err)
		}
		for _, m := range machines {
			if err := Ensure(ctx, b, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, m := range machines {
		out, err := ipOutput(ctx, m.NetNS, "-o", "addr", "show", "dev", "eth0")
		if err != nil || strings.Count(string(out), " inet ") != 1 || !strings.Contains(string(out), m.Address.String()) {
			t.Errorf("%s: eth0 has %q (%v), want the one address %s", m.NetNS, out, err, m.Address)
		}
		out, err = ipOutput(ctx, m.NetNS, "-o", "addr", "show", "dev", "lo")
		if err != nil || !strings.Contains(string(out), " 10.232.255.254/32 ") {
			t.Errorf("%s: lo has %q (%v), want the API address 10.232.255.254/32", m.NetNS, out, err)
		}
		out, err = ipOutput(ctx, m.NetNS, "route", "show", "default")
		if err != nil || !strings.Contains(string(out), "via 10.232.0.1 dev eth0") {
			t.Errorf("%s: default route %q (%v), want via the bridge", m.NetNS, out, err)
		}
	}
	plan := RoutePlan{Add: []Route{{To: netip.MustParsePrefix("10.244.7.0/24"), Via: machines[1].Address.Addr()}}}
	if err := Apply(ctx, machines[0].NetNS, plan); err != nil {
		t.Fatal(err)
	}
	if got, err := PodRoutes(ctx, machines[0].NetNS); err != nil || len(got) != 1 || got[0] != plan.Add[0] {
		t.Errorf("PodRoutes = %v (%v), want %v", got, err, plan.Add)
	}
	for _, m := range machines {
		if err := Remove(ctx, m); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(m.NetNSPath()); !os.IsNotExist(err) {
			t.Errorf("%s still exists (%v)", m.NetNSPath(), err)
		}
		if linkExists(ctx, "", m.HostVeth) {
			t.Errorf("veth %s still exists", m.HostVeth)
		}
	}
	if err := RemoveBridge(ctx, b.Name); err != nil || linkExists(ctx, "", b.Name) {
		t.Errorf("bridge %s not removed (%v)", b.Name, err)
	}
}

func TestAPIAddress(t *testing.T) {
	for network, want := range map[string]string{
		"10.231.0.0/16":  "10.231.255.254",
		"10.231.7.9/16":  "10.231.255.254", // host bits ignored
		"192.168.4.0/24": "192.168.4.254",
		"10.0.0.0/8":     "10.255.255.254",
	} {
		if got := APIAddress(netip.MustParsePrefix(network)); got.String() != want {
			t.Errorf("APIAddress(%s) = %s, want %s", network, got, want)
		}
	}
}

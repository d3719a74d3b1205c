package nodenet

import (
	"net/netip"
	"reflect"
	"testing"
)

func TestRoutes(t *testing.T) {
	network := netip.MustParsePrefix("10.231.0.0/16")
	own := netip.MustParsePrefix("10.244.1.0/24")
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	tests := []struct {
		name  string
		peers []Peer
		have  []Route
		want  RoutePlan
	}{
		{name: "no peers, nothing to do"},
		{
			name:  "a peer's pods through its address",
			peers: []Peer{{PodCIDR: p("10.244.2.0/24"), Via: a("10.231.0.12")}},
			want:  RoutePlan{Add: []Route{{To: p("10.244.2.0/24"), Via: a("10.231.0.12")}}},
		},
		{
			name:  "our own CIDR and peers without a CIDR or off the network get none",
			peers: []Peer{{PodCIDR: own, Via: a("10.231.0.11")}, {Via: a("10.231.0.13")}, {PodCIDR: p("10.244.4.0/24"), Via: a("10.77.0.11")}},
		},
		{
			name:  "a route already there is kept",
			peers: []Peer{{PodCIDR: p("10.244.2.0/24"), Via: a("10.231.0.12")}},
			have:  []Route{{To: p("10.244.2.0/24"), Via: a("10.231.0.12")}},
		},
		{
			name: "a gone peer's route is removed",
			have: []Route{{To: p("10.244.2.0/24"), Via: a("10.231.0.12")}},
			want: RoutePlan{Remove: []Route{{To: p("10.244.2.0/24"), Via: a("10.231.0.12")}}},
		},
		{
			name:  "a peer that moved is routed through its new address (replace)",
			peers: []Peer{{PodCIDR: p("10.244.2.0/24"), Via: a("10.231.0.14")}},
			have:  []Route{{To: p("10.244.2.0/24"), Via: a("10.231.0.12")}},
			want:  RoutePlan{Add: []Route{{To: p("10.244.2.0/24"), Via: a("10.231.0.14")}}},
		},
		{
			name:  "two Nodes with one CIDR: the lower address, whatever the order",
			peers: []Peer{{PodCIDR: p("10.244.2.0/24"), Via: a("10.231.0.15")}, {PodCIDR: p("10.244.2.0/24"), Via: a("10.231.0.12")}},
			want:  RoutePlan{Add: []Route{{To: p("10.244.2.0/24"), Via: a("10.231.0.12")}}},
		},
		{
			name:  "sorted",
			peers: []Peer{{PodCIDR: p("10.244.3.0/24"), Via: a("10.231.0.13")}, {PodCIDR: p("10.244.2.0/24"), Via: a("10.231.0.12")}},
			want:  RoutePlan{Add: []Route{{To: p("10.244.2.0/24"), Via: a("10.231.0.12")}, {To: p("10.244.3.0/24"), Via: a("10.231.0.13")}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Routes(network, own, tt.peers, tt.have)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Routes() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

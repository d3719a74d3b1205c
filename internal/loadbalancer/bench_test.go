package loadbalancer

import (
	"testing"

	"k8s.io/klog/v2"
)

// BenchmarkConnection measures one request on a new TLS connection, to a
// backend directly and through the balancer: the difference is what the
// balancer adds to a connection (accept, pick, dial, two copiers).
func BenchmarkConnection(b *testing.B) {
	p := newTestPKI(b)
	be := newBackend(b, p, "b0", true)
	lb, addr, _ := startBalancer(b, Config{Backends: []string{be.addr}, HealthCheck: fastCheck(p), Log: klog.Background().V(10)})
	waitHealthy(b, lb, true, be)
	for _, target := range []struct{ name, addr string }{{"direct", be.addr}, {"balancer", addr}} {
		b.Run(target.name, func(b *testing.B) {
			c := client(p)
			for b.Loop() {
				if _, err := whoami(c, target.addr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

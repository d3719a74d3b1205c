package components

import "time"

// Backoff defaults. A control-plane component that crashes costs the
// cluster its availability until it is back, so the first restart comes
// after a second (the kubelet's 10 s is tuned for workloads, not for the
// API server); doubling to 30 s keeps a component that cannot start (a port
// taken, etcd not yet up) from spinning, and bounds how long it waits once
// its cause is fixed. A process that ran a minute (several times the start-up
// of kube-apiserver) got past its start-up: its next exit is a new failure
// and starts again from the first delay.
const (
	DefaultInitialBackoff = time.Second
	DefaultMaxBackoff     = 30 * time.Second
	DefaultBackoffReset   = time.Minute
)

// backoff is the delay before starting a component again after its n-th
// consecutive failure (n >= 1): initial, doubling, at most max.
func backoff(n int, initial, max time.Duration) time.Duration {
	d := initial
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// Package local is marina's default provider: a LocalMachine is a sandbox on
// this host, with no cloud and no container engine. A sandbox is a directory
// under the provider's root named by the Machine's UID, holding the
// machine's bootstrap, its own loopback address (127.x.y.z), and a detached
// `marina node-agent` process that plays the machine's kubelet and outlives
// the controller that started it.
//
// Every method converges after a crash at any point: a sandbox appears by
// rename, complete or not at all; it disappears by rename to a tombstone;
// and "the agent runs" means "the agent holds the sandbox's lock", which no
// stale PID file can fake.
package local

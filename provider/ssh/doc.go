// Package ssh is the SSH provider: it makes machines of hosts people already
// own (servers in a lab, at an edge site, in a CI farm), reached over SSH.
// A machine claims one free host of a list (the claim is a directory on the
// host holding the Machine's UID, made atomically), gets the node agent,
// its component binaries and its bootstrap bundle copied over, and the
// operator's provisioning templates (a ConfigMap; defaults are embedded)
// run there, step by step. Delete runs the deprovision templates and
// releases the host.
package ssh

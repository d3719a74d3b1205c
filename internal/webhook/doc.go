// Package webhook is marina's validating admission webhook. It refuses at
// apply time what the controllers would otherwise refuse only after the
// object is stored: the syntax rules Kubernetes applies to the same kind of
// values (internal/validation), and the rules that need another object to
// judge (the MachineClass a machine names exists and allows its overrides,
// the providerSpec passes its provider's checks, a kubelet is not newer than
// its Cluster's control plane, a control-plane version is one the provider
// can run).
//
// The webhook's configuration is generated from the markers in this package
// into config/webhook; `marina up` installs it pointing at its in-process
// server on loopback, `marina controller` at its Service. Its failure policy
// is Fail: when marina's webhook cannot be reached, writes of marina's kinds
// are refused, so nothing unchecked is ever stored.
package webhook

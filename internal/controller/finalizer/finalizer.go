// Package finalizer handles a controller's finalizer that was renamed: the
// objects an earlier marina made carry the legacy name, which is honoured
// as the current one and replaced by it.
package finalizer

import (
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// Name is a finalizer and the name it had before.
type Name struct{ Current, Legacy string }

// Held reports whether o carries the finalizer under either name.
func (n Name) Held(o client.Object) bool {
	return controllerutil.ContainsFinalizer(o, n.Current) || controllerutil.ContainsFinalizer(o, n.Legacy)
}

// Set reports whether o carries the current name and not the legacy one.
func (n Name) Set(o client.Object) bool {
	return controllerutil.ContainsFinalizer(o, n.Current) && !controllerutil.ContainsFinalizer(o, n.Legacy)
}

// Add puts the current name on o and takes the legacy one off.
func (n Name) Add(o client.Object) {
	controllerutil.AddFinalizer(o, n.Current)
	controllerutil.RemoveFinalizer(o, n.Legacy)
}

// Remove takes both names off o.
func (n Name) Remove(o client.Object) {
	controllerutil.RemoveFinalizer(o, n.Current)
	controllerutil.RemoveFinalizer(o, n.Legacy)
}

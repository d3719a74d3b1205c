package provider

// ObjectRef names an object of a machine's namespace that its providerSpec
// uses.
type ObjectRef struct {
	// Kind is Secret or ConfigMap.
	Kind string
	Name string
}

// Moving is what `marina move` must know of a provider's machines. The
// move runs from the command line, where no provider runs, so each
// provider package exports it as a value rather than a method.
type Moving struct {
	// References lists the objects a providerSpec of the provider's kinds
	// names beyond the `*SecretRef` fields every spec's walk finds (a
	// ConfigMap of hosts or templates): they move with the machines that
	// use them, or the target could not scale up nor delete. spec is the
	// providerSpec's own spec, as decoded JSON, possibly partial (a
	// Machine's overrides of its class).
	References func(spec map[string]any) []ObjectRef
	// Refusal, when set, says why the provider's machines cannot change
	// management plane: a move of a namespace that holds one is refused,
	// naming it, before anything is paused.
	Refusal string
}

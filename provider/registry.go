package provider

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Registry maps providerSpec kinds to the providers that own them.
type Registry struct {
	byKind map[schema.GroupVersionKind]Provider
}

// NewRegistry registers providers; two providers may not own the same kind.
func NewRegistry(providers ...Provider) (*Registry, error) {
	r := &Registry{byKind: map[schema.GroupVersionKind]Provider{}}
	for _, p := range providers {
		for _, k := range p.Kinds() {
			if other, ok := r.byKind[k]; ok {
				return nil, fmt.Errorf("providers %q and %q both own kind %s", other.Name(), p.Name(), k)
			}
			r.byKind[k] = p
		}
	}
	return r, nil
}

// For returns the provider that owns gvk, or nil.
func (r *Registry) For(gvk schema.GroupVersionKind) Provider { return r.byKind[gvk] }

// Kinds lists every registered kind.
func (r *Registry) Kinds() []schema.GroupVersionKind {
	out := make([]schema.GroupVersionKind, 0, len(r.byKind))
	for k := range r.byKind {
		out = append(out, k)
	}
	return out
}

// Providers lists every registered provider once.
func (r *Registry) Providers() []Provider {
	var out []Provider
	seen := map[Provider]bool{}
	for _, p := range r.byKind {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

package capabilities

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"marina.dev/marina/provider"
)

const (
	// Namespace and Name of the ConfigMap the controller publishes.
	// Namespace is marina's own (install.Namespace, which imports this
	// package's importers).
	Namespace = "marina-system"
	Name      = "marina-capabilities"
	// ProvidersKey is the ConfigMap's key holding the providers, as YAML.
	ProvidersKey = "providers"
)

// Capabilities are what the controller can do.
type Capabilities struct {
	// Providers are those running in the controller, by name.
	Providers []Provider `json:"providers"`
}

// Provider is one provider running in the controller.
type Provider struct {
	// Name is the provider's name, as in conditions.
	Name string `json:"name"`
	// Kinds are the providerSpec kinds it owns, as group/version/Kind.
	Kinds []string `json:"kinds"`
	// KubernetesVersions are the control-plane versions it can run, oldest
	// first, unless AnyKubernetesVersion.
	KubernetesVersions []string `json:"kubernetesVersions,omitempty"`
	// AnyKubernetesVersion says the provider does not restrict them.
	AnyKubernetesVersion bool `json:"anyKubernetesVersion,omitempty"`
}

// Of lists what the providers of registry can do, sorted by name. It asks
// each provider that implements provider.VersionLister.
func Of(registry *provider.Registry) (*Capabilities, error) {
	caps := &Capabilities{Providers: []Provider{}}
	for _, p := range registry.Providers() {
		out := Provider{Name: p.Name(), AnyKubernetesVersion: true}
		for _, k := range p.Kinds() {
			out.Kinds = append(out.Kinds, provider.FormatKind(k))
		}
		slices.Sort(out.Kinds)
		if lister, ok := p.(provider.VersionLister); ok {
			versions, err := lister.KubernetesVersions()
			if err != nil {
				return nil, fmt.Errorf("listing the versions provider %s can run: %w", p.Name(), err)
			}
			if versions != nil {
				out.KubernetesVersions, out.AnyKubernetesVersion = versions, false
			}
		}
		caps.Providers = append(caps.Providers, out)
	}
	slices.SortFunc(caps.Providers, func(a, b Provider) int { return strings.Compare(a.Name, b.Name) })
	return caps, nil
}

// For returns the provider that owns kind, if one runs in the controller.
func (c *Capabilities) For(kind schema.GroupVersionKind) (Provider, bool) {
	for _, p := range c.Providers {
		if slices.Contains(p.Kinds, provider.FormatKind(kind)) {
			return p, true
		}
	}
	return Provider{}, false
}

// CanRun reports whether the provider runs control planes of version.
func (p Provider) CanRun(version string) bool {
	return p.AnyKubernetesVersion || slices.Contains(p.KubernetesVersions, version)
}

// ErrNotPublished is returned by Read when no controller has published its
// capabilities.
var ErrNotPublished = errors.New("no marina controller has published which Kubernetes versions it can run (ConfigMap " + Namespace + "/" + Name + " does not exist): is it running? marina up and marina controller publish it when they start")

// Read reads the capabilities the controller published; ErrNotPublished
// when there are none.
func Read(ctx context.Context, c client.Reader) (*Capabilities, error) {
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: Namespace, Name: Name}, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, ErrNotPublished
		}
		return nil, fmt.Errorf("reading ConfigMap %s/%s, where the controller says what it can run: %w", Namespace, Name, err)
	}
	caps := &Capabilities{}
	if err := yaml.Unmarshal([]byte(cm.Data[ProvidersKey]), &caps.Providers); err != nil {
		return nil, fmt.Errorf("reading key %s of ConfigMap %s/%s: %w", ProvidersKey, Namespace, Name, err)
	}
	return caps, nil
}

// encode is the ConfigMap's data for caps.
func encode(caps *Capabilities) (map[string]string, error) {
	data, err := yaml.Marshal(caps.Providers)
	if err != nil {
		return nil, err
	}
	return map[string]string{ProvidersKey: string(data)}, nil
}

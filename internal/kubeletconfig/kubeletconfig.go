// Package kubeletconfig reads the kubelet configurations machines are
// given by reference (spec.kubeletConfigRef, M16): a ConfigMap whose key
// "kubelet" holds a KubeletConfiguration document. Versioned by its
// ConfigMap's name, a configuration reaches a fleet as any template change
// does: a MachineDeployment that names another ConfigMap rolls its
// machines a few at a time.
package kubeletconfig

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"
)

// Key is the ConfigMap key holding the document.
const Key = "kubelet"

// Config is a checked kubelet configuration: the document, and the fields
// a simulated kubelet applies.
type Config struct {
	// Name is the ConfigMap's name.
	Name string
	// Data is the document as given.
	Data []byte
	// MaxPods is the document's maxPods; 0 when unset.
	MaxPods int32
}

// Hash is the first 16 hex digits of the document's sha256: what the
// agent reports, so a changed document under the same name shows.
func (c *Config) Hash() string {
	sum := sha256.Sum256(c.Data)
	return hex.EncodeToString(sum[:])[:16]
}

// Reported is the value of the Node's kubelet-config annotation.
func (c *Config) Reported() string { return c.Name + "/" + c.Hash() }

// ParseReported splits a Node's kubelet-config annotation.
func ParseReported(v string) (name, hash string, ok bool) {
	name, hash, ok = strings.Cut(v, "/")
	return name, hash, ok && name != "" && hash != ""
}

// document is the part of a KubeletConfiguration checked here; other
// fields are passed on as they are.
type document struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	MaxPods    *int32 `json:"maxPods,omitempty"`
}

// Parse checks the document of ConfigMap name: a KubeletConfiguration of
// kubelet.config.k8s.io/v1beta1 (the only version the kubelet reads), with
// a sane maxPods. Its errors say what to fix.
func Parse(name string, data []byte) (*Config, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("configmap %s has no key %q: put a KubeletConfiguration document there", name, Key)
	}
	var d document
	if err := yaml.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("configmap %s, key %q: not a YAML or JSON document: %w", name, Key, err)
	}
	if d.APIVersion != "kubelet.config.k8s.io/v1beta1" || d.Kind != "KubeletConfiguration" {
		return nil, fmt.Errorf("configmap %s, key %q: apiVersion %q and kind %q, want kubelet.config.k8s.io/v1beta1 KubeletConfiguration",
			name, Key, d.APIVersion, d.Kind)
	}
	c := &Config{Name: name, Data: data}
	if d.MaxPods != nil {
		if *d.MaxPods < 1 || *d.MaxPods > 1000 {
			return nil, fmt.Errorf("configmap %s, key %q: maxPods %d is out of range 1..1000", name, Key, *d.MaxPods)
		}
		c.MaxPods = *d.MaxPods
	}
	return c, nil
}

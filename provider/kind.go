package provider

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// FormatKind writes a providerSpec kind as "group/version/Kind", the form
// flags and annotations use.
func FormatKind(gvk schema.GroupVersionKind) string {
	return gvk.Group + "/" + gvk.Version + "/" + gvk.Kind
}

// ParseKind reads "group/version/Kind".
func ParseKind(s string) (schema.GroupVersionKind, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 || parts[1] == "" || parts[2] == "" {
		return schema.GroupVersionKind{}, fmt.Errorf("kind %q: want group/version/Kind, e.g. ssh.marina.dev/v1alpha1/SSHMachine", s)
	}
	return schema.GroupVersionKind{Group: parts[0], Version: parts[1], Kind: parts[2]}, nil
}

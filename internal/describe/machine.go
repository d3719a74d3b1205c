package describe

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// MachineView is what marina describe machine shows; the machine's class and
// provider configuration hold no secret (credentials live in Secrets,
// which it never reads).
type MachineView struct {
	Machine      *clusterv1.Machine `json:"machine"`
	Class        string             `json:"class,omitempty"`
	ProviderSpec json.RawMessage    `json:"mergedProviderSpec,omitempty"`
	NodeLabels   map[string]string  `json:"nodeLabels,omitempty"`
	NodeTaints   []corev1.Taint     `json:"nodeTaints,omitempty"`
	MergeError   string             `json:"mergeError,omitempty"`
	// ClassGone: the machine's class was deleted after the machine was made.
	ClassGone bool `json:"classGone,omitempty"`
}

// PrintMachine writes v for a person: the machine's line and every
// condition, its provider ID, Node and class, and the merged provider
// configuration.
func PrintMachine(w io.Writer, v MachineView, now time.Time, o Options) error {
	m := v.Machine
	fmt.Fprintf(w, "Machine %s/%s (cluster %s, roles %v)\n", m.Namespace, m.Name, m.Spec.ClusterName, m.Spec.Roles)
	if err := Render(w, Machine(m, now), o); err != nil {
		return err
	}
	fmt.Fprintf(w, "Provider ID: %s\n", dash(m.Status.ProviderID))
	if m.Status.NodeRef != nil {
		fmt.Fprintf(w, "Node: %s\n", m.Status.NodeRef.Name)
	}
	switch {
	case v.ClassGone:
		fmt.Fprintf(w, "Class: %s (deleted: the machine runs on, but no machine of this class can be made until it is published again)\n", v.Class)
	case v.Class != "":
		fmt.Fprintf(w, "Class: %s\n", v.Class)
	}
	if v.MergeError != "" {
		fmt.Fprintf(w, "Provider configuration: cannot be merged: %s\n", v.MergeError)
		return nil
	}
	spec, err := yaml.JSONToYAML(v.ProviderSpec)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Merged provider configuration:\n%s", indent(string(spec)))
	if len(v.NodeLabels) > 0 {
		labels, _ := yaml.Marshal(v.NodeLabels)
		fmt.Fprintf(w, "Node labels:\n%s", indent(string(labels)))
	}
	if len(v.NodeTaints) > 0 {
		taints, _ := yaml.Marshal(v.NodeTaints)
		fmt.Fprintf(w, "Node taints:\n%s", indent(string(taints)))
	}
	return nil
}

func indent(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("  " + line + "\n")
	}
	return b.String()
}

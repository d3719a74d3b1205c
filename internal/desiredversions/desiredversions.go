// Package desiredversions is the format of the versions a machine's
// components should run when they differ from those it was made with: the
// value of its Node's annotation cluster.marina.dev/desired-versions,
// which the machine controller writes during an InPlace upgrade (M12), and
// the agent's own copy in its sandbox. It is the contract between the two,
// so it belongs to neither: controllers know no agent (issue 35).
package desiredversions

import (
	"encoding/json"
	"fmt"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// Versions are the desired versions. Empty fields keep the versions the
// machine was made with.
type Versions struct {
	Kubelet      string                      `json:"kubelet,omitempty"`
	ControlPlane clusterv1.ComponentVersions `json:"controlPlane,omitempty"`
	// Settings are the component settings by version, for the versions
	// an upgrade moved components to; a component at another version
	// runs the settings the machine was made with.
	Settings map[string]clusterv1.ControlPlaneComponents `json:"settings,omitempty"`
}

// Encode is the annotation's value that asks a machine's agent to run v.
func Encode(v Versions) (string, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encoding the desired versions: %w", err)
	}
	return string(data), nil
}

// Decode reads the annotation's value.
func Decode(raw string) (Versions, error) {
	var v Versions
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return v, fmt.Errorf("annotation %s is not the JSON of the desired versions: %w", clusterv1.DesiredVersionsAnnotation, err)
	}
	return v, nil
}

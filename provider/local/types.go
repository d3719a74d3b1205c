package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "sigs.k8s.io/json"

	"marina.dev/marina/provider"
)

// GroupVersion is the API group and version of LocalMachine.
var GroupVersion = schema.GroupVersion{Group: "local.marina.dev", Version: "v1alpha1"}

// Kind is the providerSpec kind this provider owns.
const Kind = "LocalMachine"

// Defaults and limits of a LocalMachine.
const (
	// DefaultPods is the pod capacity when spec.pods is unset, the kubelet's.
	DefaultPods = 110
	// MaxPods is the largest spec.pods accepted.
	MaxPods = 1000
)

// GPUResource is the extended resource a LocalMachine's GPUs appear as.
const GPUResource = "nvidia.com/gpu"

// LocalMachine is the providerSpec of a machine on the local provider, e.g.
//
//	apiVersion: local.marina.dev/v1alpha1
//	kind: LocalMachine
//	spec: {cpu: 2, memory: 4Gi, pods: 110, gpus: 0, diskSize: 40Gi}
type LocalMachine struct {
	metav1.TypeMeta `json:",inline"`
	// Metadata is accepted, as on any embedded object, and ignored.
	Metadata metav1.ObjectMeta `json:"metadata,omitempty"`
	// Spec is the simulated machine's size.
	Spec LocalMachineSpec `json:"spec"`
}

// LocalMachineSpec is the size a local machine's Node reports.
type LocalMachineSpec struct {
	// CPU is the Node's cpu capacity, e.g. 2 or 500m. Required.
	CPU resource.Quantity `json:"cpu"`
	// Memory is the Node's memory capacity, e.g. 4Gi. Required.
	Memory resource.Quantity `json:"memory"`
	// Pods is the Node's pod capacity, 1 to 1000; DefaultPods when unset.
	Pods int `json:"pods,omitempty"`
	// GPUs is the Node's nvidia.com/gpu capacity; none when 0.
	GPUs int `json:"gpus,omitempty"`
	// DiskSize is the Node's ephemeral-storage capacity, e.g. 40Gi; the
	// Node reports none when unset.
	DiskSize *resource.Quantity `json:"diskSize,omitempty"`
	// Agent says how the machine's agent runs: Process (the default), one
	// process of its own; or Pooled, a member of its cluster's pool, one
	// process running the agents of many workers (docs/providers.md).
	// Control-plane machines run as processes only.
	Agent AgentMode `json:"agent,omitempty"`
	// Kubelet says what plays the machine's kubelet: Simulated (the
	// default), marina's light agent, which reports the pods bound to the
	// Node as running without running them (for fleets of hundreds of
	// nodes on one host); or Real, the kubelet of the machine's version
	// with its own containerd, runc and CNI bridge in a network namespace
	// of its own, whose pods really run (issue 32, docs/providers.md).
	// Real is for workers, with agent Process.
	Kubelet KubeletMode `json:"kubelet,omitempty"`
}

// KubeletMode is what plays a local machine's kubelet.
type KubeletMode string

const (
	KubeletSimulated KubeletMode = "Simulated"
	KubeletReal      KubeletMode = "Real"
)

// AgentMode is how a local machine's agent runs.
type AgentMode string

const (
	AgentProcess AgentMode = "Process"
	AgentPooled  AgentMode = "Pooled"
)

// specFields are the fields of spec, in the order errors report them.
var specFields = []string{"cpu", "memory", "pods", "gpus", "diskSize", "agent", "kubelet"}

// Decode decodes and checks a LocalMachine blob (JSON), filling in
// defaults. Every problem the user must fix is a *provider.InvalidSpecError
// naming the field.
func Decode(raw []byte) (*LocalMachine, error) {
	if len(raw) == 0 {
		return nil, &provider.InvalidSpecError{Message: "providerSpec is empty: set apiVersion: local.marina.dev/v1alpha1, kind: LocalMachine and spec"}
	}
	// The kind first: the other checks mean nothing for another kind.
	var tm metav1.TypeMeta
	if err := json.Unmarshal(raw, &tm); err != nil {
		return nil, &provider.InvalidSpecError{Message: "providerSpec is not a JSON object: " + err.Error()}
	}
	if tm.Kind != Kind {
		return nil, &provider.InvalidSpecError{Field: "kind", Message: fmt.Sprintf("the local provider takes kind %s, not %q", Kind, tm.Kind)}
	}
	if tm.APIVersion != GroupVersion.String() {
		return nil, &provider.InvalidSpecError{Field: "apiVersion", Message: fmt.Sprintf("%s is served as %s, not %q", Kind, GroupVersion, tm.APIVersion)}
	}

	// spec is decoded field by field, so that each error names its field.
	var shape struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        metav1.ObjectMeta          `json:"metadata,omitempty"`
		Spec            map[string]json.RawMessage `json:"spec"`
	}
	strict, err := kjson.UnmarshalStrict(raw, &shape)
	if err != nil {
		return nil, &provider.InvalidSpecError{Message: "cannot decode providerSpec: " + err.Error()}
	}
	if err := firstStrictError(strict); err != nil {
		return nil, err
	}
	var unknown []string
	for k := range shape.Spec {
		if !slices.Contains(specFields, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, &provider.InvalidSpecError{Field: "spec." + unknown[0], Message: fmt.Sprintf("unknown field; a LocalMachine spec has %s", strings.Join(specFields, ", "))}
	}

	m := &LocalMachine{TypeMeta: tm, Metadata: shape.Metadata, Spec: LocalMachineSpec{Pods: DefaultPods, Agent: AgentProcess, Kubelet: KubeletSimulated}}
	var errs []error
	if m.Spec.CPU, err = positiveQuantity(shape.Spec, "cpu", "2 or 500m"); err != nil {
		errs = append(errs, err)
	}
	if m.Spec.Memory, err = positiveQuantity(shape.Spec, "memory", "4Gi"); err != nil {
		errs = append(errs, err)
	}
	if v, ok := shape.Spec["pods"]; ok {
		if err := json.Unmarshal(v, &m.Spec.Pods); err != nil || m.Spec.Pods < 1 || m.Spec.Pods > MaxPods {
			errs = append(errs, &provider.InvalidSpecError{Field: "spec.pods", Message: fmt.Sprintf("must be a whole number from 1 to %d (the default is %d), not %s", MaxPods, DefaultPods, v)})
		}
	}
	if v, ok := shape.Spec["gpus"]; ok {
		if err := json.Unmarshal(v, &m.Spec.GPUs); err != nil || m.Spec.GPUs < 0 {
			errs = append(errs, &provider.InvalidSpecError{Field: "spec.gpus", Message: fmt.Sprintf("must be a whole number, 0 or more, not %s", v)})
		}
	}
	if _, ok := shape.Spec["diskSize"]; ok {
		q, err := positiveQuantity(shape.Spec, "diskSize", "40Gi")
		if err != nil {
			errs = append(errs, err)
		} else {
			m.Spec.DiskSize = &q
		}
	}
	if v, ok := shape.Spec["agent"]; ok {
		if err := json.Unmarshal(v, &m.Spec.Agent); err != nil || (m.Spec.Agent != AgentProcess && m.Spec.Agent != AgentPooled) {
			errs = append(errs, &provider.InvalidSpecError{Field: "spec.agent", Message: fmt.Sprintf("must be %s or %s, not %s", AgentProcess, AgentPooled, v)})
		}
	}
	if v, ok := shape.Spec["kubelet"]; ok {
		if err := json.Unmarshal(v, &m.Spec.Kubelet); err != nil || (m.Spec.Kubelet != KubeletSimulated && m.Spec.Kubelet != KubeletReal) {
			errs = append(errs, &provider.InvalidSpecError{Field: "spec.kubelet", Message: fmt.Sprintf("must be %s or %s, not %s", KubeletSimulated, KubeletReal, v)})
		} else if m.Spec.Kubelet == KubeletReal && m.Spec.Agent == AgentPooled {
			errs = append(errs, &provider.InvalidSpecError{Field: "spec.kubelet", Message: "a Real kubelet runs in a machine of its own: set agent to Process (or leave it out), or kubelet to Simulated"})
		}
	}
	if len(errs) > 0 {
		return nil, errs[0] // the first, in field order: one fix at a time
	}
	return m, nil
}

// firstStrictError turns the first unknown or duplicate field into an
// InvalidSpecError naming it.
func firstStrictError(strict []error) error {
	if len(strict) == 0 {
		return nil
	}
	var fe kjson.FieldError
	if errors.As(strict[0], &fe) {
		msg := strict[0].Error()
		if strings.HasPrefix(msg, "unknown field") {
			msg = "unknown field; a LocalMachine has apiVersion, kind, metadata and spec"
		}
		return &provider.InvalidSpecError{Field: fe.FieldPath(), Message: msg}
	}
	return &provider.InvalidSpecError{Message: strict[0].Error()}
}

// positiveQuantity parses the required quantity spec.<name>.
func positiveQuantity(spec map[string]json.RawMessage, name, example string) (resource.Quantity, error) {
	field := "spec." + name
	v, ok := spec[name]
	if !ok || string(v) == "null" {
		return resource.Quantity{}, &provider.InvalidSpecError{Field: field, Message: "is required: set it to a quantity such as " + example}
	}
	var q resource.Quantity
	if err := json.Unmarshal(v, &q); err != nil {
		return resource.Quantity{}, &provider.InvalidSpecError{Field: field, Message: fmt.Sprintf("%s is not a quantity; write it like %s", v, example)}
	}
	if q.Sign() <= 0 {
		return resource.Quantity{}, &provider.InvalidSpecError{Field: field, Message: fmt.Sprintf("must be greater than 0, e.g. %s, not %s", example, q.String())}
	}
	return q, nil
}

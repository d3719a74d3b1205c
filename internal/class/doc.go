// Package class resolves a Machine's provider configuration and Node template
// from its MachineClass and its own overrides (M5, M6, M7). Merge is the one
// place that decides what a provider receives; it is a pure function, so the
// machine controller, the control-plane controller, the CLI and an autoscaler
// all get the same answer.
//
// # Semantics
//
// A machine without spec.classRef keeps working as before classes existed:
// its spec.providerSpec is the whole configuration and is returned byte for
// byte, and its labels and taints are its own.
//
// A machine with spec.classRef starts from the class's spec.providerSpec and
// applies its own spec.providerSpec, if any, as a JSON merge patch (RFC 7386):
// objects merge key by key, any other value (string, number, list) replaces
// the class's whole, and null removes the key. The override may name the
// class's apiVersion and kind, and must name no other: they choose the
// provider.
//
// Each field the override sets must be allowed by the class's
// spec.allowedOverrides, a list of dotted paths of object keys from the root
// of the provider object. Allowing a path allows everything below it; an
// override may spell out the objects leading to an allowed path (an override
// of {"spec": {"diskSize": 100}} reaches "spec.diskSize"), but may not set,
// replace or remove anything else. A field not allowed is an error naming the
// field, for example
//
//	spec.providerSpec.spec.gpus: Forbidden: machine class "gpu" does not allow overriding this field (allowed: spec.diskSize)
//
// # Example
//
// Class "gpu":
//
//	providerSpec:     {apiVersion: local.marina.dev/v1alpha1, kind: LocalMachine,
//	                   spec: {cpu: 8, memory: 32Gi, gpus: 1, diskSize: 50}}
//	allowedOverrides: [spec.diskSize, spec.memory]
//	nodeTemplate:     {labels: {gpu: "true", tier: batch},
//	                   taints: [{key: nvidia.com/gpu, effect: NoSchedule}]}
//
// Machine:
//
//	classRef:     {name: gpu}
//	providerSpec: {apiVersion: local.marina.dev/v1alpha1, kind: LocalMachine,
//	               spec: {diskSize: 200}}
//	labels:       {team: vision}
//
// Result:
//
//	providerSpec: {apiVersion: local.marina.dev/v1alpha1, kind: LocalMachine,
//	               spec: {cpu: 8, diskSize: 200, gpus: 1, memory: 32Gi}}
//	labels:       {gpu: "true", team: vision, tier: batch}
//	taints:       [{key: nvidia.com/gpu, effect: NoSchedule}]
//
// A machine that instead set spec.gpus: 4 would be refused, because the class
// does not allow it; so would one that set tier: training.
//
// Node labels and taints are the class's plus the machine's. The class's are
// the administrator's (M6: tenancy, placement, cost labels): a machine may
// add its own, repeat the class's, but not change one. A machine label with
// another value than the class's, or a machine taint with the class's key and
// effect but another value, is refused with the field named. Merging is
// idempotent: merging the result again with the same overrides changes
// nothing.
package class

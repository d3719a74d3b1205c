package v1alpha1_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/class"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider/local"
)

var env *testenv.Env

// The API server calls marina's admission webhook, served from the test with
// the local provider, as marina up serves it: what the API refuses is what
// users meet. The provider gets no bin directory, so any control-plane
// version is one it can run (internal/webhook tests that rule).
func TestMain(m *testing.M) {
	root, err := os.MkdirTemp("", "marina-api-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	prov, err := local.New(local.Options{Root: root, AgentCommand: []string{"/bin/false"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// os.Exit runs no deferred call: the directory goes first.
	code := testenv.RunWithWebhook(m, &env, prov)
	os.RemoveAll(root)
	os.Exit(code)
}

// Valid objects the cases below start from. Each case changes one thing.
const (
	validCluster = `
apiVersion: cluster.marina.dev/v1alpha1
kind: Cluster
spec:
  controlPlane:
    version: v1.37.2
    replicas: 3
    providerSpec: {apiVersion: local.marina.dev/v1alpha1, kind: LocalMachine, spec: {cpu: 2, memory: 4Gi}}
`
	validMachine = `
apiVersion: cluster.marina.dev/v1alpha1
kind: Machine
spec:
  clusterName: prod
  roles: [ControlPlane]
  versions: {kubelet: v1.37.2, controlPlane: v1.37.2}
  taints: [{key: dedicated, value: infra, effect: NoSchedule}]
  providerSpec: {apiVersion: local.marina.dev/v1alpha1, kind: LocalMachine, spec: {cpu: 2, memory: 4Gi}}
`
	validClassMachine = `
apiVersion: cluster.marina.dev/v1alpha1
kind: Machine
spec:
  clusterName: prod
  roles: [Worker]
  versions: {kubelet: v1.37.2}
  classRef: {name: gpu}
`
	validClass = `
apiVersion: cluster.marina.dev/v1alpha1
kind: MachineClass
spec:
  providerSpec: {apiVersion: local.marina.dev/v1alpha1, kind: LocalMachine, spec: {cpu: 8, memory: 32Gi, gpus: 1}}
  allowedOverrides: [spec.diskSize]
  nodeTemplate:
    capacity: {cpu: "8", nvidia.com/gpu: "1"}
`
	validMachineSet = `
apiVersion: cluster.marina.dev/v1alpha1
kind: MachineSet
spec:
  clusterName: prod
  replicas: 2
  selector: {matchLabels: {pool: a}}
  template:
    metadata: {labels: {pool: a}}
    spec:
      clusterName: prod
      roles: [Worker]
      versions: {kubelet: v1.37.2}
      classRef: {name: standard}
`
	validMachineDeployment = `
apiVersion: cluster.marina.dev/v1alpha1
kind: MachineDeployment
spec:
  clusterName: prod
  replicas: 2
  selector: {matchLabels: {pool: a}}
  template:
    metadata: {labels: {pool: a}}
    spec:
      clusterName: prod
      roles: [Worker]
      versions: {kubelet: v1.37.2}
      classRef: {name: standard}
`
	validHealthCheck = `
apiVersion: cluster.marina.dev/v1alpha1
kind: MachineHealthCheck
spec:
  clusterName: prod
  selector: {matchLabels: {pool: a}}
  unhealthyConditions: [{type: Ready, status: "False", timeout: 5m}]
`
)

// change edits an object given as JSON-style maps.
type change func(obj map[string]any)

// set sets the field at path, creating the objects on the way.
func set(value any, path ...string) change {
	return func(obj map[string]any) {
		m := obj
		for _, k := range path[:len(path)-1] {
			next, ok := m[k].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[k] = next
			}
			m = next
		}
		m[path[len(path)-1]] = value
	}
}

// del removes the field at path.
func del(path ...string) change {
	return func(obj map[string]any) {
		unstructured.RemoveNestedField(obj, path...)
	}
}

// list is a JSON list; list() is an empty list, not null.
func list(items ...any) []any { return append([]any{}, items...) }

type obj = map[string]any

// invalidCase is an object the API server must refuse, with a part of the
// message it must give, which starts with the path of the field to fix.
// With update set, the object is created as changed by create and must then
// be refused when changed by update.
type invalidCase struct {
	name   string
	base   string
	create []change
	update []change
	want   string
}

// invalidCases are refused by the CRDs' schemas and CEL rules alone.
var invalidCases = []invalidCase{
	// Machine.
	{name: "machine without class or providerSpec", base: validMachine,
		create: []change{del("spec", "providerSpec")},
		want:   "spec.providerSpec: Required value: a machine needs a provider configuration: set classRef.name"},
	{name: "machine kubelet version without v", base: validMachine,
		create: []change{set("1.37.2", "spec", "versions", "kubelet")},
		want:   `spec.versions.kubelet: Invalid value: "1.37.2": must be a Kubernetes release version like v1.37.2`},
	{name: "machine kubelet version with two parts", base: validMachine,
		create: []change{set("v1.37", "spec", "versions", "kubelet")},
		want:   `spec.versions.kubelet: Invalid value: "v1.37": must be a Kubernetes release version like v1.37.2`},
	{name: "machine unknown role", base: validMachine,
		create: []change{set(list("Master"), "spec", "roles")},
		want:   `spec.roles[0]: Unsupported value: "Master": supported values: "ControlPlane", "Worker"`},
	{name: "machine without roles", base: validMachine,
		create: []change{set(list(), "spec", "roles")},
		want:   "spec.roles: Invalid value: 0: spec.roles in body should have at least 1 items"},
	{name: "machine duplicate roles", base: validMachine,
		create: []change{set(list("Worker", "Worker"), "spec", "roles")},
		want:   `spec.roles[1]: Duplicate value: "Worker"`},
	{name: "control-plane machine without control-plane version", base: validMachine,
		create: []change{del("spec", "versions", "controlPlane")},
		want:   "spec.versions.controlPlane: Required value: versions.controlPlane is required on a machine with the ControlPlane role"},
	{name: "worker with a control-plane version", base: validMachine,
		create: []change{set(list("Worker"), "spec", "roles")},
		want:   "spec.versions.controlPlane: Forbidden: versions.controlPlane is only for machines with the ControlPlane role: remove it"},
	{name: "kubelet newer than control plane", base: validMachine,
		create: []change{set("v1.38.0", "spec", "versions", "kubelet")},
		want:   "spec.versions.kubelet: Invalid value: the kubelet must not be newer than the control plane"},
	{name: "providerSpec without kind", base: validMachine,
		create: []change{del("spec", "providerSpec", "kind")},
		want:   "spec.providerSpec.kind: Required value"},
	{name: "taint with unknown effect", base: validMachine,
		create: []change{set(list(obj{"key": "a", "effect": "NoWay"}), "spec", "taints")},
		want:   "spec.taints[0].effect: Invalid value: each taint's effect must be NoSchedule, PreferNoSchedule or NoExecute"},
	{name: "container runtime name with spaces", base: validMachine,
		create: []change{set("Docker Engine", "spec", "containerRuntime", "name")},
		want:   "spec.containerRuntime.name: Invalid value: \"Docker Engine\": spec.containerRuntime.name in body should match"},
	// A duration the schema lets through but Go cannot decode would break
	// the controller's cache for every machine, not just this one.
	{name: "machine drain timeout in words", base: validMachine,
		create: []change{set("5min", "spec", "nodeDrainTimeout")},
		want:   `spec.nodeDrainTimeout: Invalid value: "5min": must be a duration like 10m, 90s or 1h30m`},
	{name: "machine drain timeout that overflows", base: validMachine,
		create: []change{set("99999999999h", "spec", "nodeDrainTimeout")},
		want:   `spec.nodeDrainTimeout: Invalid value: "99999999999h": must be a duration like 10m, 90s or 1h30m (at most 5 digits per unit)`},
	{name: "machine clusterName changed", base: validMachine,
		update: []change{set("staging", "spec", "clusterName")},
		want:   "spec.clusterName: Invalid value: clusterName cannot be changed after creation"},
	{name: "machine providerID changed once set", base: validMachine,
		create: []change{set("local://one", "spec", "providerID")},
		update: []change{set("local://two", "spec", "providerID")},
		want:   `spec.providerID: Invalid value: "local://two": providerID cannot change once set`},
	{name: "machine roles changed", base: validMachine,
		update: []change{set(list("ControlPlane", "Worker"), "spec", "roles")},
		want:   "spec.roles: Invalid value: roles cannot be changed after creation"},
	{name: "machine providerSpec kind changed", base: validMachine,
		update: []change{set("SSHMachine", "spec", "providerSpec", "kind")},
		want:   "spec.providerSpec: Invalid value: providerSpec kind and API group cannot be changed after creation"},
	{name: "machine providerSpec group changed", base: validMachine,
		update: []change{set("ssh.marina.dev/v1alpha1", "spec", "providerSpec", "apiVersion")},
		want:   "spec.providerSpec: Invalid value: providerSpec kind and API group cannot be changed after creation"},
	{name: "machine classRef changed", base: validClassMachine,
		update: []change{set("large", "spec", "classRef", "name")},
		want:   "spec.classRef: Invalid value: classRef cannot be added, removed or changed after creation"},
	{name: "machine classRef removed", base: validClassMachine,
		update: []change{del("spec", "classRef"), set(obj{"apiVersion": "local.marina.dev/v1alpha1", "kind": "LocalMachine"}, "spec", "providerSpec")},
		want:   "spec.classRef: Invalid value: classRef cannot be added, removed or changed after creation"},

	// MachineClass.
	{name: "class override path with an empty segment", base: validClass,
		create: []change{set(list("spec..diskSize"), "spec", "allowedOverrides")},
		want:   `spec.allowedOverrides[0]: Invalid value: "spec..diskSize": must be a dotted path of object keys such as spec.diskSize`},
	{name: "class override of kind", base: validClass,
		create: []change{set(list("kind"), "spec", "allowedOverrides")},
		want:   `spec.allowedOverrides[0]: Invalid value: "kind": apiVersion, kind and metadata cannot be overridden`},
	{name: "class without providerSpec apiVersion", base: validClass,
		create: []change{del("spec", "providerSpec", "apiVersion")},
		want:   "spec.providerSpec.apiVersion: Required value"},
	{name: "class providerSpec kind changed", base: validClass,
		update: []change{set("SSHMachine", "spec", "providerSpec", "kind")},
		want:   "spec.providerSpec: Invalid value: providerSpec kind and API group cannot be changed: machines of this class belong to its provider"},
	{name: "class capacity that is not a quantity", base: validClass,
		create: []change{set("lots", "spec", "nodeTemplate", "capacity", "cpu")},
		want:   "spec.nodeTemplate.capacity.cpu: Invalid value"},

	// MachineSet.
	{name: "machine set with negative replicas", base: validMachineSet,
		create: []change{set(int64(-1), "spec", "replicas")},
		want:   "spec.replicas in body should be greater than or equal to 0"},
	{name: "machine set template of another cluster", base: validMachineSet,
		create: []change{set("staging", "spec", "template", "spec", "clusterName")},
		want:   "spec.template.spec.clusterName: Invalid value: template.spec.clusterName must equal clusterName"},
	{name: "machine set unknown delete policy", base: validMachineSet,
		create: []change{set("Largest", "spec", "deletePolicy")},
		want:   `spec.deletePolicy: Unsupported value: "Largest": supported values: "Random", "Newest", "Oldest"`},
	{name: "machine set template without provider", base: validMachineSet,
		create: []change{del("spec", "template", "spec", "classRef")},
		want:   "spec.template.spec.providerSpec: Required value: a machine needs a provider configuration"},
	{name: "machine set selector changed", base: validMachineSet,
		update: []change{set(obj{"pool": "a", "zone": "z1"}, "spec", "selector", "matchLabels"), set(obj{"pool": "a", "zone": "z1"}, "spec", "template", "metadata", "labels")},
		want:   "spec.selector: Invalid value: selector cannot be changed after creation"},

	// MachineDeployment.
	{name: "deployment with an empty selector", base: validMachineDeployment,
		create: []change{set(obj{}, "spec", "selector")},
		want:   "spec.selector: Invalid value: selector must not be empty"},
	{name: "deployment of control-plane machines", base: validMachineDeployment,
		create: []change{set(list("ControlPlane", "Worker"), "spec", "template", "spec", "roles"), set("v1.37.2", "spec", "template", "spec", "versions", "controlPlane")},
		want:   "spec.template.spec.roles: Forbidden: a deployment makes workers only"},
	{name: "set with an empty selector", base: validMachineSet,
		create: []change{set(obj{}, "spec", "selector")},
		want:   "spec.selector: Invalid value: selector must not be empty"},
	{name: "deployment maxSurge above 100%", base: validMachineDeployment,
		create: []change{set(obj{"maxSurge": "150%"}, "spec", "strategy", "rollingUpdate")},
		want:   `spec.strategy.rollingUpdate.maxSurge: Invalid value: "150%": must be a non-negative number of machines (1) or a percentage from 0% to 100%`},
	{name: "deployment negative maxUnavailable", base: validMachineDeployment,
		create: []change{set(obj{"maxUnavailable": int64(-1)}, "spec", "strategy", "rollingUpdate")},
		want:   "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: -1: must be a non-negative number of machines (1) or a percentage from 0% to 100%"},
	{name: "deployment that could never progress", base: validMachineDeployment,
		create: []change{set(obj{"maxSurge": "0%", "maxUnavailable": int64(0)}, "spec", "strategy", "rollingUpdate")},
		want:   "spec.strategy.rollingUpdate.maxSurge: Invalid value: maxSurge and maxUnavailable cannot both be zero"},
	{name: "deployment OnDelete with rollingUpdate", base: validMachineDeployment,
		create: []change{set(obj{"type": "OnDelete", "rollingUpdate": obj{"maxSurge": int64(1)}}, "spec", "strategy")},
		want:   "spec.strategy.rollingUpdate: Forbidden: rollingUpdate is only used with type RollingUpdate"},
	{name: "deployment unknown strategy", base: validMachineDeployment,
		create: []change{set(obj{"type": "Recreate"}, "spec", "strategy")},
		want:   `spec.strategy.type: Unsupported value: "Recreate": supported values: "RollingUpdate", "OnDelete"`},
	{name: "deployment negative revisionHistoryLimit", base: validMachineDeployment,
		create: []change{set(int64(-1), "spec", "revisionHistoryLimit")},
		want:   "spec.revisionHistoryLimit in body should be greater than or equal to 0"},
	{name: "deployment clusterName changed", base: validMachineDeployment,
		update: []change{set("staging", "spec", "clusterName"), set("staging", "spec", "template", "spec", "clusterName")},
		want:   "spec.clusterName: Invalid value: clusterName cannot be changed after creation: create a new deployment"},

	// Cluster.
	{name: "cluster without provider for the control plane", base: validCluster,
		create: []change{del("spec", "controlPlane", "providerSpec")},
		want:   "spec.controlPlane.providerSpec: Required value: the control plane needs a provider configuration for its machines"},
	{name: "cluster control-plane version without patch", base: validCluster,
		create: []change{set("v1.37", "spec", "controlPlane", "version")},
		want:   `spec.controlPlane.version: Invalid value: "v1.37": must be a Kubernetes release version like v1.37.2`},
	{name: "cluster pod network that is not a CIDR", base: validCluster,
		create: []change{set(list("10.244.0.0/33"), "spec", "clusterNetwork", "pods")},
		want:   `spec.clusterNetwork.pods[0]: Invalid value: "10.244.0.0/33": must be a network in CIDR notation`},
	{name: "cluster pod network with host bits", base: validCluster,
		create: []change{set(list("10.244.1.7/16"), "spec", "clusterNetwork", "pods")},
		want:   `spec.clusterNetwork.pods[0]: Invalid value: "10.244.1.7/16": must be written with its host bits zero: use the network address`},
	{name: "cluster pod and service networks overlap", base: validCluster,
		create: []change{set(list("10.0.0.0/8"), "spec", "clusterNetwork", "pods")},
		want:   "spec.clusterNetwork.pods: Invalid value: pod and service networks must not overlap"},
	{name: "cluster IPv6 networks overlap", base: validCluster,
		create: []change{set(list("fd00::/48"), "spec", "clusterNetwork", "pods"), set(list("fd00:0:0:1::/108"), "spec", "clusterNetwork", "services")},
		want:   "spec.clusterNetwork.pods: Invalid value: pod and service networks must not overlap"},
	{name: "cluster with two IPv4 pod networks", base: validCluster,
		create: []change{set(list("10.244.0.0/16", "10.245.0.0/16"), "spec", "clusterNetwork", "pods")},
		want:   "spec.clusterNetwork.pods: Invalid value: two pod networks must be one IPv4 and one IPv6 network"},
	{name: "cluster with a bad DNS domain", base: validCluster,
		create: []change{set("Cluster_Local", "spec", "clusterNetwork", "dnsDomain")},
		want:   `spec.clusterNetwork.dnsDomain: Invalid value: "Cluster_Local": must be a DNS domain such as cluster.local`},
	{name: "stacked etcd with an even number of control-plane machines", base: validCluster,
		create: []change{set(int64(2), "spec", "controlPlane", "replicas")},
		want:   "spec.controlPlane.replicas: Invalid value: with stacked etcd, control-plane replicas must be odd"},
	{name: "cluster without control-plane machines", base: validCluster,
		create: []change{set(int64(0), "spec", "controlPlane", "replicas")},
		want:   "spec.controlPlane.replicas in body should be greater than or equal to 1"},
	{name: "external etcd without endpoints", base: validCluster,
		create: []change{set(obj{"type": "External"}, "spec", "controlPlane", "etcd")},
		want:   "spec.controlPlane.etcd.external: Required value: etcd type External needs external.endpoints"},
	{name: "external etcd with an empty endpoint list", base: validCluster,
		create: []change{set(obj{"type": "External", "external": obj{"endpoints": list()}}, "spec", "controlPlane", "etcd")},
		want:   "spec.controlPlane.etcd.external.endpoints in body should have at least 1 items"},
	{name: "external etcd endpoint that is not a URL", base: validCluster,
		create: []change{set(obj{"type": "External", "external": obj{"endpoints": list("10.0.0.5:2379")}}, "spec", "controlPlane", "etcd")},
		want:   `spec.controlPlane.etcd.external.endpoints[0]: Invalid value: "10.0.0.5:2379": must be an etcd client URL like https://10.0.0.5:2379`},
	{name: "stacked etcd with external settings", base: validCluster,
		create: []change{set(obj{"type": "Stacked", "external": obj{"endpoints": list("https://10.0.0.5:2379")}}, "spec", "controlPlane", "etcd")},
		want:   "spec.controlPlane.etcd.external: Forbidden: external is only used with etcd type External"},
	{name: "unknown etcd type", base: validCluster,
		create: []change{set(obj{"type": "Embedded"}, "spec", "controlPlane", "etcd")},
		want:   `spec.controlPlane.etcd.type: Unsupported value: "Embedded": supported values: "Stacked", "External"`},
	{name: "upgrade step timeout that is not a duration", base: validCluster,
		create: []change{set(obj{"stepTimeout": "ten minutes"}, "spec", "controlPlane", "upgradeStrategy")},
		want:   `spec.controlPlane.upgradeStrategy.stepTimeout: Invalid value: "ten minutes": must be a duration like 10m, 90s or 1h30m`},
	{name: "certificate validity shorter than a minute", base: validCluster,
		create: []change{set("30s", "spec", "controlPlane", "certificateValidity")},
		want:   `spec.controlPlane.certificateValidity: Invalid value: "30s": certificateValidity must be at least 1m`},
	{name: "certificate validity that is not a duration", base: validCluster,
		create: []change{set("a year", "spec", "controlPlane", "certificateValidity")},
		want:   `spec.controlPlane.certificateValidity: Invalid value: "a year": must be a duration like 8760h`},
	// A rule on the root cannot name metadata.name as its fieldPath (the
	// schema does not describe metadata's fields), so the message does.
	{name: "cluster name too long for a label", base: validCluster,
		create: []change{set(strings.Repeat("a", 64), "metadata", "name")},
		want:   "Invalid value: metadata.name must be at most 63 characters for a cluster"},
	{name: "control plane upgraded two minor versions at once", base: validCluster,
		update: []change{set("v1.39.0", "spec", "controlPlane", "version")},
		want:   `spec.controlPlane.version: Invalid value: "v1.39.0": version may go up by at most one minor version at a time and never down a minor version`},
	{name: "control plane downgraded a minor version", base: validCluster,
		update: []change{set("v1.36.3", "spec", "controlPlane", "version")},
		want:   `spec.controlPlane.version: Invalid value: "v1.36.3": version may go up by at most one minor version at a time and never down a minor version`},
	{name: "cluster network changed", base: validCluster,
		update: []change{set(list("10.200.0.0/16"), "spec", "clusterNetwork", "pods")},
		want:   "spec.clusterNetwork: Invalid value: clusterNetwork cannot be changed after creation"},
	{name: "etcd type changed", base: validCluster,
		update: []change{set(obj{"type": "External", "external": obj{"endpoints": list("https://10.0.0.5:2379")}}, "spec", "controlPlane", "etcd")},
		want:   `spec.controlPlane.etcd.type: Invalid value: "External": etcd type cannot be changed after creation`},
	{name: "user CA added after creation", base: validCluster,
		update: []change{set(obj{"name": "my-ca"}, "spec", "controlPlane", "caSecretRef")},
		want:   "spec.controlPlane.caSecretRef: Invalid value: caSecretRef cannot be added or removed after creation"},
	{name: "user CA changed after creation", base: validCluster,
		create: []change{set(obj{"name": "my-ca"}, "spec", "controlPlane", "caSecretRef")},
		update: []change{set(obj{"name": "other-ca"}, "spec", "controlPlane", "caSecretRef")},
		want:   "spec.controlPlane.caSecretRef: Invalid value: caSecretRef cannot be changed after creation"},
	{name: "control-plane endpoint changed once set", base: validCluster,
		create: []change{set(obj{"host": "10.0.0.10", "port": int64(6443)}, "spec", "controlPlaneEndpoint")},
		update: []change{set(obj{"host": "10.0.0.11", "port": int64(6443)}, "spec", "controlPlaneEndpoint")},
		want:   "spec.controlPlaneEndpoint: Invalid value: controlPlaneEndpoint cannot be changed once set"},

	// MachineHealthCheck.
	{name: "health check with an empty selector", base: validHealthCheck,
		create: []change{set(obj{}, "spec", "selector")},
		want:   "spec.selector: Invalid value: selector must not be empty"},
	{name: "health check without unhealthy conditions", base: validHealthCheck,
		create: []change{set(list(), "spec", "unhealthyConditions")},
		want:   "spec.unhealthyConditions in body should have at least 1 items"},
	{name: "health check unknown condition status", base: validHealthCheck,
		create: []change{set(list(obj{"type": "Ready", "status": "Maybe", "timeout": "5m"}), "spec", "unhealthyConditions")},
		want:   `spec.unhealthyConditions[0].status: Unsupported value: "Maybe": supported values: "True", "False", "Unknown"`},
	{name: "health check timeout that is not a duration", base: validHealthCheck,
		create: []change{set(list(obj{"type": "Ready", "status": "False", "timeout": "5 minutes"}), "spec", "unhealthyConditions")},
		want:   `spec.unhealthyConditions[0].timeout: Invalid value: "5 minutes": must be a duration like 5m, 300s or 1h`},
	{name: "health check negative maxUnhealthy", base: validHealthCheck,
		create: []change{set(int64(-1), "spec", "maxUnhealthy")},
		want:   "spec.maxUnhealthy: Invalid value: -1: must be a non-negative number of machines (2) or a percentage from 0% to 100%"},
	{name: "health check clusterName changed", base: validHealthCheck,
		update: []change{set("staging", "spec", "clusterName")},
		want:   `spec.clusterName: Invalid value: "staging": clusterName cannot be changed after creation: create a health check for the other cluster`},

	// Added with field paths in every refusal (issue 7).
	{name: "cluster IPv4 service network larger than /12", base: validCluster,
		create: []change{set(list("172.16.0.0/11"), "spec", "clusterNetwork", "services")},
		want:   `spec.clusterNetwork.services[0]: Invalid value: "172.16.0.0/11": is larger than kube-apiserver accepts for services (at most 20 host bits)`},
	{name: "cluster IPv6 service network larger than /108", base: validCluster,
		create: []change{set(list("10.244.0.0/16", "fd00:10:244::/56"), "spec", "clusterNetwork", "pods"),
			set(list("10.96.0.0/12", "fd00:10:96::/64"), "spec", "clusterNetwork", "services")},
		want: `spec.clusterNetwork.services[1]: Invalid value: "fd00:10:96::/64": is larger than kube-apiserver accepts for services`},
	{name: "machine cluster name with a dot", base: validClassMachine,
		create: []change{set("prod.eu", "spec", "clusterName")},
		want:   `spec.clusterName: Invalid value: "prod.eu": must be the name of a Cluster: a DNS label`},
	{name: "deployment cluster name with a path in it", base: validMachineDeployment,
		create: []change{set("../prod", "spec", "clusterName"), set("../prod", "spec", "template", "spec", "clusterName")},
		want:   `spec.template.spec.clusterName: Invalid value: "../prod": must be the name of a Cluster: a DNS label`},
	{name: "cluster API server flag written with dashes", base: validCluster,
		create: []change{set(obj{"--audit-log-maxage": "30"}, "spec", "controlPlane", "components", "apiServer", "extraArgs")},
		want:   "spec.controlPlane.components.apiServer.extraArgs: Invalid value: write flag names without the leading dashes"},
	{name: "cluster scheduler flag written with one dash", base: validCluster,
		create: []change{set(obj{"-v": "4"}, "spec", "controlPlane", "components", "scheduler", "extraArgs")},
		want:   "spec.controlPlane.components.scheduler.extraArgs: Invalid value: write flag names without the leading dashes"},
	{name: "cluster controller-manager flag written with dashes", base: validCluster,
		update: []change{set(obj{"--v": "2"}, "spec", "controlPlane", "components", "controllerManager", "extraArgs")},
		want:   "spec.controlPlane.components.controllerManager.extraArgs: Invalid value: write flag names without the leading dashes"},
	{name: "cluster with an even control plane after scaling", base: validCluster,
		update: []change{set(int64(4), "spec", "controlPlane", "replicas")},
		want:   "spec.controlPlane.replicas: Invalid value: with stacked etcd, control-plane replicas must be odd"},
	{name: "cluster pod network overlapping an IPv6 service network", base: validCluster,
		create: []change{set(list("10.244.0.0/16", "fd00:10::/32"), "spec", "clusterNetwork", "pods"),
			set(list("10.96.0.0/12", "fd00:10:96::/112"), "spec", "clusterNetwork", "services")},
		want: "spec.clusterNetwork.pods: Invalid value: pod and service networks must not overlap"},
	{name: "class taint with unknown effect", base: validClass,
		create: []change{set(list(obj{"key": "nvidia.com/gpu", "effect": "NoScale"}), "spec", "nodeTemplate", "taints")},
		want:   "spec.nodeTemplate.taints[0].effect: Invalid value: each taint's effect must be NoSchedule, PreferNoSchedule or NoExecute"},
	{name: "machine second taint with unknown effect", base: validMachine,
		create: []change{set(list(obj{"key": "a", "effect": "NoSchedule"}, obj{"key": "b", "effect": "Evict"}), "spec", "taints")},
		want:   "spec.taints[1].effect: Invalid value: each taint's effect must be"},
	{name: "class providerSpec group changed", base: validClass,
		update: []change{set("ssh.marina.dev/v1alpha1", "spec", "providerSpec", "apiVersion")},
		want:   "spec.providerSpec: Invalid value: providerSpec kind and API group cannot be changed: machines of this class belong to its provider"},
	{name: "machine classRef added after creation", base: validMachine,
		update: []change{set(obj{"name": "gpu"}, "spec", "classRef")},
		want:   "spec.classRef: Invalid value: classRef cannot be added, removed or changed after creation"},
	{name: "machine providerSpec removed", base: validMachine,
		update: []change{del("spec", "providerSpec")},
		want:   "spec.providerSpec: Required value: a machine needs a provider configuration"},
	{name: "control-plane machine's kubelet upgraded past its control plane", base: validMachine,
		update: []change{set("v1.38.0", "spec", "versions", "kubelet")},
		want:   "spec.versions.kubelet: Invalid value: the kubelet must not be newer than the control plane"},
	{name: "deployment template of another cluster", base: validMachineDeployment,
		create: []change{set("staging", "spec", "template", "spec", "clusterName")},
		want:   "spec.template.spec.clusterName: Invalid value: template.spec.clusterName must equal clusterName: a deployment only creates machines of its own cluster"},
	{name: "set of control-plane machines", base: validMachineSet,
		create: []change{set(list("ControlPlane"), "spec", "template", "spec", "roles"), set("v1.37.2", "spec", "template", "spec", "versions", "controlPlane")},
		want:   "spec.template.spec.roles: Forbidden: a set makes workers only"},
	{name: "set clusterName changed", base: validMachineSet,
		update: []change{set("staging", "spec", "clusterName"), set("staging", "spec", "template", "spec", "clusterName")},
		want:   "spec.clusterName: Invalid value: clusterName cannot be changed after creation: create a new set in the other cluster"},
	{name: "deployment template without provider", base: validMachineDeployment,
		create: []change{del("spec", "template", "spec", "classRef")},
		want:   "spec.template.spec.providerSpec: Required value: a machine needs a provider configuration"},
	{name: "deployment template worker with a control-plane version", base: validMachineDeployment,
		create: []change{set("v1.37.2", "spec", "template", "spec", "versions", "controlPlane")},
		want:   "spec.template.spec.versions.controlPlane: Forbidden: versions.controlPlane is only for machines with the ControlPlane role"},
	{name: "set template control-plane machine without its version", base: validMachineSet,
		create: []change{set(list("ControlPlane"), "spec", "template", "spec", "roles")},
		want:   "spec.template.spec.versions.controlPlane: Required value: versions.controlPlane is required on a machine with the ControlPlane role"},
	{name: "deployment whose rollout could never progress after an update", base: validMachineDeployment,
		update: []change{set(obj{"maxSurge": int64(0), "maxUnavailable": "0%"}, "spec", "strategy", "rollingUpdate")},
		want:   "spec.strategy.rollingUpdate.maxSurge: Invalid value: maxSurge and maxUnavailable cannot both be zero"},
	{name: "deployment switched to OnDelete keeping rollingUpdate", base: validMachineDeployment,
		update: []change{set("OnDelete", "spec", "strategy", "type")},
		want:   "spec.strategy.rollingUpdate: Forbidden: rollingUpdate is only used with type RollingUpdate"},
	{name: "external etcd set to stacked keeping its endpoints", base: validCluster,
		create: []change{set(obj{"external": obj{"endpoints": list("https://10.0.0.5:2379")}}, "spec", "controlPlane", "etcd")},
		want:   "spec.controlPlane.etcd.external: Forbidden: external is only used with etcd type External"},
	{name: "user CA removed after creation", base: validCluster,
		create: []change{set(obj{"name": "my-ca"}, "spec", "controlPlane", "caSecretRef")},
		update: []change{del("spec", "controlPlane", "caSecretRef")},
		want:   "spec.controlPlane.caSecretRef: Invalid value: caSecretRef cannot be added or removed after creation"},
}

// TestInvalidObjectsAreRefused: the schema (OpenAPI and CEL) refuses these,
// before the webhook is called, so they hold even with marina down.
func TestInvalidObjectsAreRefused(t *testing.T) { runInvalidCases(t, invalidCases, false) }

// runInvalidCases creates (and updates) each case's object in a namespace of
// its own, next to the objects the cases refer to, and checks the refusal,
// and that it came from marina's webhook or from the schema, as byWebhook
// says.
func runInvalidCases(t *testing.T, cases []invalidCase, byWebhook bool) {
	ns := env.Namespace(t)
	referenced(t, ns)
	ctx := context.Background()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := decode(t, tc.base)
			u.SetName(fmt.Sprintf("case-%d", i))
			namespace(t, u, ns)
			for _, c := range tc.create {
				c(u.Object)
			}
			err := env.Client.Create(ctx, u)
			if tc.update != nil {
				if err != nil {
					t.Fatalf("creating the object to update: %v", err)
				}
				t.Cleanup(func() { _ = env.Client.Delete(ctx, u) })
				for _, c := range tc.update {
					c(u.Object)
				}
				err = env.Client.Update(ctx, u)
			} else if err == nil {
				t.Cleanup(func() { _ = env.Client.Delete(ctx, u) })
			}
			assertRefused(t, err, tc.want)
			if fromWebhook := strings.Contains(err.Error(), "admission webhook"); fromWebhook != byWebhook {
				t.Errorf("refused by the webhook: %v, want %v: %v", fromWebhook, byWebhook, err)
			}
		})
	}
}

// referenced creates the objects the valid objects above refer to: the
// Cluster prod in ns and the MachineClasses gpu and standard, so that an
// admission webhook that checks references refuses a case for the reason the
// case is about and not for a missing reference.
func referenced(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	cl := decode(t, validCluster)
	cl.SetName("prod")
	cl.SetNamespace(ns)
	if err := env.Client.Create(ctx, cl); err != nil {
		t.Fatalf("creating the cluster the cases refer to: %v", err)
	}
	for _, name := range []string{"gpu", "standard"} {
		mc := decode(t, validClass)
		mc.SetName(name)
		if err := env.Client.Create(ctx, mc); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating the class the cases refer to: %v", err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctx, mc) })
	}
}

func assertRefused(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("the API server accepted the object, want it refused with %q", want)
	}
	if !apierrors.IsInvalid(err) {
		t.Fatalf("error is not Invalid: %v", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error does not say %q:\n%v", want, err)
	}
}

// TestValidChangesAreAccepted guards against rules that refuse too much.
func TestValidChangesAreAccepted(t *testing.T) {
	ns := env.Namespace(t)
	referenced(t, ns)
	ctx := context.Background()
	cases := []struct {
		name   string
		base   string
		create []change
		update []change
	}{
		{name: "control plane upgraded one minor version", base: validCluster,
			update: []change{set("v1.38.0", "spec", "controlPlane", "version")}},
		{name: "control plane patch downgrade", base: validCluster,
			update: []change{set("v1.37.1", "spec", "controlPlane", "version")}},
		{name: "endpoint set after creation", base: validCluster,
			update: []change{set(obj{"host": "10.0.0.10", "port": int64(6443)}, "spec", "controlPlaneEndpoint")}},
		{name: "scaled, paused, extra args", base: validCluster,
			update: []change{set(int64(5), "spec", "controlPlane", "replicas"), set(true, "spec", "paused"),
				set(obj{"v": "2"}, "spec", "controlPlane", "components", "apiServer", "extraArgs")}},
		{name: "external etcd with an even control plane and dual-stack", base: validCluster,
			create: []change{
				set(obj{"type": "External", "external": obj{"endpoints": list("https://10.0.0.5:2379", "https://etcd-1.example:2379"), "secretRef": obj{"name": "etcd-client"}}}, "spec", "controlPlane", "etcd"),
				set(int64(2), "spec", "controlPlane", "replicas"),
				set(list("10.244.0.0/16", "fd00:10:244::/56"), "spec", "clusterNetwork", "pods"),
				set(list("10.96.0.0/12", "fd00:10:96::/112"), "spec", "clusterNetwork", "services"),
			}},
		{name: "machine upgraded in place and moved to a new kubelet config", base: validMachine,
			update: []change{set("v1.38.0", "spec", "versions", "controlPlane"), set("v1.37.1", "spec", "versions", "kubelet"),
				set(obj{"name": "kubelet-config-v2"}, "spec", "kubeletConfigRef"),
				set(obj{"cpu": int64(4), "memory": "8Gi"}, "spec", "providerSpec", "spec")}},
		{name: "machine providerID set once known", base: validMachine,
			update: []change{set("local://one", "spec", "providerID")}},
		{name: "class machine gains overrides", base: validClassMachine,
			update: []change{set(obj{"apiVersion": "local.marina.dev/v1alpha1", "kind": "LocalMachine", "spec": obj{"diskSize": "200Gi"}}, "spec", "providerSpec")}},
		{name: "deployment template changes roll", base: validMachineDeployment,
			update: []change{set("v1.37.1", "spec", "template", "spec", "versions", "kubelet"),
				set(obj{"node.example.com/tier": "gold"}, "spec", "template", "spec", "labels"),
				set(obj{"maxSurge": "25%", "maxUnavailable": int64(1)}, "spec", "strategy", "rollingUpdate")}},
		{name: "class gains allowed overrides", base: validClass,
			update: []change{set(list("spec.diskSize", "spec.network.vlan"), "spec", "allowedOverrides")}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := decode(t, tc.base)
			u.SetName(fmt.Sprintf("valid-%d", i))
			namespace(t, u, ns)
			for _, c := range tc.create {
				c(u.Object)
			}
			if err := env.Client.Create(ctx, u); err != nil {
				t.Fatalf("create: %v", err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(ctx, u) })
			for _, c := range tc.update {
				c(u.Object)
			}
			if err := env.Client.Update(ctx, u); err != nil {
				t.Fatalf("update: %v", err)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	ns := env.Namespace(t)
	referenced(t, ns)
	ctx := context.Background()

	cl := &clusterv1.Cluster{}
	decodeInto(t, validCluster, cl)
	cl.Name, cl.Namespace = "defaults", ns
	cl.Spec.ControlPlane.Replicas = 0 // unset: defaulted to 1
	if err := env.Client.Create(ctx, cl); err != nil {
		t.Fatal(err)
	}
	cp := cl.Spec.ControlPlane
	net := cl.Spec.ClusterNetwork
	if cp.Replicas != 1 || cp.Etcd.Type != clusterv1.EtcdStacked || cp.UpgradeStrategy.Type != clusterv1.InPlaceUpgrade ||
		cp.UpgradeStrategy.StepTimeout == nil || cp.UpgradeStrategy.StepTimeout.Duration != 10*time.Minute ||
		!slices.Equal(net.Pods, []clusterv1.CIDR{"10.244.0.0/16"}) || !slices.Equal(net.Services, []clusterv1.CIDR{"10.96.0.0/12"}) ||
		net.DNSDomain != "cluster.local" {
		t.Errorf("cluster defaults not applied: %+v", cl.Spec)
	}

	md := &clusterv1.MachineDeployment{}
	decodeInto(t, validMachineDeployment, md)
	md.Name, md.Namespace = "defaults", ns
	md.Spec.Replicas = nil
	if err := env.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	s := md.Spec
	if *s.Replicas != 1 || s.Strategy == nil || s.Strategy.Type != clusterv1.RollingUpdateStrategy || s.Strategy.RollingUpdate == nil ||
		s.Strategy.RollingUpdate.MaxSurge.String() != "1" || s.Strategy.RollingUpdate.MaxUnavailable.String() != "0" ||
		s.DeletePolicy != clusterv1.RandomDeletePolicy || *s.RevisionHistoryLimit != 1 ||
		s.Template.Spec.ContainerRuntime.Name != "containerd" {
		t.Errorf("deployment defaults not applied: %+v", s)
	}

	mhc := &clusterv1.MachineHealthCheck{}
	decodeInto(t, validHealthCheck, mhc)
	mhc.Name, mhc.Namespace = "defaults", ns
	if err := env.Client.Create(ctx, mhc); err != nil {
		t.Fatal(err)
	}
	if mhc.Spec.MaxUnhealthy == nil || mhc.Spec.MaxUnhealthy.String() != "100%" ||
		mhc.Spec.NodeStartupTimeout == nil || mhc.Spec.NodeStartupTimeout.Duration != 10*time.Minute {
		t.Errorf("health check defaults not applied: %+v", mhc.Spec)
	}
}

// TestScaleSubresource checks that `kubectl scale` and autoscalers can
// resize sets and deployments.
func TestScaleSubresource(t *testing.T) {
	ns := env.Namespace(t)
	referenced(t, ns)
	ctx := context.Background()
	ms, md := &clusterv1.MachineSet{}, &clusterv1.MachineDeployment{}
	decodeInto(t, validMachineSet, ms)
	decodeInto(t, validMachineDeployment, md)
	for _, o := range []client.Object{ms, md} {
		o.SetName("scaled")
		o.SetNamespace(ns)
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		kind := fmt.Sprintf("%T", o)
		scale := &autoscalingv1.Scale{}
		if err := env.Client.SubResource("scale").Get(ctx, o, scale); err != nil {
			t.Fatalf("%s: getting scale: %v", kind, err)
		}
		if scale.Spec.Replicas != 2 {
			t.Errorf("%s: scale.spec.replicas = %d, want 2", kind, scale.Spec.Replicas)
		}
		scale.Spec.Replicas = 5
		if err := env.Client.SubResource("scale").Update(ctx, o, client.WithSubResourceBody(scale)); err != nil {
			t.Fatalf("%s: scaling: %v", kind, err)
		}
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ms), ms); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(md), md); err != nil {
		t.Fatal(err)
	}
	if *ms.Spec.Replicas != 5 || *md.Spec.Replicas != 5 {
		t.Errorf("spec.replicas after scaling to 5: set %d, deployment %d", *ms.Spec.Replicas, *md.Spec.Replicas)
	}
}

// Machines are selectable by cluster on the API server (kubectl get
// machines --field-selector spec.clusterName=prod): a MachineSet's live
// read of a fleet's namespace reads its own cluster's machines only.
func TestMachinesSelectableByCluster(t *testing.T) {
	ns := env.Namespace(t)
	referenced(t, ns)
	ctx := context.Background()
	staging := decode(t, validCluster)
	staging.SetName("staging")
	staging.SetNamespace(ns)
	if err := env.Client.Create(ctx, staging); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"prod", "prod", "staging"} {
		m := &clusterv1.Machine{}
		decodeInto(t, validClassMachine, m)
		m.GenerateName = c + "-"
		m.Namespace = ns
		m.Spec.ClusterName = c
		if err := env.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for cluster, want := range map[string]int{"prod": 2, "staging": 1, "other": 0} {
		var list clusterv1.MachineList
		if err := env.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingFields{"spec.clusterName": cluster}); err != nil {
			t.Fatalf("listing the machines of cluster %s by field selector: %v", cluster, err)
		}
		if len(list.Items) != want {
			t.Errorf("cluster %s: %d machines selected, want %d", cluster, len(list.Items), want)
		}
		for _, m := range list.Items {
			if m.Spec.ClusterName != cluster {
				t.Errorf("cluster %s: selected machine %s of cluster %s", cluster, m.Name, m.Spec.ClusterName)
			}
		}
	}
}

// TestExamples applies every manifest under examples/, each directory in a
// namespace of its own, and checks that the class of every machine there
// merges with its overrides.
func TestExamples(t *testing.T) {
	root := filepath.Join(env.RepoRoot, "examples")
	dirs := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			dirs[filepath.Dir(path)] = append(dirs[filepath.Dir(path)], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 2 {
		t.Fatalf("found manifests in %d directories under %s, want at least minimal/ and ha/", len(dirs), root)
	}
	ctx := context.Background()
	for dir, files := range dirs {
		name, _ := filepath.Rel(root, dir)
		t.Run(name, func(t *testing.T) {
			ns := env.Namespace(t)
			var created []*unstructured.Unstructured
			for _, file := range files {
				for _, u := range decodeFile(t, file) {
					namespace(t, u, ns)
					if err := env.Client.Create(ctx, u); err != nil {
						t.Fatalf("%s: creating %s %s: %v", file, u.GetKind(), u.GetName(), err)
					}
					if u.GetNamespace() == "" { // cluster-scoped: not removed with the namespace
						t.Cleanup(func() { _ = env.Client.Delete(ctx, u) })
					}
					created = append(created, u)
				}
			}
			for _, u := range created {
				checkClassMerges(t, u)
			}
		})
	}
}

// checkClassMerges resolves the provider configuration of a Machine or of a
// MachineDeployment's template, as the machine controller will.
func checkClassMerges(t *testing.T, u *unstructured.Unstructured) {
	t.Helper()
	var spec clusterv1.MachineSpec
	switch u.GetKind() {
	case "Machine":
		m := &clusterv1.Machine{}
		convert(t, u, m)
		spec = m.Spec
	case "MachineDeployment":
		md := &clusterv1.MachineDeployment{}
		convert(t, u, md)
		spec = md.Spec.Template.Spec
	default:
		return
	}
	var mc *clusterv1.MachineClass
	if spec.ClassRef != nil {
		mc = &clusterv1.MachineClass{}
		if err := env.Client.Get(context.Background(), client.ObjectKey{Name: spec.ClassRef.Name}, mc); err != nil {
			t.Fatalf("%s %s: getting its class: %v", u.GetKind(), u.GetName(), err)
		}
	}
	if _, err := class.Merge(mc, &spec); err != nil {
		t.Errorf("%s %s: its class does not merge: %v", u.GetKind(), u.GetName(), err)
	}
}

// TestExplain checks that the published OpenAPI v3 carries the field
// documentation that `kubectl explain machine.spec.providerSpec` shows.
func TestExplain(t *testing.T) {
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	var desc string
	deadline := time.Now().Add(30 * time.Second)
	for {
		raw, err := dc.RESTClient().Get().AbsPath("/openapi/v3/apis/cluster.marina.dev/v1alpha1").DoRaw(context.Background())
		if err == nil {
			desc, err = providerSpecDescription(raw)
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reading the OpenAPI v3 of cluster.marina.dev/v1alpha1: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, want := range []string{"provider-specific configuration of the machine", "apiVersion: local.marina.dev/v1alpha1", "allowedOverrides"} {
		if !strings.Contains(desc, want) {
			t.Errorf("machine.spec.providerSpec description does not contain %q:\n%s", want, desc)
		}
	}
}

func providerSpecDescription(raw []byte) (string, error) {
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Properties map[string]struct {
						Description string `json:"description"`
					} `json:"properties"`
				} `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return "", err
	}
	for name, s := range doc.Components.Schemas {
		if strings.HasSuffix(name, "v1alpha1.Machine") {
			if d := s.Properties["spec"].Properties["providerSpec"].Description; d != "" {
				return d, nil
			}
			return "", errors.New("the Machine schema has no description for spec.providerSpec")
		}
	}
	return "", errors.New("no Machine schema published yet")
}

// TestDiscovery checks the names `kubectl get marina` and the short names
// rely on.
func TestDiscovery(t *testing.T) {
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	resources, err := dc.ServerResourcesForGroupVersion(clusterv1.GroupVersion.String())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"clusters": "cl", "machines": "ma", "machineclasses": "mc",
		"machinesets": "ms", "machinedeployments": "md", "machinehealthchecks": "mhc"}
	found := map[string]bool{}
	for _, r := range resources.APIResources {
		short, ok := want[r.Name]
		if !ok {
			continue
		}
		found[r.Name] = true
		if !slices.Contains(r.ShortNames, short) {
			t.Errorf("%s: short names %v, want %s", r.Name, r.ShortNames, short)
		}
		if !slices.Contains(r.Categories, "marina") {
			t.Errorf("%s: categories %v, want marina", r.Name, r.Categories)
		}
	}
	for name := range want {
		if !found[name] {
			t.Errorf("resource %s is not served", name)
		}
	}
}

// decode turns a YAML manifest into an unstructured object.
func decode(t *testing.T, manifest string) *unstructured.Unstructured {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	o, err := runtime.Decode(unstructured.UnstructuredJSONScheme, j)
	if err != nil {
		t.Fatal(err)
	}
	return o.(*unstructured.Unstructured)
}

func decodeInto(t *testing.T, manifest string, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict([]byte(manifest), into); err != nil {
		t.Fatal(err)
	}
}

func convert(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		t.Fatal(err)
	}
}

// decodeFile reads every document of a multi-document YAML file.
func decodeFile(t *testing.T, file string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		out = append(out, u)
	}
}

// namespace puts a namespaced object in ns.
func namespace(t *testing.T, u *unstructured.Unstructured, ns string) {
	t.Helper()
	namespaced, err := env.Client.IsObjectNamespaced(u)
	if err != nil {
		t.Fatal(err)
	}
	if namespaced {
		u.SetNamespace(ns)
	}
}

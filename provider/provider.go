package provider

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// Provider creates, describes and deletes real machines.
//
// Every method may be called again after a crash at any point, any number of
// times, with the same arguments: implementations must converge, never
// duplicate. Errors other than the typed ones below are treated as transient
// and retried with backoff.
type Provider interface {
	// Name is a short, stable name for conditions, events and logs ("local").
	Name() string

	// Kinds are the providerSpec kinds this provider owns.
	Kinds() []schema.GroupVersionKind

	// Validate decodes a machine's merged providerSpec and checks it. It
	// returns an *InvalidSpecError naming the bad field when the user must fix
	// the blob. It has no side effects.
	Validate(raw []byte) error

	// Create makes the machine for req.UID if it does not exist yet, and
	// returns it. If a machine for req.UID already exists (a retry, or a
	// restarted controller), Create returns that one and makes nothing.
	Create(ctx context.Context, req *Request) (*Instance, error)

	// Get describes the machine made for uid. It returns a *NotFoundError when
	// no such machine exists.
	Get(ctx context.Context, uid types.UID) (*Instance, error)

	// Delete deletes the machine made for uid and everything it holds. It
	// returns nil when the machine is already gone.
	Delete(ctx context.Context, uid types.UID) error
}

// VersionLister is implemented by a provider that can run only some
// Kubernetes versions on control-plane machines (the local provider runs the
// releases make setup built). A Cluster or Machine asking for another version
// is refused at admission, listing these.
type VersionLister interface {
	// KubernetesVersions lists the control-plane versions the provider can
	// run, e.g. ["v1.36.3", "v1.37.2"]; nil means any.
	KubernetesVersions() ([]string, error)
}

// MachineLister is implemented by a provider that can list the machines
// it made, by the UID it was given: the safety controller removes those
// no Machine owns any more (orphans).
type MachineLister interface {
	MachineUIDs(ctx context.Context) ([]types.UID, error)
}

// VersionStager is implemented by a provider that must put the binaries
// of new versions on a running machine before it can run them: the InPlace
// upgrade (M12) calls it before it asks the machine for the versions.
//
// A running machine learns what to run from its own workload cluster,
// never from the provider: the machine controller writes v in the
// annotation cluster.marina.dev/desired-versions of the machine's Node,
// which the machine's agent watches; it restarts the component whose
// version changed, the others keep running. A provider without
// VersionStager still upgrades in place when its machines hold the
// binaries of every version they may be asked for (an image made with
// them); a missing binary fails the component, and the upgrade halts at
// that step after its stepTimeout.
type VersionStager interface {
	// StageVersions makes the binaries of v available on the machine made
	// for uid (copies them to a remote host; the local provider checks
	// that they exist on the management host). It does not make the
	// machine run them: the agent switches when it reads the desired
	// versions from its Node. It may be called any number of times with
	// the same v. It returns a *NotFoundError when no machine exists for
	// uid, and an *InvalidSpecError when a version cannot be had at all
	// (retrying does not help until the spec changes).
	StageVersions(ctx context.Context, uid types.UID, v Versions) error
}

// Starter is implemented by a provider whose machines can stop and be
// started again as they were: a host that rebooted, a process that was
// killed, a VM powered off outside marina. The machine controller calls it
// for a machine Get reports InstanceStopped, unless the Machine carries
// the annotation cluster.marina.dev/stopped-on-purpose (an operator powered
// it off and wants it off). A provider without it leaves a stopped machine
// stopped: its Machine says so (InstanceRunning=False, Stopped), and only
// a person or a MachineHealthCheck replacing it brings the capacity back.
type Starter interface {
	// Start starts the stopped machine made for uid again, with what it
	// already holds: its identity (name, address, providerID), its disk
	// and data, its certificates and, on a control-plane machine, its
	// etcd member. It never makes a new machine. It returns once the
	// machine is on its way (InstanceRunning, or InstancePending while it
	// boots), not once its workload is healthy: a stacked etcd member
	// needs the cluster's other members started too before it has a
	// quorum, and those are started by other calls.
	//
	// boot is nil to start the machine with the credentials it holds. A
	// provider that can tell they no longer work (a worker's node
	// certificate or token has expired) returns a *BootstrapNeededError,
	// and the controller calls again with a fresh Bootstrap, which the
	// provider hands the machine in place of its old one.
	//
	// A machine that runs is left as it is (Start is idempotent); one that
	// does not exist is a *NotFoundError.
	Start(ctx context.Context, uid types.UID, boot *Bootstrap) (*Instance, error)
}

// StateWatcher is implemented by a provider that can tell when one of its
// machines stops or starts on its own (a process that died, a VM powered
// off outside marina), so that the machine controller looks at it at once
// rather than on its next pass, which may be hours away.
type StateWatcher interface {
	// WatchStates calls changed with the UID of each machine whose state
	// may have changed, until ctx ends. A false alarm costs one reconcile;
	// a missed change waits for the next one.
	WatchStates(ctx context.Context, changed func(types.UID))
}

// Versions are what a machine's components should run.
type Versions struct {
	// Kubelet is the kubelet's version.
	Kubelet string
	// ControlPlane are the control-plane components' versions, on a
	// control-plane machine; empty fields keep what runs.
	ControlPlane clusterv1.ComponentVersions
	// Settings are, by version, the component settings (the cluster's
	// spec.controlPlane.components when a step moved a component to that
	// version): a component at one of these versions runs them, one at
	// another keeps the settings the machine was made with, so that
	// rolling a step back restores both.
	Settings map[string]clusterv1.ControlPlaneComponents
}

// Request is what a provider needs to make one machine.
type Request struct {
	// UID is the Machine's UID: the idempotency key of every call.
	UID types.UID
	// Namespace and Name of the Machine, for naming and logs. A worker's
	// Node registers under Name: marina approves the node certificate a
	// worker asks for with its bootstrap token for that name only.
	Namespace, Name string
	// Machine is the Machine's spec, with the class's node labels and taints
	// already merged in (M5).
	Machine clusterv1.MachineSpec
	// ProviderSpec is the merged providerSpec (class, then overrides), JSON.
	ProviderSpec []byte
	// Bootstrap is how the machine joins its cluster; produced by marina, the
	// same for every provider.
	Bootstrap Bootstrap
	// KubeletConfig is the kubelet configuration of spec.kubeletConfigRef
	// (M16), checked; nil: the kubelet's defaults.
	KubeletConfig *KubeletConfig
	// NodeAnnotations name the Machine on its Node. A provider whose
	// machines register their Node may put them there at registration;
	// marina writes whatever is missing once the Node is up, a write per
	// machine otherwise.
	NodeAnnotations map[string]string
}

// KubeletConfig is a kubelet configuration document and where it came
// from.
type KubeletConfig struct {
	// Name of the ConfigMap.
	Name string
	// Data is the KubeletConfiguration document.
	Data []byte
}

// Bootstrap is what a new machine needs to join its workload cluster. It
// never holds the management plane's credentials.
type Bootstrap struct {
	// Server is the workload cluster's API server URL.
	Server string
	// CAData is the PEM bundle that verifies Server.
	CAData []byte
	// Token is the credential the machine's agent uses to register its Node.
	// It is secret: providers store it with mode 0600 and never log it.
	// Empty on a control-plane machine, which makes its own credential.
	Token string
	// ClusterDNS is the cluster DNS Service's address (the kubelet's
	// clusterDNS) and ClusterDomain the cluster's DNS domain; empty when
	// the cluster has no DNS of marina's (a control plane run by someone
	// else).
	ClusterDNS    string
	ClusterDomain string
	// ControlPlane is set, instead of Server, CAData and Token, for a
	// machine with the ControlPlane role: a document the machine's agent
	// reads to make its certificates and run etcd, kube-apiserver,
	// kube-controller-manager and kube-scheduler (internal/bootstrap.Config,
	// JSON). It holds the cluster's CA keys, as a kubeadm control-plane node
	// does: providers put it on the machine with mode 0600, never in an
	// argument, a log or a status, and it is the same for every provider.
	ControlPlane []byte
}

// EndpointProvider is implemented by a provider that can make a cluster's
// control-plane endpoint: one stable address in front of every healthy API
// server of the cluster (a cloud's load balancer; on the local provider a
// balancer process). A provider without it needs the user to set
// spec.controlPlaneEndpoint.
type EndpointProvider interface {
	// EnsureEndpoint makes the endpoint of req.UID's cluster if it does not
	// exist, points it at req.Backends, and returns its address. Like
	// Create it is keyed by the UID and may be called any number of times.
	EnsureEndpoint(ctx context.Context, req *EndpointRequest) (host string, port int32, err error)
	// DeleteEndpoint removes the endpoint of the cluster with uid; nil when
	// it is already gone.
	DeleteEndpoint(ctx context.Context, uid types.UID) error
}

// EndpointLister is implemented by an EndpointProvider that can list the
// endpoints it made, by their Cluster's UID: the safety controller removes
// those whose Cluster is gone (a crash between the Cluster's finalizer and
// the endpoint's removal, a finalizer stripped by hand).
type EndpointLister interface {
	ClusterEndpoints(ctx context.Context) ([]types.UID, error)
}

// EndpointRequest is what a provider needs to make and update a cluster's
// control-plane endpoint.
type EndpointRequest struct {
	// UID is the Cluster's UID: the idempotency key.
	UID types.UID
	// Namespace and Name of the Cluster, for naming and logs.
	Namespace, Name string
	// Backends are the API servers, host:port, that should get traffic when
	// their /readyz answers ok; empty while the first one is being made.
	Backends []string
	// Draining are those of Backends about to be restarted gracefully (an
	// upgrade step): they get no new connections, and their open ones are
	// left for them to close (an API server shutting down tells its HTTP/2
	// clients to go, and finishes what they asked), not cut.
	Draining []string
	// CAData verifies the API servers' serving certificates (PEM).
	CAData []byte
	// ClientCert and ClientKey (PEM) authenticate the endpoint's health
	// checks to the API servers. ClientKey is secret: stored 0600, never
	// logged.
	ClientCert, ClientKey []byte
	// Host and Port are the endpoint the user set in
	// spec.controlPlaneEndpoint, if any. A provider that can listen there
	// makes the endpoint there; one that cannot returns an
	// *EndpointElsewhereError: the address is then the user's own balancer.
	// Empty, the provider picks the address.
	Host string
	Port int32
}

// EndpointElsewhereError says the provider cannot make the endpoint at the
// address the user set (it is not one of the provider's): that address is
// the user's to serve.
type EndpointElsewhereError struct{ Host string }

func (e *EndpointElsewhereError) Error() string {
	return fmt.Sprintf("the control-plane endpoint's host %s is not an address the provider can listen on", e.Host)
}

// IsEndpointElsewhere reports whether err is (or wraps) an
// *EndpointElsewhereError.
func IsEndpointElsewhere(err error) bool {
	var e *EndpointElsewhereError
	return errors.As(err, &e)
}

// EndpointNotAllowedError says the user set the endpoint at an address the
// provider could listen on but its operator did not open to clusters (the
// management host's own addresses, say, where a cluster's balancer could
// take a port the management plane needs).
type EndpointNotAllowedError struct {
	Host string
	Port int32
	// Why says what the operator allows and how to change it.
	Why string
}

func (e *EndpointNotAllowedError) Error() string {
	return fmt.Sprintf("the control-plane endpoint %s is an address of this host that clusters may not listen on: %s",
		net.JoinHostPort(e.Host, strconv.Itoa(int(e.Port))), e.Why)
}

// IsEndpointNotAllowed reports whether err is (or wraps) an
// *EndpointNotAllowedError.
func IsEndpointNotAllowed(err error) bool {
	var e *EndpointNotAllowedError
	return errors.As(err, &e)
}

// InstanceState is the provider's view of a machine's life.
type InstanceState string

// Instance states.
const (
	// InstancePending: created but not yet started.
	InstancePending InstanceState = "Pending"
	// InstanceRunning: the machine runs.
	InstanceRunning InstanceState = "Running"
	// InstanceStopped: the machine exists but does not run (it crashed, its
	// host rebooted, or it was stopped outside marina). A Starter starts it
	// again.
	InstanceStopped InstanceState = "Stopped"
)

// Instance is a real machine as its provider describes it.
type Instance struct {
	// ProviderID is "<provider>://<id>"; the machine's Node carries the same.
	ProviderID string
	// Addresses of the machine.
	Addresses []clusterv1.MachineAddress
	// State of the machine.
	State InstanceState
}

// InvalidSpecError says the providerSpec cannot be used as it is; retrying
// does not help, the user must change it.
type InvalidSpecError struct {
	// Field is the JSON path of the bad field, e.g. "spec.memory".
	Field string
	// Message says what is wrong and what would be right.
	Message string
}

func (e *InvalidSpecError) Error() string {
	if e.Field == "" {
		return "invalid providerSpec: " + e.Message
	}
	return fmt.Sprintf("invalid providerSpec field %s: %s", e.Field, e.Message)
}

// IsInvalidSpec reports whether err is (or wraps) an *InvalidSpecError.
func IsInvalidSpec(err error) bool {
	var e *InvalidSpecError
	return errors.As(err, &e)
}

// BootstrapNeededError says a stopped machine cannot start with the
// credentials it holds: Start wants a fresh Bootstrap.
type BootstrapNeededError struct {
	// Reason says why, e.g. "the node certificate expired on ...". It holds
	// no secret.
	Reason string
}

func (e *BootstrapNeededError) Error() string {
	return "the machine needs fresh credentials to start: " + e.Reason
}

// IsBootstrapNeeded reports whether err is (or wraps) a
// *BootstrapNeededError.
func IsBootstrapNeeded(err error) bool {
	var e *BootstrapNeededError
	return errors.As(err, &e)
}

// NotFoundError says the provider has no machine for the UID.
type NotFoundError struct{ UID types.UID }

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("no machine exists for uid %s", e.UID)
}

// IsNotFound reports whether err is (or wraps) a *NotFoundError.
func IsNotFound(err error) bool {
	var e *NotFoundError
	return errors.As(err, &e)
}

// IgnoreNotFound returns nil for a *NotFoundError and err otherwise.
func IgnoreNotFound(err error) error {
	if IsNotFound(err) {
		return nil
	}
	return err
}

package sandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"

	"marina.dev/marina/internal/files"
)

// Files of a sandbox directory.
const (
	// BootstrapFile holds the Bootstrap document (mode 0600: it holds a token).
	BootstrapFile = "bootstrap.json"
	// LockFile is flocked exclusively by the running agent for its lifetime.
	LockFile = "agent.lock"
	// PIDFile records the PID of the agent the provider last started.
	PIDFile = "agent.pid"
	// LogFile receives the agent's standard output and error.
	LogFile = "agent.log"
	// ControlPlaneFile, on a control-plane machine only, holds the control
	// plane's document (bootstrap.Config, JSON; mode 0600: it holds the
	// cluster's CA keys).
	ControlPlaneFile = "controlplane.json"
	// NodeCertFile and NodeKeyFile hold the node's client credential (mode
	// 0600): a worker's got by TLS bootstrap and renewed by a new request
	// before it ends; a control-plane machine's issued by the machine
	// itself from the cluster CA, and renewed with its other certificates.
	NodeCertFile = "node.crt"
	NodeKeyFile  = "node.key"
	// KubeletConfigFile holds the kubelet configuration document the
	// machine was given (M16), when Bootstrap.KubeletConfigName is set.
	KubeletConfigFile = "kubelet.yaml"
)

// Bootstrap is everything a node agent knows about its machine and its
// workload cluster. It holds no management-plane credential.
type Bootstrap struct {
	// Server is the workload cluster's API server URL; empty on a
	// control-plane machine, which talks to its own.
	Server string `json:"server"`
	// CAPEM is the PEM bundle that verifies Server.
	CAPEM string `json:"caPEM"`
	// Token is the bearer token the agent authenticates with. Secret.
	Token string `json:"token"`
	// ClusterDNS is the cluster DNS address and ClusterDomain the
	// cluster's DNS domain, which a real kubelet gives its pods; empty:
	// none (and the domain cluster.local).
	ClusterDNS    string `json:"clusterDNS,omitempty"`
	ClusterDomain string `json:"clusterDomain,omitempty"`
	// NodeName is the name the agent registers its Node under.
	NodeName string `json:"nodeName"`
	// ProviderID is the Node's spec.providerID, e.g. local://<uid>.
	ProviderID string `json:"providerID"`
	// Address is the machine's loopback address (InternalIP, pod IPs).
	Address string `json:"address"`
	// Labels are put on the Node at registration.
	Labels map[string]string `json:"labels,omitempty"`
	// Taints are put on the Node at registration.
	Taints []corev1.Taint `json:"taints,omitempty"`
	// Annotations are put on the Node at registration.
	Annotations map[string]string `json:"annotations,omitempty"`
	// Capacity is the Node's capacity (and allocatable).
	Capacity corev1.ResourceList `json:"capacity"`
	// KubeletVersion is reported in status.nodeInfo.kubeletVersion.
	KubeletVersion string `json:"kubeletVersion"`
	// BinDir, on a control-plane machine, holds the binaries its
	// components run (<component>-<version>).
	BinDir string `json:"binDir,omitempty"`
	// ContainerRuntimeVersion is reported in
	// status.nodeInfo.containerRuntimeVersion, e.g. containerd://2.1.4.
	ContainerRuntimeVersion string `json:"containerRuntimeVersion,omitempty"`
	// KubeletConfigName is the ConfigMap the kubelet configuration in
	// KubeletConfigFile came from; empty: the kubelet's defaults.
	KubeletConfigName string `json:"kubeletConfigName,omitempty"`
	// AdvertiseAddress, on a control-plane machine, is the address its API
	// server advertises as the kubernetes Service's endpoint when that is
	// not its own: on the local provider, whose machines' addresses are
	// loopback ones, the real machines' API address. Empty: its own.
	AdvertiseAddress string `json:"advertiseAddress,omitempty"`
	// Real, on a worker whose kubelet is real (issue 32), is what the
	// machine runs on; nil: the agent plays the kubelet.
	Real *RealNode `json:"real,omitempty"`
}

// RealNode is what a machine with a real kubelet needs beside its
// Bootstrap: its network, its cgroup and its runtime's binaries. Address is
// the machine's address on the bridge's network.
type RealNode struct {
	// NetNS is the network namespace file the kubelet and the runtime
	// run in, e.g. /run/netns/marina-<hash>.
	NetNS string `json:"netns"`
	// Network is the bridge's network (e.g. 10.231.0.0/16): the Nodes
	// whose address is in it are reached in one hop.
	Network string `json:"network"`
	// Cgroup is the machine's cgroup (e.g. /marina/<uid>) in every
	// hierarchy: the agent joins it, the kubelet's cgroupRoot is below it.
	Cgroup string `json:"cgroup"`
	// RuntimeDir holds the runtime's state and sockets (kept short:
	// socket paths are at most 107 bytes), e.g. /run/marina/<hash>.
	RuntimeDir string `json:"runtimeDir"`
	// ContainerdVersion is the containerd the machine runs
	// (containerd-<version> in BinDir).
	ContainerdVersion string `json:"containerdVersion"`
	// CNIBinDir holds the CNI reference plugins (bridge, host-local,
	// loopback, portmap).
	CNIBinDir string `json:"cniBinDir"`
	// Registry is the host:port, on the management host, of the OCI
	// registry (plain HTTP) the node pulls every image from: the agent
	// relays to it from inside the namespace, and containerd asks it for
	// every registry's images. Empty: no registry, the node pulls only
	// what its images' names say (nothing answers here).
	Registry string `json:"registry,omitempty"`
	// MaxPods is the kubelet's maxPods.
	MaxPods int `json:"maxPods"`
	// APIAddress is the address, on the namespace's loopback device, where
	// the agent relays to the cluster's endpoint for the pods: the
	// kubernetes Service's endpoints (the control plane's
	// Bootstrap.AdvertiseAddress); empty: no relay for pods.
	APIAddress string `json:"apiAddress,omitempty"`
}

// ReadBootstrap reads dir's bootstrap document. Its error wraps
// fs.ErrNotExist when the sandbox or the file does not exist.
func ReadBootstrap(dir string) (*Bootstrap, error) {
	data, err := os.ReadFile(filepath.Join(dir, BootstrapFile))
	if err != nil {
		return nil, fmt.Errorf("reading the bootstrap of sandbox %s: %w", dir, err)
	}
	var b Bootstrap
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", filepath.Join(dir, BootstrapFile), err)
	}
	return &b, nil
}

// WriteBootstrap writes b into dir atomically, readable by its owner only.
func WriteBootstrap(dir string, b *Bootstrap) error {
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the bootstrap: %w", err)
	}
	return files.WriteAtomic(filepath.Join(dir, BootstrapFile), data, 0o600)
}

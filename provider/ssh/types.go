package ssh

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	kjson "sigs.k8s.io/json"

	"marina.dev/marina/provider"
)

// GroupVersion is the API group and version of SSHMachine.
var GroupVersion = schema.GroupVersion{Group: "ssh.marina.dev", Version: "v1alpha1"}

// Kind is the providerSpec kind this provider owns.
const Kind = "SSHMachine"

// Keys of the objects an SSHMachine refers to.
const (
	// HostsKey is the key of a hostsRef ConfigMap holding the host list
	// (YAML or JSON, a list of Host).
	HostsKey = "hosts.yaml"
	// PrivateKeyKey is the key of the Secret holding the private key marina
	// logs in with (OpenSSH or PEM format, unencrypted).
	PrivateKeyKey = "privateKey"
	// KnownHostsKey is the key of the Secret holding the hosts' public keys,
	// in OpenSSH's known_hosts format: a host whose key is not there is
	// refused (no trust on first use).
	KnownHostsKey = "knownHosts"
)

// SSHMachine is the providerSpec of a machine on the SSH provider, e.g.
//
//	apiVersion: ssh.marina.dev/v1alpha1
//	kind: SSHMachine
//	spec:
//	  hostsRef: {name: ssh-hosts}
//	  hostSelector: {role: worker}
//	  secretRef: {name: ssh-hosts}
//	  templatesRef: {name: my-provisioning}   # optional
type SSHMachine struct {
	metav1.TypeMeta `json:",inline"`
	// Metadata is accepted, as on any embedded object, and ignored.
	Metadata metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec     SSHMachineSpec    `json:"spec"`
}

// SSHMachineSpec says which hosts a machine may claim and how to reach
// them. The objects it names are in the Machine's namespace.
type SSHMachineSpec struct {
	// Hosts are the candidate hosts. Exactly one of hosts and hostsRef.
	Hosts []Host `json:"hosts,omitempty"`
	// HostsRef names a ConfigMap whose key hosts.yaml lists the candidate
	// hosts, so that many classes share one inventory.
	HostsRef *LocalRef `json:"hostsRef,omitempty"`
	// HostSelector keeps the candidates whose labels hold all of these.
	HostSelector map[string]string `json:"hostSelector,omitempty"`
	// SecretRef names the Secret with the private key (privateKey) and the
	// hosts' keys (knownHosts). Required.
	SecretRef LocalRef `json:"secretRef"`
	// TemplatesRef names a ConfigMap of provisioning templates, replacing
	// the defaults: keys provision-<NN>-<step>.sh and
	// deprovision-<NN>-<step>.sh, run in key order (docs/providers.md).
	TemplatesRef *LocalRef `json:"templatesRef,omitempty"`
}

// Host is one server marina may claim.
type Host struct {
	// Address is the host's IP address: the machine's InternalIP, and what
	// its components listen on.
	Address string `json:"address"`
	// Port of sshd; 22 when unset.
	Port int `json:"port,omitempty"`
	// User marina logs in as; root when unset. It must be able to write
	// /var/lib/marina and start the agent.
	User string `json:"user,omitempty"`
	// Labels, matched by hostSelector.
	Labels map[string]string `json:"labels,omitempty"`
}

// LocalRef names an object in the Machine's namespace.
type LocalRef struct {
	Name string `json:"name"`
}

// target is host:port, as SSH dials and known_hosts names it.
func (h Host) target() string { return fmt.Sprintf("%s:%d", h.Address, h.Port) }

// Decode decodes and checks an SSHMachine blob (JSON), filling in
// defaults. Every problem the user must fix is a *provider.InvalidSpecError
// naming the field.
func Decode(raw []byte) (*SSHMachine, error) {
	if len(raw) == 0 {
		return nil, &provider.InvalidSpecError{Message: "providerSpec is empty: set apiVersion: ssh.marina.dev/v1alpha1, kind: SSHMachine and spec"}
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(raw, &tm); err != nil {
		return nil, &provider.InvalidSpecError{Message: "providerSpec is not a JSON object: " + err.Error()}
	}
	if tm.Kind != Kind {
		return nil, &provider.InvalidSpecError{Field: "kind", Message: fmt.Sprintf("the ssh provider takes kind %s, not %q", Kind, tm.Kind)}
	}
	if tm.APIVersion != GroupVersion.String() {
		return nil, &provider.InvalidSpecError{Field: "apiVersion", Message: fmt.Sprintf("%s is served as %s, not %q", Kind, GroupVersion, tm.APIVersion)}
	}
	var m SSHMachine
	strict, err := kjson.UnmarshalStrict(raw, &m)
	if err != nil {
		return nil, &provider.InvalidSpecError{Message: "cannot decode providerSpec: " + err.Error()}
	}
	if len(strict) > 0 {
		var fe kjson.FieldError
		if errors.As(strict[0], &fe) {
			return nil, &provider.InvalidSpecError{Field: fe.FieldPath(), Message: strict[0].Error()}
		}
		return nil, &provider.InvalidSpecError{Message: strict[0].Error()}
	}
	s := &m.Spec
	switch {
	case len(s.Hosts) == 0 && s.HostsRef == nil:
		return nil, &provider.InvalidSpecError{Field: "spec.hosts", Message: "name the candidate hosts: set spec.hosts, or spec.hostsRef to a ConfigMap listing them"}
	case len(s.Hosts) > 0 && s.HostsRef != nil:
		return nil, &provider.InvalidSpecError{Field: "spec.hostsRef", Message: "set spec.hosts or spec.hostsRef, not both"}
	}
	if err := checkRef("spec.hostsRef", s.HostsRef, false); err != nil {
		return nil, err
	}
	if err := checkRef("spec.secretRef", &s.SecretRef, true); err != nil {
		return nil, err
	}
	if err := checkRef("spec.templatesRef", s.TemplatesRef, false); err != nil {
		return nil, err
	}
	if err := checkHosts("spec.hosts", s.Hosts); err != nil {
		return nil, err
	}
	return &m, nil
}

func checkRef(field string, r *LocalRef, required bool) error {
	if r == nil {
		return nil
	}
	if r.Name == "" {
		if required {
			return &provider.InvalidSpecError{Field: field + ".name", Message: "is required: the Secret with privateKey and knownHosts"}
		}
		return &provider.InvalidSpecError{Field: field + ".name", Message: "is required"}
	}
	if errs := validation.IsDNS1123Subdomain(r.Name); len(errs) > 0 {
		return &provider.InvalidSpecError{Field: field + ".name", Message: strings.Join(errs, "; ")}
	}
	return nil
}

// checkHosts checks a host list and fills in the defaults; field names it
// in errors.
func checkHosts(field string, hosts []Host) error {
	seen := map[string]bool{}
	for i := range hosts {
		h := &hosts[i]
		f := fmt.Sprintf("%s[%d]", field, i)
		addr, err := netip.ParseAddr(h.Address)
		if err != nil {
			return &provider.InvalidSpecError{Field: f + ".address", Message: fmt.Sprintf("%q is not an IP address: the machine's components listen on it and its Node reports it", h.Address)}
		}
		h.Address = addr.String()
		if h.Port == 0 {
			h.Port = 22
		}
		if h.Port < 1 || h.Port > 65535 {
			return &provider.InvalidSpecError{Field: f + ".port", Message: fmt.Sprintf("must be 1 to 65535, not %d", h.Port)}
		}
		if h.User == "" {
			h.User = "root"
		}
		if seen[h.target()] {
			return &provider.InvalidSpecError{Field: f, Message: fmt.Sprintf("host %s is listed twice", h.target())}
		}
		seen[h.target()] = true
	}
	return nil
}

// selected are the hosts whose labels hold all of selector's.
func selected(hosts []Host, selector map[string]string) []Host {
	var out []Host
	for _, h := range hosts {
		ok := true
		for k, v := range selector {
			if h.Labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, h)
		}
	}
	return out
}

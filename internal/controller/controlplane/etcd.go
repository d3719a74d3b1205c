package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/pki"
)

// EtcdMember is one member of an etcd cluster as marina sees it.
type EtcdMember struct {
	ID       uint64
	Name     string
	PeerURLs []string
	// Healthy: the member answered a health check.
	Healthy bool
}

// Etcd is an open connection to a cluster's etcd.
type Etcd interface {
	// Members lists the members, each with its health.
	Members(ctx context.Context) ([]EtcdMember, error)
	// RemoveMember removes a member; nil when it is already gone.
	RemoveMember(ctx context.Context, id uint64) error
	Close() error
}

// EtcdDialer opens a connection to the etcd members at endpoints (client
// URLs), verified with caPEM, authenticated with the client pair.
type EtcdDialer func(ctx context.Context, endpoints []string, caPEM, certPEM, keyPEM []byte) (Etcd, error)

// etcdState is what observeEtcd saw.
type etcdState struct {
	members []EtcdMember
	err     error // nothing was learnt: no member answered
}

func (s *etcdState) healthy() int {
	n := 0
	for _, m := range s.members {
		if m.Healthy {
			n++
		}
	}
	return n
}

// memberOf finds m's member by name or by its peer URL's host.
func (s *etcdState) memberOf(m *clusterv1.Machine) *EtcdMember {
	ip := address(m)
	for i := range s.members {
		member := &s.members[i]
		if member.Name == m.Name {
			return member
		}
		for _, u := range member.PeerURLs {
			if parsed, err := url.Parse(u); err == nil && ip != "" && parsed.Hostname() == ip {
				return member
			}
		}
	}
	return nil
}

// etcdAccess is where a cluster's etcd answers and how to reach it.
type etcdAccess struct {
	endpoints                 []string
	ca, clientCert, clientKey []byte
}

// access says how marina reaches the cluster's etcd: the stacked members of
// the machines that exist, with a client certificate marina issues from
// the etcd CA; or the external endpoints with the user's certificate.
func (cp *ControlPlane) access(ctx context.Context, cluster *clusterv1.Cluster, set *clusterpki.Set, machines []clusterv1.Machine) (*etcdAccess, error) {
	if !stacked(cluster) {
		return externalAccess(ctx, cp.Client, cluster)
	}
	a := &etcdAccess{endpoints: clientURLs(machines, "")}
	if len(a.endpoints) == 0 {
		return nil, errors.New("no control-plane machine runs an etcd member yet")
	}
	if set == nil || set.Etcd == nil {
		return nil, errors.New("the etcd CA is not loaded")
	}
	pair, err := set.Etcd.Issue(pki.CertSpec{CommonName: "marina-controller", Usage: pki.ClientAuth})
	if err != nil {
		return nil, fmt.Errorf("issuing an etcd client certificate: %w", err)
	}
	key, err := pair.KeyPEM()
	if err != nil {
		return nil, err
	}
	a.ca, a.clientCert, a.clientKey = set.Etcd.CertPEM(), pair.CertPEM(), key
	return a, nil
}

// clientURLs are the etcd client URLs of the machines that have an address,
// but skip.
func clientURLs(machines []clusterv1.Machine, skip string) []string {
	var urls []string
	for i := range machines {
		m := &machines[i]
		if ip := address(m); ip != "" && m.Name != skip {
			urls = append(urls, "https://"+net.JoinHostPort(ip, strconv.Itoa(bootstrap.DefaultEtcdClientPort)))
		}
	}
	return urls
}

// externalAccess reads spec.controlPlane.etcd.external and its Secret.
func externalAccess(ctx context.Context, c client.Reader, cluster *clusterv1.Cluster) (*etcdAccess, error) {
	x := cluster.Spec.ControlPlane.Etcd.External
	if x == nil {
		return nil, errors.New("spec.controlPlane.etcd.external is not set")
	}
	a := &etcdAccess{endpoints: x.Endpoints}
	if x.SecretRef == nil {
		return a, nil
	}
	secret := &corev1.Secret{}
	key := types.NamespacedName{Namespace: cluster.Namespace, Name: x.SecretRef.Name}
	if err := c.Get(ctx, key, secret); err != nil {
		return nil, fmt.Errorf("reading the external etcd's Secret %s: %w", key, err)
	}
	a.ca, a.clientCert, a.clientKey = secret.Data["ca.crt"], secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey]
	if len(a.ca) == 0 || len(a.clientCert) == 0 || len(a.clientKey) == 0 {
		return nil, fmt.Errorf("the external etcd's Secret %s needs the keys ca.crt, tls.crt and tls.key", key)
	}
	return a, nil
}

// observeEtcd lists the etcd members with their health. An error is kept
// in the state: it is a fact for the planner (no member answers), not a
// reason to stop reconciling.
func (cp *ControlPlane) observeEtcd(ctx context.Context, cluster *clusterv1.Cluster, set *clusterpki.Set, machines []clusterv1.Machine) *etcdState {
	members, err := cp.withEtcd(ctx, cluster, set, machines, "", func(ctx context.Context, e Etcd) ([]EtcdMember, error) {
		return e.Members(ctx)
	})
	return &etcdState{members: members, err: err}
}

// removeMember removes m's etcd member, through the other members.
func (cp *ControlPlane) removeMember(ctx context.Context, cluster *clusterv1.Cluster, set *clusterpki.Set, machines []clusterv1.Machine, m *clusterv1.Machine) error {
	_, err := cp.withEtcd(ctx, cluster, set, machines, m.Name, func(ctx context.Context, e Etcd) ([]EtcdMember, error) {
		members, err := e.Members(ctx)
		if err != nil {
			return nil, err
		}
		state := &etcdState{members: members}
		member := state.memberOf(m)
		if member == nil {
			return nil, nil
		}
		if len(members) == 1 {
			return nil, nil // the last member goes with its machine and the cluster
		}
		return nil, e.RemoveMember(ctx, member.ID)
	})
	if err != nil {
		return fmt.Errorf("removing the etcd member of machine %s: %w", m.Name, err)
	}
	return nil
}

func (cp *ControlPlane) withEtcd(ctx context.Context, cluster *clusterv1.Cluster, set *clusterpki.Set, machines []clusterv1.Machine, skip string,
	f func(context.Context, Etcd) ([]EtcdMember, error)) ([]EtcdMember, error) {
	if cp.Etcd == nil {
		return nil, errors.New("no etcd client is configured")
	}
	a, err := cp.access(ctx, cluster, set, machines)
	if err != nil {
		return nil, err
	}
	if skip != "" && stacked(cluster) {
		if others := clientURLs(machines, skip); len(others) > 0 {
			a.endpoints = others // a member being removed may be down
		}
	}
	ctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	e, err := cp.Etcd(ctx, a.endpoints, a.ca, a.clientCert, a.clientKey)
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd: %w", err)
	}
	defer e.Close()
	return f(ctx, e)
}

// setEtcdCondition reports the etcd cluster's health (M14).
func setEtcdCondition(cluster *clusterv1.Cluster, s *etcdState) {
	switch {
	case s.err != nil:
		reason := clusterv1.ClusterEtcdUnreachableReason
		setCondition(cluster, clusterv1.ClusterEtcdHealthyCondition, metav1.ConditionFalse, reason, s.err.Error())
	case s.healthy() < len(s.members):
		var sick []string
		for _, m := range s.members {
			if !m.Healthy {
				name := m.Name
				if name == "" {
					name = fmt.Sprintf("%x (not started)", m.ID)
				}
				sick = append(sick, name)
			}
		}
		setCondition(cluster, clusterv1.ClusterEtcdHealthyCondition, metav1.ConditionFalse, clusterv1.ClusterEtcdMemberUnhealthyReason,
			fmt.Sprintf("%d of %d etcd members are healthy; not answering: %v", s.healthy(), len(s.members), sick))
	default:
		setCondition(cluster, clusterv1.ClusterEtcdHealthyCondition, metav1.ConditionTrue, clusterv1.ClusterEtcdHealthyReason,
			fmt.Sprintf("%d of %d etcd members are healthy", len(s.members), len(s.members)))
	}
}

// compareVersions orders two Kubernetes or etcd versions; unparsable ones
// compare as strings.
func compareVersions(a, b string) int {
	va, err := version.ParseGeneric(a)
	if err != nil {
		return compareStrings(a, b)
	}
	c, err := va.Compare(b)
	if err != nil {
		return compareStrings(a, b)
	}
	return c
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
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
	// Healthy: the member answered a health check and votes.
	Healthy bool
	// Learner: the member does not vote yet (it was added and has not
	// caught up, or it never started).
	Learner bool
}

// votes: the member counts towards the quorum.
func (m *EtcdMember) votes() bool { return !m.Learner }

// healthyVoter: the member answers and counts towards the quorum.
func (m *EtcdMember) healthyVoter() bool { return m.Healthy && !m.Learner }

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
	// of is each machine's member, by machine name; orphans are the
	// members of no machine (both set when err is nil).
	of      map[string]*EtcdMember
	orphans []EtcdMember
}

func newEtcdState(members []EtcdMember, err error, machines []clusterv1.Machine) *etcdState {
	s := &etcdState{members: members, err: err}
	if err == nil {
		s.of, s.orphans = matchMembers(machines, members)
	}
	return s
}

// healthy counts the voting members that answer.
func (s *etcdState) healthy() int {
	n := 0
	for i := range s.members {
		if s.members[i].healthyVoter() {
			n++
		}
	}
	return n
}

func (s *etcdState) voters() int {
	n := 0
	for i := range s.members {
		if s.members[i].votes() {
			n++
		}
	}
	return n
}

// memberOf is m's member, nil when it has none or etcd is unknown.
func (s *etcdState) memberOf(m *clusterv1.Machine) *EtcdMember {
	return s.of[m.Name]
}

// recordedMember is the member ID recorded on m (EtcdMemberIDAnnotation).
func recordedMember(m *clusterv1.Machine) (uint64, bool) {
	v, ok := m.Annotations[clusterv1.EtcdMemberIDAnnotation]
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseUint(v, 16, 64)
	return id, err == nil
}

// matchMembers finds each machine's member, each member for one machine
// at most: a machine with a recorded member ID has that member or none (a
// name or address reused later never moves it); the others are matched
// by their address (the host of the member's peer URL, which is how a
// joining machine adds its member, before the member has a name), then
// by name (a started member is named after its machine). The members
// left belong to no machine.
func matchMembers(machines []clusterv1.Machine, members []EtcdMember) (map[string]*EtcdMember, []EtcdMember) {
	of := map[string]*EtcdMember{}
	taken := map[uint64]bool{}
	byID := map[uint64]*EtcdMember{}
	for i := range members {
		byID[members[i].ID] = &members[i]
	}
	for i := range machines {
		m := &machines[i]
		if id, ok := recordedMember(m); ok {
			if member := byID[id]; member != nil && !taken[id] {
				of[m.Name], taken[id] = member, true
			}
		}
	}
	matchBy := func(match func(m *clusterv1.Machine, member *EtcdMember) bool) {
		for i := range machines {
			m := &machines[i]
			if _, recorded := recordedMember(m); recorded || of[m.Name] != nil {
				continue
			}
			for j := range members {
				if member := &members[j]; !taken[member.ID] && match(m, member) {
					of[m.Name], taken[member.ID] = member, true
					break
				}
			}
		}
	}
	matchBy(func(m *clusterv1.Machine, member *EtcdMember) bool {
		ip := address(m)
		if ip == "" {
			return false
		}
		for _, u := range member.PeerURLs {
			if parsed, err := url.Parse(u); err == nil && parsed.Hostname() == ip {
				return true
			}
		}
		return false
	})
	matchBy(func(m *clusterv1.Machine, member *EtcdMember) bool { return member.Name != "" && member.Name == m.Name })
	var orphans []EtcdMember
	for _, member := range members {
		if !taken[member.ID] {
			orphans = append(orphans, member)
		}
	}
	return of, orphans
}

// recordMembers writes each machine's member ID on it the first time its
// member is seen (EtcdMemberIDAnnotation), so that from then on it is
// known by ID alone.
func (cp *ControlPlane) recordMembers(ctx context.Context, machines []clusterv1.Machine, etcd *etcdState) error {
	for i := range machines {
		m := &machines[i]
		member := etcd.memberOf(m)
		if _, recorded := recordedMember(m); recorded || member == nil {
			continue
		}
		before := m.DeepCopy()
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[clusterv1.EtcdMemberIDAnnotation] = strconv.FormatUint(member.ID, 16)
		if err := cp.Client.Patch(ctx, m, client.MergeFrom(before)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("recording the etcd member of machine %s: %w", m.Name, err)
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
		return externalAccess(ctx, cp.Live, cluster)
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

// externalAccess reads spec.controlPlane.etcd.external and its Secret, the
// user's, uncached through c (marina's cache holds only Secrets it labels).
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
	return newEtcdState(members, err, machines)
}

// removeMember removes m's etcd member, through the other members. The
// planner projected the quorum from what it saw; the members are listed
// again here and the projection made again, so that a member that stopped
// answering since is not counted on.
func (cp *ControlPlane) removeMember(ctx context.Context, cluster *clusterv1.Cluster, set *clusterpki.Set, machines []clusterv1.Machine, m *clusterv1.Machine) error {
	_, err := cp.withEtcd(ctx, cluster, set, machines, m.Name, func(ctx context.Context, e Etcd) ([]EtcdMember, error) {
		members, err := e.Members(ctx)
		if err != nil {
			return nil, err
		}
		state := newEtcdState(members, nil, machines)
		member := state.memberOf(m)
		if member == nil {
			return nil, nil
		}
		if len(members) == 1 {
			return nil, nil // the last member goes with its machine and the cluster
		}
		if err := safeToRemove(state, member); err != nil {
			return nil, err
		}
		return nil, e.RemoveMember(ctx, member.ID)
	})
	if err != nil {
		return fmt.Errorf("removing the etcd member of machine %s: %w", m.Name, err)
	}
	return nil
}

// removeOrphan removes the member id, when the members listed again still
// show it belongs to no machine and its removal keeps the quorum.
func (cp *ControlPlane) removeOrphan(ctx context.Context, cluster *clusterv1.Cluster, set *clusterpki.Set, machines []clusterv1.Machine, id uint64) error {
	_, err := cp.withEtcd(ctx, cluster, set, machines, "", func(ctx context.Context, e Etcd) ([]EtcdMember, error) {
		members, err := e.Members(ctx)
		if err != nil {
			return nil, err
		}
		state := newEtcdState(members, nil, machines)
		i := slices.IndexFunc(state.orphans, func(o EtcdMember) bool { return o.ID == id })
		if i < 0 {
			return nil, nil // gone, or it turned out to be a machine's
		}
		if err := safeToRemove(state, &state.orphans[i]); err != nil {
			return nil, err
		}
		return nil, e.RemoveMember(ctx, id)
	})
	if err != nil {
		return fmt.Errorf("removing etcd member %x, which belongs to no machine: %w", id, err)
	}
	return nil
}

// safeToRemove is the quorum projection made again on a fresh list.
func safeToRemove(s *etcdState, member *EtcdMember) error {
	if ok, after, healthyAfter := KeepsQuorum(s.voters(), s.healthy(), member.votes(), member.healthyVoter()); !ok {
		return fmt.Errorf("not removed: it would leave %d healthy of %d voting members, below the quorum of %d", healthyAfter, after, after/2+1)
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

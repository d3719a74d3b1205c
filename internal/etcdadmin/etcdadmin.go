// Package etcdadmin changes and inspects an etcd cluster's membership
// (M14): the node agent adds a new control-plane machine's member before
// starting it, and the control plane removes a member before its machine
// goes and checks every member's health. It speaks etcd's own client.
package etcdadmin

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Member is one member of the cluster.
type Member struct {
	ID   uint64
	Name string // empty while an added member has not started
	// PeerURLs and ClientURLs as the member advertises them.
	PeerURLs, ClientURLs []string
	// Learner: the member does not vote yet.
	Learner bool
	// Healthy: the member answered a status request (set by Members) and
	// votes.
	Healthy bool
}

// Client is a connection to an etcd cluster.
type Client struct {
	c *clientv3.Client
}

// Config is how to reach a cluster.
type Config struct {
	// Endpoints are client URLs of members.
	Endpoints []string
	// CA verifies the members (PEM); Cert and Key authenticate marina (PEM,
	// Key secret).
	CA, Cert, Key []byte
	// DialTimeout bounds connecting; 5s when zero.
	DialTimeout time.Duration
}

// New connects to the cluster.
func New(ctx context.Context, cfg Config) (*Client, error) {
	tlsCfg, err := tlsConfig(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Endpoints,
		TLS:         tlsCfg,
		DialTimeout: cfg.DialTimeout,
		Context:     ctx,
		// The client's own zap logger would write to stderr outside our
		// structured logs; its errors reach us as returned errors.
		Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd at %v: %w", cfg.Endpoints, err)
	}
	return &Client{c: c}, nil
}

func tlsConfig(cfg Config) (*tls.Config, error) {
	if len(cfg.CA) == 0 {
		return nil, errors.New("etcd: no CA to verify the members with")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cfg.CA) {
		return nil, errors.New("etcd: the CA bundle holds no PEM certificate")
	}
	t := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if len(cfg.Cert) > 0 {
		pair, err := tls.X509KeyPair(cfg.Cert, cfg.Key)
		if err != nil {
			// tls's errors name the problem without quoting the key.
			return nil, fmt.Errorf("etcd: the client certificate and key: %w", err)
		}
		t.Certificates = []tls.Certificate{pair}
	}
	return t, nil
}

// Close ends the connection.
func (c *Client) Close() error { return c.c.Close() }

// List returns the members, without their health.
func (c *Client) List(ctx context.Context) ([]Member, error) {
	resp, err := c.c.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing etcd members: %w", err)
	}
	out := make([]Member, 0, len(resp.Members))
	for _, m := range resp.Members {
		out = append(out, Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, Learner: m.IsLearner})
	}
	return out, nil
}

// statusTimeout bounds one member's status: a member that is down would
// otherwise hold the call until ctx ends (the client waits for a
// connection), leaving nothing of ctx for what the caller does next, such
// as removing that very member.
const statusTimeout = time.Second

// Members returns the members, each asked for its status in parallel: one
// that does not answer within a second (or ctx) is unhealthy.
func (c *Client) Members(ctx context.Context) ([]Member, error) {
	members, err := c.List(ctx)
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	for i := range members {
		m := &members[i]
		if len(m.ClientURLs) == 0 {
			continue // added, not started: not healthy
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, statusTimeout)
			defer cancel()
			for _, u := range m.ClientURLs {
				if st, err := c.c.Status(sctx, u); err == nil && len(st.Errors) == 0 {
					m.Healthy = !m.Learner
					return
				}
			}
		}()
	}
	wg.Wait()
	return members, nil
}

// Add adds a member with peerURL, as a learner (a non-voting member that
// catches up before Promote makes it vote, so that adding it never costs
// the cluster its quorum, as adding a voter to a one-member cluster would
// until the new member runs), unless one with that peer URL exists (a
// retry after a crash). It returns the members afterwards and the one with
// peerURL.
func (c *Client) Add(ctx context.Context, peerURL string) (members []Member, added Member, err error) {
	members, err = c.List(ctx)
	if err != nil {
		return nil, Member{}, err
	}
	if i := slices.IndexFunc(members, func(m Member) bool { return slices.Contains(m.PeerURLs, peerURL) }); i >= 0 {
		return members, members[i], nil
	}
	resp, err := c.c.MemberAddAsLearner(ctx, []string{peerURL})
	if err != nil {
		return nil, Member{}, fmt.Errorf("adding etcd member %s: %w", peerURL, err)
	}
	members = members[:0]
	for _, m := range resp.Members {
		members = append(members, Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, Learner: m.IsLearner})
	}
	return members, Member{ID: resp.Member.ID, PeerURLs: resp.Member.PeerURLs, Learner: true}, nil
}

// Promote makes a learner a voting member. etcd refuses while the learner
// has not caught up with the leader: the caller retries. A member that
// votes already is not an error.
func (c *Client) Promote(ctx context.Context, id uint64) error {
	if _, err := c.c.MemberPromote(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrMemberNotLearner) {
		return fmt.Errorf("promoting etcd member %x: %w", id, err)
	}
	return nil
}

// Remove removes the member with id; nil when it is gone already.
func (c *Client) Remove(ctx context.Context, id uint64) error {
	if _, err := c.c.MemberRemove(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrMemberNotFound) {
		return fmt.Errorf("removing etcd member %x: %w", id, err)
	}
	return nil
}

// Count returns how many keys are stored under key (exactly): a check that
// a cluster's data is where it should be.
func (c *Client) Count(ctx context.Context, key string) (int64, error) {
	resp, err := c.c.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("reading etcd key %s: %w", key, err)
	}
	return resp.Count, nil
}

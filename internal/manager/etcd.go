package manager

import (
	"context"

	"marina.dev/marina/internal/controller/controlplane"
	"marina.dev/marina/internal/etcdadmin"
)

// etcdDialer reaches a cluster's etcd for the control plane.
func etcdDialer(ctx context.Context, endpoints []string, ca, cert, key []byte) (controlplane.Etcd, error) {
	c, err := etcdadmin.New(ctx, etcdadmin.Config{Endpoints: endpoints, CA: ca, Cert: cert, Key: key})
	if err != nil {
		return nil, err
	}
	return etcdClient{c}, nil
}

type etcdClient struct{ *etcdadmin.Client }

func (e etcdClient) Members(ctx context.Context) ([]controlplane.EtcdMember, error) {
	members, err := e.Client.Members(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]controlplane.EtcdMember, 0, len(members))
	for _, m := range members {
		out = append(out, controlplane.EtcdMember{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, Healthy: m.Healthy, Learner: m.Learner})
	}
	return out, nil
}

func (e etcdClient) RemoveMember(ctx context.Context, id uint64) error { return e.Remove(ctx, id) }

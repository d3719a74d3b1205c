package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/clusterpki"
)

// Bootstrap returns the document a control-plane machine runs from
// (provider.Bootstrap.ControlPlane): the cluster's facts and key material,
// and whether it starts etcd or joins the running members. The machine
// controller calls it before it asks the provider for the machine.
func (cp *ControlPlane) Bootstrap(ctx context.Context, m *clusterv1.Machine) ([]byte, error) {
	cluster := &clusterv1.Cluster{}
	if err := cp.Client.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.ClusterName}, cluster); err != nil {
		return nil, fmt.Errorf("reading cluster %s: %w", m.Spec.ClusterName, err)
	}
	if !Owns(cluster, m) {
		// The document holds the cluster's keys and joins etcd: only for
		// a machine the control plane made.
		return nil, reconcile.TerminalError(fmt.Errorf("machine %s is not a member of cluster %s's control plane: the Cluster is not its controller "+
			"(metadata.ownerReferences), so it gets no control-plane bootstrap; control-plane machines are made by the Cluster (spec.controlPlane.replicas)",
			m.Name, cluster.Name))
	}
	ep := cluster.Spec.ControlPlaneEndpoint
	if ep.Host == "" || ep.Port == 0 {
		return nil, errors.New("the cluster has no control-plane endpoint yet")
	}
	// The cluster controller made the key material before any machine:
	// load it, and never make a CA here that the cluster's other machines
	// would not trust.
	set, err := clusterpki.Load(ctx, cp.Client, cp.Live, cluster, time.Now())
	if err != nil {
		return nil, err
	}
	keys, err := bootstrap.PKIOf(set)
	if err != nil {
		return nil, err
	}
	cfg := &bootstrap.Config{
		ClusterName: cluster.Name,
		Endpoint:    net.JoinHostPort(ep.Host, strconv.Itoa(int(ep.Port))),
		Network:     cluster.Spec.ClusterNetwork,
		Version:     string(m.Spec.Versions.ControlPlane),
		Components:  cluster.Spec.ControlPlane.Components,
		PKI:         keys,
	}
	if v := cluster.Spec.ControlPlane.CertificateValidity; v != nil {
		cfg.CertValidity = v.Duration
	}
	if stacked(cluster) {
		join, err := cp.joinURLs(ctx, cluster, m)
		if err != nil {
			return nil, err
		}
		cfg.Etcd.Stacked = &bootstrap.ConfigStackedEtcd{Join: join}
	} else {
		a, err := externalAccess(ctx, cp.Live, cluster)
		if err != nil {
			return nil, err
		}
		cfg.Etcd.External = &bootstrap.ExternalEtcd{Endpoints: a.endpoints, CACert: a.ca, ClientCert: a.clientCert, ClientKey: a.clientKey}
		cfg.PKI.EtcdCACert, cfg.PKI.EtcdCAKey = nil, nil // the machine needs no etcd CA of ours
	}
	return bootstrap.EncodeConfig(cfg)
}

// joinURLs are the etcd client URLs a new member joins through: none for
// the machine that starts the cluster, the other made machines' otherwise.
func (cp *ControlPlane) joinURLs(ctx context.Context, cluster *clusterv1.Cluster, m *clusterv1.Machine) ([]string, error) {
	if m.Annotations[clusterv1.EtcdInitAnnotation] == "true" {
		return nil, nil
	}
	machines, err := cp.Machines(ctx, cluster)
	if err != nil {
		return nil, err
	}
	var running []clusterv1.Machine
	for _, other := range machines {
		if other.Name != m.Name && other.DeletionTimestamp.IsZero() {
			running = append(running, other)
		}
	}
	urls := clientURLs(running, "")
	if len(urls) == 0 {
		return nil, errors.New("no running control-plane machine to join yet")
	}
	return urls, nil
}

// Package index holds the management cache's field indexes that more than
// one controller reads. A manager refuses an index registered twice, and
// the machine and MachineSet controllers run in one manager (and apart, in
// their tests): Add registers each index once per manager.
package index

import (
	"context"
	"fmt"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// MachineCluster indexes Machines by spec.clusterName. It is also the
// Machine CRD's selectable field, so one field selector serves the cache
// and the API server alike.
const MachineCluster = "spec.clusterName"

// added remembers which indexer already has which index.
var added sync.Map // key → struct{}

type key struct {
	indexer client.FieldIndexer
	name    string
}

// AddMachineCluster registers MachineCluster with indexer, once.
func AddMachineCluster(ctx context.Context, indexer client.FieldIndexer) error {
	return add(ctx, indexer, &clusterv1.Machine{}, MachineCluster, func(o client.Object) []string {
		return []string{o.(*clusterv1.Machine).Spec.ClusterName}
	})
}

func add(ctx context.Context, indexer client.FieldIndexer, obj client.Object, name string, fn client.IndexerFunc) error {
	k := key{indexer, name}
	if _, done := added.Load(k); done {
		return nil
	}
	if err := indexer.IndexField(ctx, obj, name, fn); err != nil {
		return fmt.Errorf("indexing %T by %s: %w", obj, name, err)
	}
	added.Store(k, struct{}{})
	return nil
}

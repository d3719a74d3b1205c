// Package metrics holds marina's own Prometheus metrics, served with
// controller-runtime's on the manager's metrics endpoint (docs/metrics.md).
package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

var (
	// Remediations counts the machines health checks deleted for their
	// set to replace, by health check.
	Remediations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "marina_machinehealthcheck_remediations_total",
		Help: "Unhealthy machines a MachineHealthCheck deleted so that their MachineSet replaces them.",
	}, []string{"namespace", "name"})
	// ShortCircuits counts the times a health check stopped remediating
	// because more machines were unhealthy than maxUnhealthy allows.
	ShortCircuits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "marina_machinehealthcheck_short_circuits_total",
		Help: "Times a MachineHealthCheck stopped remediating: more machines unhealthy than spec.maxUnhealthy allows.",
	}, []string{"namespace", "name"})
	// OrphansRemoved counts the provider machines the safety controller
	// removed, by provider.
	OrphansRemoved = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "marina_orphan_machines_removed_total",
		Help: "Provider machines that no Machine owned, removed by the safety controller.",
	}, []string{"provider"})
	// OrphanEndpointsRemoved counts the control-plane endpoints the safety
	// controller removed because their Cluster was gone, by provider.
	OrphanEndpointsRemoved = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "marina_orphan_endpoints_removed_total",
		Help: "Control-plane endpoints (load balancers) whose Cluster was gone, removed by the safety controller.",
	}, []string{"provider"})
)

func init() {
	crmetrics.Registry.MustRegister(Remediations, ShortCircuits, OrphansRemoved, OrphanEndpointsRemoved)
}

// machinesDesc is marina_machines.
var machinesDesc = prometheus.NewDesc("marina_machines", "Machines, by namespace and phase.", []string{"namespace", "phase"}, nil)

// Machines counts the Machines by namespace and phase when scraped, from
// a reader (the manager's cache): nothing to keep current in between.
type Machines struct {
	Reader client.Reader
}

// Describe implements prometheus.Collector.
func (m *Machines) Describe(ch chan<- *prometheus.Desc) { ch <- machinesDesc }

// Collect implements prometheus.Collector.
func (m *Machines) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var list clusterv1.MachineList
	if err := m.Reader.List(ctx, &list); err != nil {
		ch <- prometheus.NewInvalidMetric(machinesDesc, err)
		return
	}
	type key struct{ ns, phase string }
	counts := map[key]int{}
	for _, machine := range list.Items {
		phase := string(machine.Status.Phase)
		if phase == "" {
			phase = "Unknown"
		}
		counts[key{machine.Namespace, phase}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(machinesDesc, prometheus.GaugeValue, float64(n), k.ns, k.phase)
	}
}

// RegisterMachines serves marina_machines from r, replacing a collector a
// manager made before in this process.
func RegisterMachines(r client.Reader) error {
	c := &Machines{Reader: r}
	err := crmetrics.Registry.Register(c)
	var already prometheus.AlreadyRegisteredError
	if errors.As(err, &already) {
		crmetrics.Registry.Unregister(already.ExistingCollector)
		err = crmetrics.Registry.Register(c)
	}
	return err
}

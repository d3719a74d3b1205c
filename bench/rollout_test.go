package bench

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

var (
	workers  = flag.Int("workers", 100, "number of local workers the rollout benchmark rolls")
	maxSurge = flag.String("max-surge", "10%", "maxSurge of the rollout benchmark")
)

// BenchmarkRollLocalWorkers rolls a MachineDeployment of N local workers
// (maxSurge 10%, maxUnavailable 0) to a new template through a `marina
// controller` process, and prints the time from the template change until
// every machine is built from the new template and available, and the
// management API writes and 409 conflicts per replaced machine (the new
// machine's create, its deletion, and every status and scale write in
// between, of all controllers).
func BenchmarkRollLocalWorkers(b *testing.B) {
	for i := 0; i < b.N; i++ {
		runRollout(b, int32(*workers))
	}
}

func runRollout(b *testing.B, n int32) {
	ctx := context.Background()
	w := startWorld(b)
	defer w.stop()
	surge, zero := intstr.Parse(*maxSurge), intstr.FromInt32(0)
	md := &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Name: "workers", Namespace: w.ns},
		Spec: clusterv1.MachineDeploymentSpec{
			ClusterName: "bench",
			Replicas:    &n,
			Selector:    metav1.LabelSelector{MatchLabels: map[string]string{"pool": "workers"}},
			Strategy: &clusterv1.MachineDeploymentStrategy{Type: clusterv1.RollingUpdateStrategy,
				RollingUpdate: &clusterv1.MachineRollingUpdate{MaxSurge: &surge, MaxUnavailable: &zero}},
			Template: clusterv1.MachineTemplateSpec{
				ObjectMeta: clusterv1.MachineTemplateMeta{Labels: map[string]string{"pool": "workers"}},
				Spec: clusterv1.MachineSpec{
					ClusterName:  "bench",
					Roles:        []clusterv1.MachineRole{clusterv1.WorkerRole},
					Versions:     clusterv1.MachineVersions{Kubelet: "v1.37.2"},
					Labels:       map[string]string{"tier": "v1"},
					ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","pods":110}}`)},
				},
			},
		},
	}
	must(b, w.mgmt.Client.Create(ctx, md))
	start := time.Now()
	waitRolled(b, w, md, n, start)
	provisioned := time.Since(start)

	cs := kubernetes.NewForConfigOrDie(w.mgmt.Config)
	settleWrites(b, cs)
	writesBefore, conflictsBefore := apiWritesAndConflicts(b, cs)
	kindsBefore := writesByKind(b, cs)
	must(b, w.mgmt.Client.Get(ctx, client.ObjectKeyFromObject(md), md))
	before := md.DeepCopy()
	md.Spec.Template.Spec.Labels["tier"] = "v2"
	start = time.Now()
	must(b, w.mgmt.Client.Patch(ctx, md, client.MergeFrom(before)))
	waitRolled(b, w, md, n, start)
	rolled := time.Since(start)
	settleWrites(b, cs)
	writesAfter, conflictsAfter := apiWritesAndConflicts(b, cs)
	writes, conflicts := writesAfter-writesBefore, conflictsAfter-conflictsBefore
	kinds := writesByKind(b, cs)
	var breakdown []string
	for k, v := range kinds {
		if d := v - kindsBefore[k]; d > 0 {
			breakdown = append(breakdown, fmt.Sprintf("%s %.0f", k, d))
		}
	}
	sort.Strings(breakdown)

	fmt.Printf("workers:                              %d (maxSurge %s, maxUnavailable 0)\n", n, surge.String())
	fmt.Printf("first %d Ready in:                    %s\n", n, provisioned.Round(time.Millisecond))
	fmt.Printf("rolled every worker in:               %s (%.2f machines/s)\n", rolled.Round(time.Millisecond), float64(n)/rolled.Seconds())
	fmt.Printf("management API writes:                %.0f total, %.2f per replaced machine\n", writes, writes/float64(n))
	fmt.Printf("of which 409 conflicts:               %.0f\n", conflicts)
	fmt.Printf("by kind:                              %s\n", strings.Join(breakdown, ", "))
	b.ReportMetric(rolled.Seconds(), "s/rollout")
	b.ReportMetric(writes/float64(n), "writes/replaced-machine")
	b.ReportMetric(conflicts, "conflicts")
}

// waitRolled polls until every one of the deployment's n machines is built
// from its current template and available, and its sets have no other.
func waitRolled(b *testing.B, w *world, md *clusterv1.MachineDeployment, n int32, start time.Time) {
	deadline := start.Add(time.Duration(n)*2*time.Second + 3*time.Minute)
	for {
		got := &clusterv1.MachineDeployment{}
		must(b, w.mgmt.Client.Get(context.Background(), client.ObjectKeyFromObject(md), got))
		st := got.Status
		if st.ObservedGeneration == got.Generation && st.Replicas == n && st.UpdatedReplicas == n && st.AvailableReplicas == n &&
			meta.IsStatusConditionFalse(st.Conditions, clusterv1.RollingOutCondition) {
			return
		}
		if time.Now().After(deadline) {
			c := meta.FindStatusCondition(st.Conditions, clusterv1.ReadyCondition)
			b.Fatalf("not rolled after %s: status %+v, Ready %v; controller log: %s", time.Since(start), st, c, w.logFile.Name())
		}
		time.Sleep(250 * time.Millisecond) // a poll interval, not a wait for a result
	}
}

// settleWrites waits until the management API's write count stops moving,
// so the last status writes land in the measurement they belong to.
func settleWrites(b *testing.B, cs kubernetes.Interface) {
	last := apiWrites(b, cs)
	for i := 0; i < 20; i++ {
		time.Sleep(250 * time.Millisecond) // a poll interval
		now := apiWrites(b, cs)
		if now == last {
			return
		}
		last = now
	}
}

// writesByKind breaks the management API's writes down by verb, resource
// and subresource ("PATCH machines/status"), to see where a cost comes from.
func writesByKind(b *testing.B, cs kubernetes.Interface) map[string]float64 {
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	must(b, err)
	out := map[string]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		label := func(k string) string {
			_, rest, ok := strings.Cut(line, k+`="`)
			if !ok {
				return ""
			}
			v, _, _ := strings.Cut(rest, `"`)
			return v
		}
		verb := label("verb")
		if verb != "POST" && verb != "PUT" && verb != "PATCH" && verb != "DELETE" {
			continue
		}
		key := verb + " " + label("resource")
		if sub := label("subresource"); sub != "" {
			key += "/" + sub
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		must(b, err)
		out[key] += v
	}
	return out
}

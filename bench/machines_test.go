package bench

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider/local"
)

var machines = flag.Int("machines", 200, "number of local worker machines to provision")

// BenchmarkProvisionLocalMachines provisions N local worker machines through
// a `marina controller` process and prints: the time until all are Running
// with Ready Nodes (and the median per machine), the management API writes
// per machine as the API server itself counts them (apiserver_request_total,
// POST/PUT/PATCH/DELETE, failed ones included), and the controller's peak RSS.
func BenchmarkProvisionLocalMachines(b *testing.B) {
	for i := 0; i < b.N; i++ {
		runProvision(b, *machines)
	}
}

func runProvision(b *testing.B, n int) {
	ctx := context.Background()
	w := startWorld(b)
	defer w.stop()
	mgmt, ns, ctl, logFile := w.mgmt, w.ns, w.ctl, w.logFile

	cs := kubernetes.NewForConfigOrDie(mgmt.Config)
	writesBefore, conflictsBefore := apiWritesAndConflicts(b, cs)
	start := time.Now()
	for i := 0; i < n; i++ {
		must(b, mgmt.Client.Create(ctx, &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("w%04d", i), Namespace: ns},
			Spec: clusterv1.MachineSpec{
				ClusterName:  "bench",
				Roles:        []clusterv1.MachineRole{clusterv1.WorkerRole},
				Versions:     clusterv1.MachineVersions{Kubelet: "v1.37.2"},
				ProviderSpec: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","pods":110}}`)},
			},
		}))
	}
	created := time.Since(start)

	readyAt := waitRunning(b, machineCache(b, mgmt), n, start, time.Duration(n)*2*time.Second+2*time.Minute, logFile.Name(), client.InNamespace(ns))
	all := time.Since(start)
	settleWrites(b, cs)
	writesAfter, conflictsAfter := apiWritesAndConflicts(b, cs)
	writes, conflicts := writesAfter-writesBefore, conflictsAfter-conflictsBefore
	peakRSS := vmHWM(b, ctl.Process.Pid)

	durations := make([]time.Duration, 0, n)
	for _, d := range readyAt {
		durations = append(durations, d)
	}
	sort.Slice(durations, func(i, j int) bool { return durations[i] < durations[j] })
	median := durations[len(durations)/2]

	fmt.Printf("machines:                         %d\n", n)
	fmt.Printf("created all Machine objects in:   %s\n", created.Round(time.Millisecond))
	fmt.Printf("all Running with Ready nodes in:  %s (%.2f machines/s)\n", all.Round(time.Millisecond), float64(n)/all.Seconds())
	fmt.Printf("median time to Running+Ready:     %s\n", median.Round(time.Millisecond))
	fmt.Printf("management API writes:            %.0f total, %.2f per machine (incl. the Machine's own create)\n", writes, writes/float64(n))
	fmt.Printf("of which 409 conflicts:           %.0f\n", conflicts)
	fmt.Printf("controller peak RSS:              %.1f MiB\n", float64(peakRSS)/1024)
	b.ReportMetric(all.Seconds(), "s/all-ready")
	b.ReportMetric(median.Seconds(), "s/median-ready")
	b.ReportMetric(writes/float64(n), "writes/machine")
	b.ReportMetric(float64(peakRSS)/1024, "MiB-peak-rss")
}

// waitRunning waits until want Machines are Running with their Node Ready,
// and returns when each got there, from start, by name. A list the loaded
// API server times out is tried again; timeout bounds the whole wait.
func waitRunning(b *testing.B, c client.Reader, want int, start time.Time, timeout time.Duration, log string, opts ...client.ListOption) map[string]time.Duration {
	readyAt := map[string]time.Duration{}
	deadline := start.Add(timeout)
	for len(readyAt) < want {
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d machines Running with a Ready Node after %s; controller log: %s", len(readyAt), want, time.Since(start), log)
		}
		var list clusterv1.MachineList
		if err := c.List(context.Background(), &list, opts...); err != nil {
			fmt.Printf("listing machines: %v\n", err)
		}
		for i := range list.Items {
			m := &list.Items[i]
			if _, seen := readyAt[m.Name]; seen {
				continue
			}
			if m.Status.Phase == clusterv1.MachinePhaseRunning && meta.IsStatusConditionTrue(m.Status.Conditions, clusterv1.MachineNodeReadyCondition) {
				readyAt[m.Name] = time.Since(start)
			}
		}
		time.Sleep(250 * time.Millisecond) // a poll interval, not a wait for a result
	}
	return readyAt
}

// apiWrites sums apiserver_request_total over write verbs, whatever the
// resource or response code.
func apiWrites(b *testing.B, cs kubernetes.Interface) float64 {
	w, _ := apiWritesAndConflicts(b, cs)
	return w
}

// apiWritesAndConflicts also counts the writes refused with 409 Conflict.
func apiWritesAndConflicts(b *testing.B, cs kubernetes.Interface) (writes, conflicts float64) {
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	must(b, err)
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		write := false
		for _, v := range []string{`verb="POST"`, `verb="PUT"`, `verb="PATCH"`, `verb="DELETE"`} {
			if strings.Contains(line, v) {
				write = true
			}
		}
		if !write {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		must(b, err)
		writes += v
		if strings.Contains(line, `code="409"`) {
			conflicts += v
		}
	}
	return writes, conflicts
}

// vmHWM is a process's peak resident set size in KiB.
func vmHWM(b *testing.B, pid int) int {
	kb := statusKB(pid, "VmHWM:")
	if kb == 0 {
		b.Fatalf("no VmHWM in /proc/%d/status", pid)
	}
	return kb
}

// cleanupSandboxes stops every agent the run started.
func cleanupSandboxes(b *testing.B, marina, root string) {
	p, err := local.New(local.Options{Root: root, AgentCommand: []string{marina, "node-agent"}, LoadBalancerCommand: []string{marina, "load-balancer"}})
	if err != nil {
		b.Error(err)
		return
	}
	if err := p.DeleteAll(context.Background()); err != nil {
		b.Error(err)
	}
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// machineCache is an informer cache of env's Machines, synced: the
// benchmarks poll it, not the API server, whose lists of a thousand
// machines four times a second would be a load of their own.
func machineCache(b *testing.B, env *testenv.Env) client.Reader {
	ctrl.SetLogger(logr.Discard()) // the cache's watch would complain of no logger
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, ByObject: map[client.Object]cache.ByObject{&clusterv1.Machine{}: {}}})
	must(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	if _, err := c.GetInformer(ctx, &clusterv1.Machine{}); err != nil {
		b.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		b.Fatal("the machine cache did not sync")
	}
	return c
}

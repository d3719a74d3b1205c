package bench

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
)

var (
	fleetClusters = flag.Int("clusters", 10, "clusters BenchmarkFleet makes")
	fleetProgress = flag.Duration("progress", 15*time.Second, "how often BenchmarkFleet prints the machines by phase and the cores each kind of process used")
	fleetKeepLog  = flag.String("keep-log", "", "where BenchmarkFleet copies marina's log before removing its directory")
	fleetAgent    = flag.String("agent", "Pooled", "how BenchmarkFleet's workers run: Pooled (one process per cluster) or Process (one per worker)")
)

// BenchmarkFleet (issue: scale) makes -clusters clusters of -control-planes
// real control-plane machines (etcd, kube-apiserver, kube-controller-manager
// and kube-scheduler processes each) and a MachineDeployment of -workers
// workers each, through a `marina controller` process on a management
// plane of its own, and prints: the time from the first apply until every
// Machine is Running with its Node Ready in its own cluster (and the
// median machine), the management API's writes per machine and its 409s,
// marina's peak RSS and CPU, and the summed peak RSS and CPU of the agent
// processes, the control-plane processes and the endpoints.
//
//	go test -run '^$' -bench BenchmarkFleet -benchtime 1x -timeout 60m ./bench/ -args -clusters=10 -control-planes=1 -workers=100
func BenchmarkFleet(b *testing.B) {
	for i := 0; i < b.N; i++ {
		runFleet(b, *fleetClusters, *controlPlanes, *workers)
	}
}

func runFleet(b *testing.B, clusters, cps, workersEach int) {
	ctx := context.Background()
	tmp := b.TempDir()
	marina, err := testenv.BuildMarina(tmp)
	must(b, err)
	binDir, err := testenv.BinDir()
	must(b, err)
	mgmt, err := testenv.Start()
	must(b, err)
	defer mgmt.Stop()
	root := filepath.Join(tmp, "machines")
	kubeconfig := filepath.Join(tmp, "mgmt.kubeconfig")
	must(b, os.WriteFile(kubeconfig, mgmt.Kubeconfig, 0o600))
	pprof := freeLoopbackAddress(b)
	fmt.Printf("marina's profiles: http://%s/debug/pprof/\n", pprof)
	ctl := exec.Command(marina, "controller", "--kubeconfig", kubeconfig, "--leader-elect=false",
		"--local-provider-dir", root, "--bin-dir", binDir, "--metrics-bind-address=0", "--health-probe-bind-address=0", "--webhook-port=0",
		"--pprof-bind-address", pprof)
	logFile, err := os.Create(filepath.Join(tmp, "controller.log"))
	must(b, err)
	defer logFile.Close()
	ctl.Stdout, ctl.Stderr = logFile, logFile
	ctl.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	must(b, ctl.Start())
	defer func() {
		// The controller first: running, it would make the endpoints
		// cleanupSandboxes removes again.
		_ = ctl.Process.Signal(syscall.SIGTERM)
		_ = ctl.Wait()
		if *fleetKeepLog != "" {
			if data, err := os.ReadFile(logFile.Name()); err == nil {
				_ = os.WriteFile(*fleetKeepLog, data, 0o600)
			}
		}
		cleanupSandboxes(b, marina, root)
	}()

	cs := kubernetes.NewForConfigOrDie(mgmt.Config)
	writesBefore, conflictsBefore := apiWritesAndConflicts(b, cs)
	byResourceBefore := writesByKind(b, cs)
	fields := watchMachineFields(b, mgmt.Config)
	machines := machineCache(b, mgmt)
	start := time.Now()
	progressCtx, stopProgress := context.WithCancel(ctx)
	defer stopProgress()
	go progress(progressCtx, machines, root, ctl.Process.Pid, start, *fleetProgress)
	for c := range clusters {
		name := fmt.Sprintf("fleet-%02d", c)
		must(b, mgmt.Client.Create(ctx, benchCluster(name, cps)))
		md := benchWorkers(name, workersEach)
		md.Spec.Template.Spec.ProviderSpec = &runtime.RawExtension{Raw: fmt.Appendf(nil,
			`{"apiVersion":"local.marina.dev/v1alpha1","kind":"LocalMachine","spec":{"cpu":2,"memory":"4Gi","agent":%q}}`, *fleetAgent)}
		must(b, mgmt.Client.Create(ctx, md))
	}
	total := clusters * (cps + workersEach)

	readyAt := waitRunning(b, machines, total, start, 30*time.Minute, logFile.Name())
	all := time.Since(start)
	stopProgress()
	testenv.Eventually(b, 2*time.Minute, "every cluster Ready", func() error {
		var list clusterv1.ClusterList
		if err := mgmt.Client.List(ctx, &list); err != nil {
			return err
		}
		for _, cl := range list.Items {
			if !meta.IsStatusConditionTrue(cl.Status.Conditions, clusterv1.ReadyCondition) {
				return fmt.Errorf("cluster %s not Ready", cl.Name)
			}
		}
		return nil
	})
	settleWrites(b, cs)
	writesAfter, conflictsAfter := apiWritesAndConflicts(b, cs)
	writes, conflicts := writesAfter-writesBefore, conflictsAfter-conflictsBefore
	byResource := writesByKind(b, cs)
	for k, v := range byResourceBefore {
		byResource[k] -= v
	}
	changes, byField := fields.stop()
	machineWrites := byResource["PATCH machines/status"] + byResource["PATCH machines"] + byResource["PUT machines/status"] + byResource["PUT machines"]

	durations := make([]time.Duration, 0, len(readyAt))
	for _, d := range readyAt {
		durations = append(durations, d)
	}
	sort.Slice(durations, func(i, j int) bool { return durations[i] < durations[j] })
	groups := processGroups(root)
	marinaRSS := float64(vmHWM(b, ctl.Process.Pid)) / 1024
	marinaCPU := cpuSeconds(ctl.Process.Pid)

	fmt.Printf("shape:                            %d × (%d control plane + %d workers) = %d machines, workers %s\n", clusters, cps, workersEach, total, *fleetAgent)
	fmt.Printf("all Running with Ready Nodes in:  %s (%.1f machines/s)\n", all.Round(time.Millisecond), float64(total)/all.Seconds())
	fmt.Printf("median machine:                   %s\n", durations[len(durations)/2].Round(time.Millisecond))
	fmt.Printf("management API writes:            %.0f, %.2f per machine; 409 conflicts: %.0f\n", writes, writes/float64(total), conflicts)
	fmt.Printf("  by resource and verb:           %s\n", largestFirst(byResource, "%.0f", 1))
	fmt.Printf("machine updates a watch saw:      %d of %.0f machine patches and puts (%.0f changed nothing)\n", changes, machineWrites, machineWrites-float64(changes))
	fmt.Printf("  the fields they changed:        %s\n", largestFirst(byField, "%.0f", 1))
	fmt.Printf("marina controller:                peak RSS %.0f MiB, CPU %.1f s\n", marinaRSS, marinaCPU)
	for _, g := range []string{"agents", "control planes", "endpoints"} {
		fmt.Printf("%-34s%d processes, summed peak RSS %.0f MiB, CPU %.1f s\n", g+":", groups[g].n, groups[g].peakMiB, groups[g].cpu)
	}
	b.ReportMetric(all.Seconds(), "s/all-ready")
	b.ReportMetric(writes/float64(total), "writes/machine")
	b.ReportMetric(marinaRSS, "MiB-marina-peak")
	b.ReportMetric(groups["agents"].peakMiB, "MiB-agents-peak")
}

type processGroup struct {
	n            int
	peakMiB, cpu float64
}

// processGroups sums, over the live processes under root, the peak RSS and
// CPU time of the node agents (pools and single agents), the control-plane
// components and the endpoints' balancers.
func processGroups(root string) map[string]processGroup {
	out := map[string]processGroup{}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(data, []byte(root)) {
			continue
		}
		var group string
		switch {
		case bytes.Contains(data, []byte("node-agent")):
			group = "agents"
		case bytes.Contains(data, []byte("load-balancer")):
			group = "endpoints"
		default:
			group = "control planes"
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		g := out[group]
		g.n++
		g.peakMiB += float64(statusKB(pid, "VmHWM:")) / 1024
		g.cpu += cpuSeconds(pid)
		out[group] = g
	}
	return out
}

// statusKB reads a "kB" field of /proc/<pid>/status; 0 when gone.
func statusKB(pid int, field string) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			return kb
		}
	}
	return 0
}

// statFields are the fields of /proc/<pid>/stat after the command (in
// parentheses, which may hold spaces): the state is the first; nil when
// the process is gone.
func statFields(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(data)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
}

// cpuSeconds is a process's user and system CPU time; 0 when gone.
func cpuSeconds(pid int) float64 {
	fields := statFields(pid)
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100 // clock ticks (USER_HZ)
}

// largestFirst prints counts, largest first, each in format, leaving out
// those below least.
func largestFirst(counts map[string]float64, format string, least float64) string {
	keys := make([]string, 0, len(counts))
	for k, v := range counts {
		if v >= least {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return counts[keys[i]] > counts[keys[j]] })
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s "+format, k, counts[k]))
	}
	return strings.Join(parts, ", ")
}

// freeLoopbackAddress is a 127.0.0.1 port nothing listens on now.
func freeLoopbackAddress(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(b, err)
	defer l.Close()
	return l.Addr().String()
}

package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "marina.dev/marina/api/v1alpha1"
)

// progress prints, every period until ctx ends, the machines by phase and
// the cores each kind of process used over the period: where a fleet's
// time goes, as it goes. The management plane is the benchmark's own
// children; marina is ctlPID; the rest are the processes under root, by
// program (etcd, kube-apiserver, …, node-agent, load-balancer).
func progress(ctx context.Context, c client.Reader, root string, ctlPID int, start time.Time, period time.Duration) {
	last := cpuByProgram(root, ctlPID)
	lastAt := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(period):
		}
		phases := map[string]int{}
		var list clusterv1.MachineList
		if err := c.List(ctx, &list); err == nil {
			for _, m := range list.Items {
				phase := string(m.Status.Phase)
				if phase == "" {
					phase = "(no status yet)"
				}
				phases[phase]++
			}
		}
		now, nowAt := cpuByProgram(root, ctlPID), time.Now()
		cores := map[string]float64{}
		for k, v := range now {
			if d := v - last[k]; d > 0 {
				cores[k] = d / nowAt.Sub(lastAt).Seconds()
			}
		}
		last, lastAt = now, nowAt
		fmt.Printf("%6.0fs machines %v; cores %s\n", time.Since(start).Seconds(), sortedCounts(phases), largestFirst(cores, "%.2f", 0.005))
	}
}

// cpuByProgram sums the CPU seconds of live processes by what they are.
func cpuByProgram(root string, ctlPID int) map[string]float64 {
	out := map[string]float64{}
	self := os.Getpid()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var group string
		switch {
		case pid == ctlPID:
			group = "marina"
		case parentPID(pid) == self:
			group = "mgmt " + program(data)
		case bytes.Contains(data, []byte(root)):
			group = program(data)
		default:
			continue
		}
		out[group] += cpuSeconds(pid)
	}
	return out
}

// program is the base name of a command line's first argument, or its
// subcommand for marina (node-agent, load-balancer).
func program(cmdline []byte) string {
	args := strings.Split(string(cmdline), "\x00")
	for _, a := range args[1:] {
		if a == "node-agent" || a == "load-balancer" {
			return a
		}
	}
	return filepath.Base(args[0])
}

func parentPID(pid int) int {
	fields := statFields(pid)
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

func sortedCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/testenv"
)

// longName is a cluster name of 63 characters, the most a Cluster may have.
var longName = strings.Repeat("long", 15) + "ccc"

// --dry-run prints what create would make, as a user would write it: no
// namespace unless -n names one (kubectl apply puts it in its context's).
func TestCreateClusterDryRun(t *testing.T) {
	isolate(t)
	for _, tc := range []struct {
		golden string
		args   []string
	}{
		{"create-cluster-dev.yaml", []string{"dev"}},
		{"create-cluster-ha.json", []string{"ha", "-n", "team", "--control-planes", "3", "--workers", "3", "--version", "v1.36.3", "--class", "ha-standard", "-o", "json"}},
		{"create-cluster-long.yaml", []string{longName, "--workers", "1"}},
		{"create-cluster-noworkers.yaml", []string{"solo", "--workers", "0"}},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			out, _, err := marina(t, append([]string{"create", "cluster", "--dry-run"}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, tc.golden, out)
		})
	}
	if _, _, err := marina(t, "create", "cluster", "dev", "--dry-run", "-o", "table"); err == nil || !strings.Contains(err.Error(), "yaml or json") {
		t.Errorf("-o table: got %v, want an error naming yaml and json", err)
	}
}

// The workers' deployment name is also its pool label's value and the
// prefix of its machines' names (<deployment>-<hash>-<5>): each stays
// within its limit for every cluster name a Cluster may have, and two long
// names that share a prefix still get two deployments.
func TestWorkersNameFitsItsLimits(t *testing.T) {
	seen := map[string]string{}
	for n := 1; n <= validation.DNS1123LabelMaxLength; n++ {
		for _, cluster := range []string{strings.Repeat("a", n), strings.Repeat("a", n-1) + "b", strings.Repeat("a-", n)[:n-1] + "z"} {
			name := workersName(cluster)
			machine := name + "-4294967295-abcde" // the longest template hash
			if errs := validation.IsDNS1123Label(machine); len(errs) > 0 {
				t.Errorf("cluster %s (%d): its machines' names, like %s, are no DNS label: %v", cluster, len(cluster), machine, errs)
			}
			if errs := validation.IsValidLabelValue(name); len(errs) > 0 {
				t.Errorf("cluster %s: pool label %s: %v", cluster, name, errs)
			}
			if other, ok := seen[name]; ok && other != cluster {
				t.Errorf("clusters %s and %s both get workers %s", other, cluster, name)
			}
			seen[name] = cluster
		}
	}
	if got := workersName("dev"); got != "dev-workers" {
		t.Errorf("workersName(dev) = %s, want dev-workers", got)
	}
}

// A cluster of the longest name a Cluster may have is created with its
// workers: the deployment's derived name and label fit.
func TestCreateClusterWithTheLongestName(t *testing.T) {
	env := managementPlane(t)
	isolate(t)
	ns := env.Namespace(t)
	path := writeKubeconfig(t, envKubeconfig(t, env, ns))
	out, _, err := marina(t, "create", "cluster", longName, "--kubeconfig", path, "-n", ns)
	if err != nil {
		t.Fatalf("marina create cluster with a %d-character name: %v\n%s", len(longName), err, out)
	}
	md := &clusterv1.MachineDeployment{}
	if err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: workersName(longName)}, md); err != nil {
		t.Fatalf("the workers' deployment: %v\n%s", err, out)
	}
	if !strings.Contains(out, "created MachineDeployment/"+md.Name) {
		t.Errorf("the output does not name the deployment %s:\n%s", md.Name, out)
	}
}

// Every object is checked by the API server (a server-side dry run)
// before any is created: an object that exists already, or that the
// server refuses, leaves nothing behind, and a rerun says so at once.
func TestCreateClusterChecksEveryObjectFirst(t *testing.T) {
	env := managementPlane(t)
	isolate(t)
	ns := env.Namespace(t)
	path := writeKubeconfig(t, envKubeconfig(t, env, ns))
	ctx := context.Background()

	// A MachineDeployment called dev-workers exists, without its cluster.
	md := clusterManifests("dev", ns, createOptions{controlPlanes: 1, workers: 1, version: "v1.37.2"})[1]
	if err := env.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	out, _, err := marina(t, "create", "cluster", "dev", "--kubeconfig", path, "-n", ns)
	if err == nil || !strings.Contains(err.Error(), "MachineDeployment "+ns+"/dev-workers exists already; nothing was created") {
		t.Errorf("create with dev-workers taken: got %v, want the deployment named and nothing created\n%s", err, out)
	}
	if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "dev"}, &clusterv1.Cluster{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Cluster was created although its deployment could not be (get: %v)", err)
	}

	// Refused by the webhook: a class that does not exist.
	_, _, err = marina(t, "create", "cluster", "other", "--class", "no-such-class", "--kubeconfig", path, "-n", ns)
	if err == nil || !strings.Contains(err.Error(), "nothing was created") || !strings.Contains(err.Error(), "no-such-class") {
		t.Errorf("create with a missing class: got %v, want the webhook's refusal and nothing created", err)
	}

	// A rerun of a create that worked.
	if out, _, err := marina(t, "create", "cluster", "again", "--kubeconfig", path, "-n", ns); err != nil {
		t.Fatalf("create cluster again: %v\n%s", err, out)
	}
	_, _, err = marina(t, "create", "cluster", "again", "--kubeconfig", path, "-n", ns)
	if err == nil || !strings.Contains(err.Error(), "Cluster "+ns+"/again exists already; nothing was created") {
		t.Errorf("rerun: got %v, want the cluster named as existing", err)
	}
}

// --wait ends at once when the cluster it follows is deleted, instead of
// waiting for its timeout.
func TestCreateWaitEndsWhenTheClusterIsDeleted(t *testing.T) {
	env := managementPlane(t)
	isolate(t)
	ns := env.Namespace(t)
	path := writeKubeconfig(t, envKubeconfig(t, env, ns))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, _, err := marinaCtx(ctx, "create", "cluster", "gone", "--workers", "0", "--wait", "--timeout", "10m", "--kubeconfig", path, "-n", ns)
		done <- result{out, err}
	}()
	key := types.NamespacedName{Namespace: ns, Name: "gone"}
	// No controller runs: the Cluster has no finalizer and goes at once.
	testenv.Eventually(t, 30*time.Second, "marina create cluster created the cluster, and it is deleted", func() error {
		cluster := &clusterv1.Cluster{}
		if err := env.Client.Get(ctx, key, cluster); err != nil {
			return err
		}
		return env.Client.Delete(ctx, cluster)
	})
	deleted := time.Now()
	select {
	case r := <-done:
		if r.err == nil || !strings.Contains(r.err.Error(), "not found") {
			t.Errorf("create --wait after the cluster was deleted: got %v, want not found\n%s", r.err, r.out)
		}
		if waited := time.Since(deleted); waited > 5*time.Second {
			t.Errorf("create --wait took %s to notice", waited)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("create --wait still waits 20s after its cluster was deleted")
	}
}

// --dry-run -o json prints one JSON document, as kubectl create
// --dry-run=client -o json does: a List of several objects, or the one
// object alone.
func TestCreateClusterDryRunJSONIsOneDocument(t *testing.T) {
	isolate(t)
	for _, tc := range []struct {
		args  []string
		kinds []string
	}{
		{[]string{"dev"}, []string{"Cluster", "MachineDeployment"}},
		{[]string{"solo", "--workers", "0"}, []string{"Cluster"}},
	} {
		out, _, err := marina(t, append([]string{"create", "cluster", "--dry-run", "-o", "json"}, tc.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Items      []struct {
				Kind string `json:"kind"`
			} `json:"items"`
		}
		dec := json.NewDecoder(strings.NewReader(out))
		if err := dec.Decode(&doc); err != nil {
			t.Fatalf("%v: -o json is no JSON document: %v\n%s", tc.args, err, out)
		}
		if dec.More() {
			t.Fatalf("%v: -o json prints more than one JSON document:\n%s", tc.args, out)
		}
		var kinds []string
		if len(tc.kinds) == 1 {
			kinds = []string{doc.Kind}
		} else {
			if doc.APIVersion != "v1" || doc.Kind != "List" {
				t.Errorf("%v: got %s %s, want a v1 List", tc.args, doc.APIVersion, doc.Kind)
			}
			for _, item := range doc.Items {
				kinds = append(kinds, item.Kind)
			}
		}
		if !slices.Equal(kinds, tc.kinds) {
			t.Errorf("%v: got %v, want %v", tc.args, kinds, tc.kinds)
		}
	}
}

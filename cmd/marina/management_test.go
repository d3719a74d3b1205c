package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"marina.dev/marina/internal/flock"
	"marina.dev/marina/internal/plane"
	"marina.dev/marina/internal/testenv"
)

// createCluster creates a Cluster as marina create cluster would, without
// workers.
func createCluster(t *testing.T, env *testenv.Env, namespace, name string) {
	t.Helper()
	cluster := clusterManifests(name, namespace, createOptions{controlPlanes: 1, version: "v1.37.2"})[0]
	if err := env.Client.Create(context.Background(), cluster); err != nil {
		t.Fatalf("creating cluster %s/%s: %v", namespace, name, err)
	}
}

// KUBECONFIG is a list of files, merged as kubectl merges them, and the
// namespace defaults to the current context's.
func TestKubeconfigListAndContextNamespace(t *testing.T) {
	env := managementPlane(t)
	isolate(t)
	ns := env.Namespace(t)
	createCluster(t, env, ns, "dev")
	cluster, user := adminKubeconfig(t, env)
	clusters := writeKubeconfig(t, &clientcmdapi.Config{
		Clusters:  map[string]*clientcmdapi.Cluster{"mgmt": cluster},
		AuthInfos: map[string]*clientcmdapi.AuthInfo{"admin": user},
	})
	contexts := writeKubeconfig(t, &clientcmdapi.Config{
		Contexts:       map[string]*clientcmdapi.Context{"team": {Cluster: "mgmt", AuthInfo: "admin", Namespace: ns}},
		CurrentContext: "team",
	})
	t.Setenv("KUBECONFIG", clusters+string(os.PathListSeparator)+contexts)

	out, _, err := marina(t, "describe", "cluster", "dev", "-o", "json")
	if err != nil {
		t.Fatalf("marina describe cluster with KUBECONFIG=a:b and the cluster in the context's namespace: %v", err)
	}
	if !strings.Contains(out, `"name": "dev"`) {
		t.Errorf("describe does not show cluster dev:\n%s", out)
	}
	// -n beats the context's namespace.
	_, _, err = marina(t, "describe", "cluster", "dev", "-n", "elsewhere")
	if err == nil || !strings.Contains(err.Error(), "elsewhere/dev") || !strings.Contains(err.Error(), "not found") {
		t.Errorf("describe -n elsewhere: got %v, want cluster elsewhere/dev not found", err)
	}
}

// --context, --cluster and --user pick from the kubeconfig as kubectl's do.
func TestContextClusterAndUserFlags(t *testing.T) {
	env := managementPlane(t)
	isolate(t)
	ns := env.Namespace(t)
	createCluster(t, env, ns, "dev")
	cluster, user := adminKubeconfig(t, env)
	path := writeKubeconfig(t, &clientcmdapi.Config{
		Clusters:  map[string]*clientcmdapi.Cluster{"real": cluster, "dead": {Server: deadServer, InsecureSkipTLSVerify: true}},
		AuthInfos: map[string]*clientcmdapi.AuthInfo{"admin": user, "nobody": {Token: "not-a-token"}},
		Contexts: map[string]*clientcmdapi.Context{
			"broken": {Cluster: "dead", AuthInfo: "nobody"},
			"good":   {Cluster: "real", AuthInfo: "admin", Namespace: ns},
		},
		CurrentContext: "broken",
	})
	for _, tc := range []struct {
		name    string
		flags   []string
		wantErr string // empty: cluster dev is described
	}{
		{"current context", nil, "127.0.0.1:1"},
		{"--context", []string{"--context", "good"}, ""},
		{"--cluster and --user", []string{"--cluster", "real", "--user", "admin", "-n", ns}, ""},
		{"--cluster alone keeps the context's user", []string{"--cluster", "real", "-n", ns}, "provide credentials"}, // 401 Unauthorized
		{"--user alone keeps the context's cluster", []string{"--context", "good", "--user", "nobody"}, "provide credentials"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"describe", "cluster", "dev", "-o", "json", "--kubeconfig", path}, tc.flags...)
			out, _, err := marina(t, args...)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("marina %s: %v", strings.Join(args, " "), err)
			case tc.wantErr == "" && !strings.Contains(out, `"name": "dev"`):
				t.Errorf("marina %s does not show cluster dev:\n%s", strings.Join(args, " "), out)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("marina %s: got error %v, want one containing %q", strings.Join(args, " "), err, tc.wantErr)
			}
		})
	}
}

// Without --kubeconfig and $KUBECONFIG, every verb uses marina up's
// kubeconfig while marina up runs, else ~/.kube/config.
func TestDefaultKubeconfigIsMarinaUpsWhileItRuns(t *testing.T) {
	env := managementPlane(t)
	state := isolate(t)
	ns := env.Namespace(t)
	createCluster(t, env, ns, "dev")
	cluster, user := adminKubeconfig(t, env)
	up := &clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"marina": cluster},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"admin": user},
		Contexts:       map[string]*clientcmdapi.Context{"marina": {Cluster: "marina", AuthInfo: "admin", Namespace: ns}},
		CurrentContext: "marina",
	}
	if err := clientcmd.WriteToFile(*up, plane.AdminKubeconfig(state)); err != nil {
		t.Fatal(err)
	}
	dead := deadKubeconfig()
	if err := os.MkdirAll(filepath.Dir(clientcmd.RecommendedHomeFile), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := clientcmd.WriteToFile(*dead, clientcmd.RecommendedHomeFile); err != nil {
		t.Fatal(err)
	}

	if _, _, err := marina(t, "describe", "cluster", "dev"); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("with marina up stopped: got %v, want ~/.kube/config's server 127.0.0.1:1", err)
	}

	lock, err := flock.Lock(filepath.Join(state, "lock"), 0) // as marina up holds it
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if out, _, err := marina(t, "describe", "cluster", "dev", "-o", "json"); err != nil || !strings.Contains(out, `"name": "dev"`) {
		t.Errorf("with marina up running: got %v, want cluster dev from marina up's plane\n%s", err, out)
	}

	t.Setenv("KUBECONFIG", writeKubeconfig(t, dead))
	if _, _, err := marina(t, "describe", "cluster", "dev"); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("with $KUBECONFIG set: got %v, want $KUBECONFIG's server 127.0.0.1:1", err)
	}
	if _, _, err := marina(t, "describe", "cluster", "dev", "--kubeconfig", plane.AdminKubeconfig(state)); err != nil {
		t.Errorf("--kubeconfig beats $KUBECONFIG: %v", err)
	}
}

// marina init installs where every other verb acts: marina up's plane
// while it runs, not ~/.kube/config's.
func TestInitUsesTheCommonDefault(t *testing.T) {
	state := isolate(t)
	if err := clientcmd.WriteToFile(*deadKubeconfig(), plane.AdminKubeconfig(state)); err != nil {
		t.Fatal(err)
	}
	lock, err := flock.Lock(filepath.Join(state, "lock"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	out, _, err := marina(t, "init", "--timeout", "1s")
	if err == nil {
		t.Fatal("marina init against a server that does not answer succeeded")
	}
	if !strings.Contains(out, "installing marina into "+deadServer) {
		t.Errorf("marina init did not use marina up's kubeconfig (%v):\n%s", err, out)
	}
	// And takes the same flags.
	for _, flag := range []string{"kubeconfig", "context", "cluster", "user"} {
		if newInitCommand().Flags().Lookup(flag) == nil {
			t.Errorf("marina init has no --%s", flag)
		}
	}
}

// marina --help says where the commands find the management plane.
func TestHelpStatesTheDefaultKubeconfig(t *testing.T) {
	out, _, err := marina(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"$KUBECONFIG", "marina up while one runs", "~/.kube/config", "--context, --cluster and --user", "context's"} {
		if !strings.Contains(out, want) {
			t.Errorf("marina --help does not say %q:\n%s", want, out)
		}
	}
}

func deadKubeconfig() *clientcmdapi.Config {
	return &clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"dead": {Server: deadServer, InsecureSkipTLSVerify: true}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"nobody": {Token: "not-a-token"}},
		Contexts:       map[string]*clientcmdapi.Context{"dead": {Cluster: "dead", AuthInfo: "nobody"}},
		CurrentContext: "dead",
	}
}

package ssh_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/controller/safety"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/provider"
	sshprov "marina.dev/marina/provider/ssh"
)

// workerSpec is an SSHMachine of the hosts labelled role=worker.
func workerSpec(t *testing.T, templates string) []byte {
	t.Helper()
	spec := map[string]any{
		"hostsRef":     map[string]string{"name": "ssh-hosts"},
		"hostSelector": map[string]string{"role": "worker"},
		"secretRef":    map[string]string{"name": "ssh-hosts"},
	}
	if templates != "" {
		spec["templatesRef"] = map[string]string{"name": templates}
	}
	raw, err := json.Marshal(map[string]any{"apiVersion": "ssh.marina.dev/v1alpha1", "kind": "SSHMachine", "spec": spec})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func workerRequest(ns, name string, id types.UID, spec []byte) *provider.Request {
	return &provider.Request{
		UID: id, Namespace: ns, Name: name, ProviderSpec: spec,
		Machine: clusterv1.MachineSpec{Roles: []clusterv1.MachineRole{clusterv1.WorkerRole}, Versions: clusterv1.MachineVersions{Kubelet: "v1.37.2"}},
		// A cluster that is not there: the agent keeps trying to register,
		// which is all these tests need of it.
		Bootstrap: provider.Bootstrap{Server: "https://10.78.0.1:1", CAData: []byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"), Token: "abcdef.0123456789abcdef"},
	}
}

// TestClaimIsExclusiveAndSurvivesRestart: one worker host, two machines.
// The first claims it; Create again, by this provider or a restarted one,
// finds that claim and makes nothing new; the second machine gets a
// condition naming the host and its holder; a crash between a claim and
// its record is found again; Delete leaves the host clean and free.
func TestClaimIsExclusiveAndSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	hs := startHosts(t, 2) // host 1: control-plane, host 2: worker
	ns := env.Namespace(t)
	hs.apply(t, ns)
	state := t.TempDir()
	p := newProvider(t, state)
	spec := workerSpec(t, "")
	// Host 2's shell start-up files write to stderr, as a version manager
	// or a banner does on many servers: the provider must read the
	// commands' answers from stdout alone (a claim once read as "claimed
	// by machine pyenv: cannot rehash...").
	hs.noisyShell(t, 2)

	a, b := uid("00000000000a"), uid("00000000000b")
	inst, err := p.Create(ctx, workerRequest(ns, "a", a, spec))
	if err != nil {
		t.Fatalf("Create a: %v", err)
	}
	if inst.ProviderID != "ssh://"+string(a) || len(inst.Addresses) == 0 || inst.Addresses[0].Address != "10.78.0.12" {
		t.Fatalf("Create a = %+v, want ssh://%s on 10.78.0.12", inst, a)
	}
	if got := strings.TrimSpace(hs.ssh(t, 2, "cat /var/lib/marina/claim/uid")); got != string(a) {
		t.Fatalf("host 2's claim holds %q, want %s", got, a)
	}
	if got := strings.TrimSpace(hs.ssh(t, 2, "stat -c %a /var/lib/marina/machine/bootstrap.json")); got != "600" {
		t.Errorf("bootstrap.json has mode %s, want 600", got)
	}
	agentPID := strings.TrimSpace(hs.ssh(t, 2, "cat /var/lib/marina/machine/agent.pid"))

	// Again, and from a restarted provider: the same host, the same agent.
	for i, prov := range []*sshprov.Provider{p, newProvider(t, state)} {
		again, err := prov.Create(ctx, workerRequest(ns, "a", a, spec))
		if err != nil || again.Addresses[0].Address != "10.78.0.12" {
			t.Fatalf("Create a again (%d) = %+v, %v", i, again, err)
		}
	}
	if pid := strings.TrimSpace(hs.ssh(t, 2, "cat /var/lib/marina/machine/agent.pid")); pid != agentPID {
		t.Errorf("the agent was started again: pid %s, then %s", agentPID, pid)
	}
	if got, err := p.Get(ctx, a); err != nil || got.State != provider.InstanceRunning {
		t.Errorf("Get a = %+v, %v; want Running", got, err)
	}

	// No free host for b: the error names the host and who holds it.
	_, err = p.Create(ctx, workerRequest(ns, "b", b, spec))
	if !sshprov.IsNoFreeHost(err) || !strings.Contains(err.Error(), "host "+hostAddr(2)+" is claimed by machine "+string(a)) {
		t.Fatalf("Create b = %v, want no free host naming %s and %s", err, hostAddr(2), a)
	}
	uids, err := p.MachineUIDs(ctx)
	if err != nil || len(uids) != 2 {
		t.Errorf("MachineUIDs = %v, %v; want a and b (b's record names no host)", uids, err)
	}

	// Delete: no process, no file but the provisioning log, no claim.
	if err := p.Delete(ctx, a); err != nil {
		t.Fatalf("Delete a: %v", err)
	}
	if got := strings.TrimSpace(hs.ssh(t, 2, "ls -A /var/lib/marina")); got != "log" {
		t.Errorf("host 2 keeps %q after Delete, want only the log", got)
	}
	// The host has a PID namespace of its own: what runs there is the
	// host's sshd, this session, and whatever the machine left.
	if ps := hs.ssh(t, 2, "for p in /proc/[0-9]*; do readlink $p/exe; done"); strings.Contains(ps, "/var/lib/marina") {
		t.Errorf("processes of the machine still run on host 2:\n%s", ps)
	}
	if _, err := p.Get(ctx, a); !provider.IsNotFound(err) {
		t.Errorf("Get a after Delete = %v, want NotFound", err)
	}
	if err := p.Delete(ctx, a); err != nil {
		t.Errorf("Delete a again: %v", err)
	}

	// A controller killed after claiming, before recording the claim: the
	// host is claimed for c (as tryClaim leaves it), its record names none.
	c := uid("00000000000c")
	hs.ssh(t, 2, "mkdir -p /var/lib/marina/claim && echo "+string(c)+" > /var/lib/marina/claim/uid")
	rec := map[string]any{"Namespace": ns, "Name": "c", "Claiming": map[string]any{"Address": "10.78.0.12", "Port": 22, "User": "root"}, "Spec": map[string]any{"hostsRef": map[string]string{"name": "ssh-hosts"}, "secretRef": map[string]string{"name": "ssh-hosts"}}}
	data, _ := json.Marshal(rec)
	if err := os.WriteFile(filepath.Join(state, string(c)+".json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if inst, err := p.Create(ctx, workerRequest(ns, "c", c, spec)); err != nil || inst.Addresses[0].Address != "10.78.0.12" {
		t.Fatalf("Create c after a crash = %+v, %v; want its claimed host 10.78.0.12", inst, err)
	}
	if err := p.Delete(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Create(ctx, workerRequest(ns, "b", b, spec)); err != nil {
		t.Fatalf("Create b once the host is free: %v", err)
	}
	if err := p.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	if uids, err := p.MachineUIDs(ctx); err != nil || len(uids) != 0 {
		t.Errorf("MachineUIDs after every Delete = %v, %v; want none", uids, err)
	}
}

// TestFailingStepIsNamedAndAFixedConfigMapIsUsed: the operator's second
// step fails; Create's error (the Machine's condition) names the step, its
// ConfigMap key and its last output lines, the output is in the host's
// log; fixing the ConfigMap makes the next attempt succeed.
func TestFailingStepIsNamedAndAFixedConfigMapIsUsed(t *testing.T) {
	ctx := context.Background()
	hs := startHosts(t, 2)
	ns := env.Namespace(t)
	hs.apply(t, ns)
	p := newProvider(t, t.TempDir())

	tmpl := sshprov.DefaultTemplates().Data
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "provisioning"}, Data: map[string]string{
		"provision-10-check.sh":        tmpl["provision-10-check.sh"],
		"provision-15-packages.sh":     "echo installing {{.Role}} packages\necho mirror unreachable >&2\nexit 3\n",
		"provision-20-start-agent.sh":  tmpl["provision-20-start-agent.sh"],
		"deprovision-10-stop-agent.sh": tmpl["deprovision-10-stop-agent.sh"],
		"deprovision-20-remove.sh":     tmpl["deprovision-20-remove.sh"],
	}}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	id := uid("0000000000f1")
	req := workerRequest(ns, "f", id, workerSpec(t, "provisioning"))
	_, err := p.Create(ctx, req)
	if err == nil {
		t.Fatal("Create with a failing step succeeded")
	}
	for _, want := range []string{"host " + hostAddr(2), "step 15-packages", "ConfigMap " + ns + "/provisioning key provision-15-packages.sh", "exited with status 3", "installing worker packages", "mirror unreachable"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Create's error does not say %q:\n%v", want, err)
		}
	}
	if log := hs.ssh(t, 2, "cat /var/lib/marina/log/provision.log"); !strings.Contains(log, "mirror unreachable") || !strings.Contains(log, "step 15-packages") {
		t.Errorf("the host's provisioning log lacks the step's output:\n%s", log)
	}

	cm.Data["provision-15-packages.sh"] = "echo installing {{.Role}} packages\necho done\n"
	if err := env.Client.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Create(ctx, req); err != nil {
		t.Fatalf("Create after the ConfigMap was fixed: %v", err)
	}
	if got, err := p.Get(ctx, id); err != nil || got.State != provider.InstanceRunning {
		t.Errorf("Get = %+v, %v; want Running", got, err)
	}
	if err := p.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// TestFaultsNameTheHostAndTheCause: a wrong key, an unknown host key and an
// unreachable host each fail Create with the host and the cause, and
// claim nothing.
func TestFaultsNameTheHostAndTheCause(t *testing.T) {
	ctx := context.Background()
	hs := startHosts(t, 2)
	ns := env.Namespace(t)
	hs.apply(t, ns)
	p := newProvider(t, t.TempDir())

	otherKey, err := os.ReadFile(filepath.Join(hs.dir, "host-1", "ssh_host_ed25519_key"))
	if err != nil {
		t.Fatal(err)
	}
	otherPub, err := os.ReadFile(filepath.Join(hs.dir, "host-1", "ssh_host_ed25519_key.pub"))
	if err != nil {
		t.Fatal(err)
	}
	pub := strings.Fields(string(otherPub))
	secret := func(name string, key, known []byte) {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{sshprov.PrivateKeyKey: key, sshprov.KnownHostsKey: known}}
		if err := env.Client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	key, known := hs.secret.Data[sshprov.PrivateKeyKey], hs.secret.Data[sshprov.KnownHostsKey]
	secret("wrong-key", otherKey, known)
	secret("wrong-host-key", key, []byte("10.78.0.12 "+pub[0]+" "+pub[1]+"\n"))

	machine := func(secretName string, hosts []map[string]any) []byte {
		raw, _ := json.Marshal(map[string]any{"apiVersion": "ssh.marina.dev/v1alpha1", "kind": "SSHMachine", "spec": map[string]any{
			"hosts": hosts, "secretRef": map[string]string{"name": secretName}}})
		return raw
	}
	host2 := []map[string]any{{"address": "10.78.0.12"}}
	for _, tc := range []struct {
		name string
		spec []byte
		want []string
	}{
		{"wrong key", machine("wrong-key", host2), []string{"host " + hostAddr(2) + " refused the key of Secret " + ns + "/wrong-key"}},
		{"unknown host key", machine("wrong-host-key", host2), []string{"host " + hostAddr(2) + ": unknown host key", "does not list for it"}},
		{"unreachable", machine("ssh-hosts", []map[string]any{{"address": "10.78.0.99"}}), []string{"host 10.78.0.99:22 is unreachable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := uid("0000000000e" + string(rune('0'+len(tc.name)%10)))
			start := time.Now()
			_, err := p.Create(ctx, workerRequest(ns, "e", id, tc.spec))
			if err == nil {
				t.Fatal("Create succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
			if time.Since(start) > 30*time.Second {
				t.Errorf("Create took %s to fail", time.Since(start))
			}
			// It claimed nothing, so nothing is left to release, whatever
			// the host answers.
			if err := p.Delete(ctx, id); err != nil {
				t.Errorf("Delete: %v", err)
			}
		})
	}
	if got := strings.TrimSpace(hs.ssh(t, 2, "ls -A /var/lib/marina")); got != "" {
		t.Errorf("host 2 holds %q after failed logins, want nothing", got)
	}

	t.Run("disk full", func(t *testing.T) {
		binDir, err := testenv.BinDir()
		if err != nil {
			t.Fatal(err)
		}
		// More room than any test host has: the default check step refuses.
		full, err := sshprov.New(sshprov.Options{StateDir: t.TempDir(), AgentBinary: marina(t), BinDir: binDir, Client: env.Client, MinFreeKiB: 1 << 40})
		if err != nil {
			t.Fatal(err)
		}
		id := uid("0000000000d1")
		_, err = full.Create(ctx, workerRequest(ns, "d", id, machine("ssh-hosts", host2)))
		for _, w := range []string{"host " + hostAddr(2), "step 10-check", "KiB free under /var/lib/marina", "free some space"} {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("Create on a full host = %v, want it to say %q", err, w)
			}
		}
		if err := full.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(hs.ssh(t, 2, "ls -A /var/lib/marina")); got != "log" {
			t.Errorf("host 2 keeps %q after Delete, want only the log", got)
		}
	})
}

// TestConcurrentClaimsGiveOneHostToOneMachine: four controllers (providers
// with state of their own) create four machines at once for the one
// worker host: exactly one gets it, the others are told who holds it.
func TestConcurrentClaimsGiveOneHostToOneMachine(t *testing.T) {
	ctx := context.Background()
	hs := startHosts(t, 2)
	ns := env.Namespace(t)
	hs.apply(t, ns)
	spec := workerSpec(t, "")
	const n = 4
	provs := make([]*sshprov.Provider, n)
	for i := range provs {
		provs[i] = newProvider(t, t.TempDir())
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			_, errs[i] = provs[i].Create(ctx, workerRequest(ns, "m", uid("00000000000"+string(rune('1'+i))), spec))
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Errorf("machines %d and %d both got the host", winner, i)
		case err == nil:
			winner = i
		case !sshprov.IsNoFreeHost(err):
			t.Errorf("machine %d: %v, want no free host", i, err)
		}
	}
	if winner < 0 {
		t.Fatalf("no machine got the host: %v", errs)
	}
	want := uid("00000000000" + string(rune('1'+winner)))
	if got := strings.TrimSpace(hs.ssh(t, 2, "cat /var/lib/marina/claim/uid")); got != string(want) {
		t.Errorf("the host's claim names %q, want the winner %s", got, want)
	}
	for i := range n {
		if err := provs[i].Delete(ctx, uid("00000000000"+string(rune('1'+i)))); err != nil {
			t.Errorf("Delete %d: %v", i, err)
		}
	}
	if got := strings.TrimSpace(hs.ssh(t, 2, "ls -A /var/lib/marina")); got != "log" {
		t.Errorf("host 2 keeps %q, want only the log", got)
	}
}

// TestKilledMidProvisioningKeepsItsHostAndAnOrphanIsReleased: a controller
// killed while a machine's step runs (its context ends, its SSH session
// with it) leaves the host claimed; the next controller's Create takes the
// same host and claims no other. The machine never had a Machine: the
// safety controller finds its claim through MachineUIDs and releases the
// host.
func TestKilledMidProvisioningKeepsItsHostAndAnOrphanIsReleased(t *testing.T) {
	ctx := context.Background()
	hs := startHosts(t, 3) // host 1: control-plane; 2 and 3: workers
	ns := env.Namespace(t)
	hs.apply(t, ns)
	state := t.TempDir()
	tmpl := sshprov.DefaultTemplates().Data
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "slow"}, Data: map[string]string{
		"provision-10-check.sh":        tmpl["provision-10-check.sh"],
		"provision-15-wait.sh":         "echo waiting for the mirror\nsleep 600\n",
		"provision-20-start-agent.sh":  tmpl["provision-20-start-agent.sh"],
		"deprovision-10-stop-agent.sh": tmpl["deprovision-10-stop-agent.sh"],
		"deprovision-20-remove.sh":     tmpl["deprovision-20-remove.sh"],
	}}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	id := uid("0000000000k1")
	req := workerRequest(ns, "k", id, workerSpec(t, "slow"))

	killed, kill := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := newProvider(t, state).Create(killed, req); done <- err }()
	claimed := 0
	testenv.Eventually(t, time.Minute, "the machine's step runs on a claimed host", func() error {
		for i := 2; i <= 3; i++ {
			if strings.Contains(hs.ssh(t, i, "cat /var/lib/marina/log/provision.log 2>/dev/null; true"), "waiting for the mirror") {
				claimed = i
				return nil
			}
		}
		return errors.New("no step runs yet")
	})
	kill()
	if err := <-done; err == nil {
		t.Fatal("Create succeeded though its controller was killed")
	}

	cm.Data["provision-15-wait.sh"] = "echo mirror ready\n"
	if err := env.Client.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, state)
	inst, err := p.Create(ctx, req)
	if err != nil {
		t.Fatalf("Create after the restart: %v", err)
	}
	if want := fmt.Sprintf("10.78.0.%d", 10+claimed); inst.Addresses[0].Address != want {
		t.Errorf("after the restart the machine is on %s, want its host %s", inst.Addresses[0].Address, want)
	}
	// The killed controller's step does not run on: nothing but the next
	// attempt can stop it (an SSH command has no terminal to hang up).
	if ps := hs.ssh(t, claimed, `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline; echo; done`); strings.Contains(ps, "sleep 600") {
		t.Errorf("the killed attempt's step still runs on host %d:\n%s", claimed, ps)
	}
	other := 5 - claimed
	if got := strings.TrimSpace(hs.ssh(t, other, "cat /var/lib/marina/claim/uid 2>/dev/null; true")); got != "" {
		t.Errorf("host %d was claimed too, by %q", other, got)
	}

	// No Machine has this UID: the safety controller releases the host.
	registry, err := provider.NewRegistry(p)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := safety.SetupWithManager(mgr, safety.Options{Providers: registry, Period: 500 * time.Millisecond, Grace: time.Second}); err != nil {
		t.Fatal(err)
	}
	mgrCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = mgr.Start(mgrCtx) }()
	testenv.Eventually(t, time.Minute, "the orphan's host released", func() error {
		if got := strings.TrimSpace(hs.ssh(t, claimed, "ls -A /var/lib/marina")); got != "log" {
			return fmt.Errorf("host %d holds %q", claimed, got)
		}
		if uids, err := p.MachineUIDs(ctx); err != nil || len(uids) > 0 {
			return fmt.Errorf("MachineUIDs = %v, %v", uids, err)
		}
		return nil
	})
}

// TestStageVersionsCopiesTheUpgradesBinaries: for an InPlace upgrade the
// control-plane host gets the components of the new versions beside the
// ones it runs; a worker needs nothing; a machine with no host is not
// found.
func TestStageVersionsCopiesTheUpgradesBinaries(t *testing.T) {
	ctx := context.Background()
	hs := startHosts(t, 2)
	ns := env.Namespace(t)
	hs.apply(t, ns)
	state := t.TempDir()
	p := newProvider(t, state)
	id := uid("0000000000s1")
	// A control-plane machine holding host 1, as Create leaves it.
	hs.ssh(t, 1, "mkdir -p /var/lib/marina/claim && echo "+string(id)+" > /var/lib/marina/claim/uid")
	host := map[string]any{"Address": "10.78.0.11", "Port": 22, "User": "root"}
	rec, _ := json.Marshal(map[string]any{"Namespace": ns, "Name": "cp", "ControlPlane": true, "Host": host,
		"Spec": map[string]any{"hostsRef": map[string]string{"name": "ssh-hosts"}, "secretRef": map[string]string{"name": "ssh-hosts"}}})
	if err := os.WriteFile(filepath.Join(state, string(id)+".json"), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	v := provider.Versions{Kubelet: "v1.36.3", ControlPlane: clusterv1.ComponentVersions{APIServer: "v1.36.3", ControllerManager: "v1.36.3", Scheduler: "v1.36.3"}}
	if err := p.StageVersions(ctx, id, v); err != nil {
		t.Fatalf("StageVersions: %v", err)
	}
	got := strings.Fields(hs.ssh(t, 1, "ls /var/lib/marina/bin"))
	want := []string{"kube-apiserver-v1.36.3", "kube-controller-manager-v1.36.3", "kube-scheduler-v1.36.3"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("host 1's bin holds %v, want %v", got, want)
	}
	if err := p.StageVersions(ctx, uid("0000000000s2"), v); !provider.IsNotFound(err) {
		t.Errorf("StageVersions of an unknown machine = %v, want NotFound", err)
	}

	// The machine controller stages on every pass: versions already staged
	// need no visit to the host. Without the Secret to log in with, the
	// same versions are staged still, and new ones are refused naming it.
	secret := hs.secret.DeepCopy()
	secret.SetNamespace(ns)
	if err := env.Client.Delete(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if err := p.StageVersions(ctx, id, v); err != nil {
		t.Errorf("StageVersions of versions staged already, the Secret gone: %v, want nil (no login)", err)
	}
	next := v
	next.ControlPlane.APIServer = "v1.37.2"
	if err := p.StageVersions(ctx, id, next); err == nil || !strings.Contains(err.Error(), "ssh-hosts") {
		t.Errorf("StageVersions of a new apiserver, the Secret gone: %v, want the Secret named", err)
	}
	secret.ResourceVersion = ""
	if err := env.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if err := p.StageVersions(ctx, id, next); err != nil {
		t.Fatalf("StageVersions of a new apiserver: %v", err)
	}
	if got := hs.ssh(t, 1, "ls /var/lib/marina/bin"); !strings.Contains(got, "kube-apiserver-v1.37.2") {
		t.Errorf("host 1's bin holds %q, want kube-apiserver-v1.37.2 beside the others", got)
	}
	if err := p.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(hs.ssh(t, 1, "ls -A /var/lib/marina")); got != "log" {
		t.Errorf("host 1 keeps %q, want only the log", got)
	}
}

// TestStartRunsAKilledAgentAgain: a worker whose agent was killed is
// Stopped; Start with no fresh credential is refused (it never got its node
// certificate: the cluster is not there), with one it runs again on the
// same host.
func TestStartRunsAKilledAgentAgain(t *testing.T) {
	ctx := context.Background()
	hs := startHosts(t, 2)
	ns := env.Namespace(t)
	hs.apply(t, ns)
	p := newProvider(t, t.TempDir())
	id := uid("0000000000r1")
	req := workerRequest(ns, "r", id, workerSpec(t, ""))
	if _, err := p.Create(ctx, req); err != nil {
		t.Fatal(err)
	}
	before := strings.TrimSpace(hs.ssh(t, 2, "cat /var/lib/marina/machine/agent.pid"))
	hs.ssh(t, 2, "kill -9 "+before)
	testenv.Eventually(t, 30*time.Second, "the machine Stopped", func() error {
		inst, err := p.Get(ctx, id)
		if err != nil {
			return err
		}
		if inst.State != provider.InstanceStopped {
			return fmt.Errorf("state %s", inst.State)
		}
		return nil
	})
	if _, err := p.Start(ctx, id, nil); !provider.IsBootstrapNeeded(err) {
		t.Fatalf("Start with no credential = %v, want BootstrapNeeded", err)
	}
	inst, err := p.Start(ctx, id, &req.Bootstrap)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if inst.State != provider.InstanceRunning || inst.Addresses[0].Address != "10.78.0.12" {
		t.Errorf("Start = %+v, want Running on 10.78.0.12", inst)
	}
	if after := strings.TrimSpace(hs.ssh(t, 2, "cat /var/lib/marina/machine/agent.pid")); after == before {
		t.Errorf("the agent's pid is still %s", after)
	}
	if got, err := p.Get(ctx, id); err != nil || got.State != provider.InstanceRunning {
		t.Errorf("Get after Start = %+v, %v; want Running", got, err)
	}
	if err := p.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// Issue 36, finding 3: `kubectl delete namespace` removes the Secret and
// the templates ConfigMap before the Machines (they have no finalizer).
// Delete then logs in with the key Create kept and runs the deprovision
// steps it kept: the host is wiped and free, not claimed for good.
func TestDeleteAfterTheSecretAndTheTemplatesAreGone(t *testing.T) {
	ctx := context.Background()
	hs := startHosts(t, 2)
	ns := env.Namespace(t)
	hs.apply(t, ns)
	state := t.TempDir()
	p := newProvider(t, state)

	tmpl := sshprov.DefaultTemplates().Data
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "provisioning"}, Data: map[string]string{
		"provision-10-check.sh":        tmpl["provision-10-check.sh"],
		"provision-20-start-agent.sh":  tmpl["provision-20-start-agent.sh"],
		"deprovision-05-mark.sh":       "echo by the operators template > {{quote .LogDir}}/deprovisioned\n",
		"deprovision-10-stop-agent.sh": tmpl["deprovision-10-stop-agent.sh"],
		"deprovision-20-remove.sh":     tmpl["deprovision-20-remove.sh"],
	}}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	id := uid("0000000000d1")
	if _, err := p.Create(ctx, workerRequest(ns, "d", id, workerSpec(t, "provisioning"))); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(state, string(id)+".json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the record, which holds a copy of the key, is %v (%v), want mode 0600", fi.Mode(), err)
	}
	for _, o := range []client.Object{cm, hs.secret.DeepCopy()} {
		o.SetNamespace(ns)
		if err := env.Client.Delete(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Delete(ctx, id); err != nil {
		t.Fatalf("Delete with its Secret and ConfigMap gone: %v", err)
	}
	if got := strings.TrimSpace(hs.ssh(t, 2, "ls -A /var/lib/marina")); got != "log" {
		t.Errorf("host 2 keeps %q after Delete, want only the log", got)
	}
	if got := strings.TrimSpace(hs.ssh(t, 2, "cat /var/lib/marina/log/deprovisioned")); got != "by the operators template" {
		t.Errorf("the kept deprovision step did not run: %q", got)
	}
	if _, err := os.Stat(filepath.Join(state, string(id)+".json")); !os.IsNotExist(err) {
		t.Errorf("the record (and its copy of the key) outlived the machine: %v", err)
	}
}

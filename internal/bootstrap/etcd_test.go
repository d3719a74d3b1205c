package bootstrap_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"marina.dev/marina/internal/bootstrap"
	"marina.dev/marina/internal/manifest"
	"marina.dev/marina/internal/nodeagent/components"
	"marina.dev/marina/internal/testenv"
	"marina.dev/marina/tools"
)

// TestStackedEtcdMembersFormAClusterAndAThirdJoins starts two stacked
// members together (state new, each in the other's initial cluster), adds
// a third the way marina will (member add, then start it with state
// existing), and checks that the three form one cluster holding the same
// data. Only etcd runs: the other components have nothing to do with
// membership and would only load the machine.
func TestStackedEtcdMembersFormAClusterAndAThirdJoins(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three etcd members")
	}
	binDir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(binDir, "etcd-"+tools.Pinned().Etcd)); err != nil {
		t.Fatalf("etcd is missing: run `make setup` to build the pinned components: %v", err)
	}
	set := newSet(t)
	var machines []*bootstrap.Machine
	used := map[string]bool{}
	for len(machines) < 3 {
		ip, ports := machineAddress(t)
		if key := net.JoinHostPort(ip.String(), strconv.Itoa(ports.EtcdClient)); !used[key] {
			used[key] = true
			name := fmt.Sprintf("etcd-it-%d", len(machines))
			machines = append(machines, &bootstrap.Machine{
				ClusterName: "etcd-it", PKI: set, Name: name, IP: ip, Ports: ports,
				Endpoint: net.JoinHostPort(ip.String(), strconv.Itoa(ports.APIServer)),
				Version:  tools.Pinned().NewestKube(), BinDir: binDir, Dir: t.TempDir(),
			})
		}
	}
	member := func(m *bootstrap.Machine) bootstrap.EtcdMember {
		return bootstrap.EtcdMember{Name: m.Name, PeerURL: "https://" + net.JoinHostPort(m.IP.String(), strconv.Itoa(m.Ports.EtcdPeer))}
	}
	clientURL := func(m *bootstrap.Machine) string {
		return "https://" + net.JoinHostPort(m.IP.String(), strconv.Itoa(m.Ports.EtcdClient))
	}
	var sups []*components.Supervisor
	var stops []func()
	var etcd *etcdClient
	start := func(m *bootstrap.Machine, initial []bootstrap.EtcdMember, state bootstrap.EtcdClusterState) {
		t.Helper()
		m.Etcd = bootstrap.EtcdConfig{Stacked: &bootstrap.StackedEtcd{InitialCluster: initial, State: state}}
		b, err := bootstrap.ControlPlane(m, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Write(); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{bootstrap.APIServer, bootstrap.ControllerManager, bootstrap.Scheduler} {
			if err := manifest.Remove(m.Dir, name); err != nil {
				t.Fatal(err)
			}
		}
		if etcd == nil {
			etcd = newEtcdClient(t, b)
		}
		sup, stop := supervise(t, m.Dir)
		sups, stops = append(sups, sup), append(stops, stop)
	}

	began := time.Now()
	initial := []bootstrap.EtcdMember{member(machines[0]), member(machines[1])}
	start(machines[0], initial, bootstrap.EtcdNewCluster)
	start(machines[1], initial, bootstrap.EtcdNewCluster)
	testenv.Eventually(t, 60*time.Second, "the first two members form a cluster", func() error {
		return etcd.wantMembers(clientURL(machines[0]), machines[:2])
	})
	t.Logf("two members formed a cluster in %s", time.Since(began).Round(10*time.Millisecond))
	etcd.put(t, clientURL(machines[0]), "marina-test", "written before the third member joined")

	began = time.Now()
	etcd.addMember(t, clientURL(machines[1]), member(machines[2]).PeerURL)
	start(machines[2], append(initial, member(machines[2])), bootstrap.EtcdExistingCluster)
	testenv.Eventually(t, 60*time.Second, "the third member joins and serves the cluster's data", func() error {
		if err := etcd.wantMembers(clientURL(machines[2]), machines); err != nil {
			return err
		}
		got, err := etcd.get(clientURL(machines[2]), "marina-test")
		if err != nil {
			return err
		}
		if got != "written before the third member joined" {
			return fmt.Errorf("the third member reads %q", got)
		}
		return nil
	})
	t.Logf("the third member joined and served the data in %s", time.Since(began).Round(10*time.Millisecond))

	var running []proc
	for _, sup := range sups {
		for _, st := range sup.Status() {
			if st.State != components.Running || st.Restarts != 0 {
				t.Errorf("%s is %s after %d restarts, want Running after none", st.Name, st.State, st.Restarts)
			}
			if st.PID != 0 {
				running = append(running, procOf(t, st.PID))
			}
		}
	}
	for _, stop := range stops {
		stop()
	}
	for _, p := range running {
		if p.alive() {
			t.Errorf("etcd process %d still runs after its supervisor stopped", p.pid)
		}
	}
}

// etcdClient speaks to etcd's JSON gateway with the healthcheck client
// certificate of a bundle, trusting only the etcd CA.
type etcdClient struct{ http *http.Client }

func newEtcdClient(t *testing.T, b *bootstrap.Bundle) *etcdClient {
	t.Helper()
	pair, err := tls.X509KeyPair(b.Files[bootstrap.EtcdHealthcheckClientCert].Data, b.Files[bootstrap.EtcdHealthcheckClientKey].Data)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b.Files[bootstrap.EtcdCACert].Data)
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}}}
	t.Cleanup(c.CloseIdleConnections)
	return &etcdClient{http: c}
}

func (c *etcdClient) call(url, path string, req, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	r, err := c.http.Post(url+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer r.Body.Close()
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	if r.StatusCode != http.StatusOK {
		return fmt.Errorf("%s%s: %s: %s", url, path, r.Status, data)
	}
	return json.Unmarshal(data, resp)
}

// wantMembers checks, asking the member at url, that the cluster's members
// are exactly machines, each started (named) and advertising its client URL.
func (c *etcdClient) wantMembers(url string, machines []*bootstrap.Machine) error {
	var list struct {
		Members []struct {
			Name       string   `json:"name"`
			PeerURLs   []string `json:"peerURLs"`
			ClientURLs []string `json:"clientURLs"`
		} `json:"members"`
	}
	if err := c.call(url, "/v3/cluster/member/list", map[string]any{"linearizable": true}, &list); err != nil {
		return err
	}
	var got, want []string
	for _, m := range list.Members {
		got = append(got, fmt.Sprintf("%s %v %v", m.Name, m.PeerURLs, m.ClientURLs))
	}
	for _, m := range machines {
		host := m.IP.String()
		want = append(want, fmt.Sprintf("%s [https://%s] [https://%s]", m.Name,
			net.JoinHostPort(host, strconv.Itoa(m.Ports.EtcdPeer)), net.JoinHostPort(host, strconv.Itoa(m.Ports.EtcdClient))))
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		return fmt.Errorf("members %v, want %v", got, want)
	}
	return nil
}

// addMember adds a voting member. etcd refuses ("unhealthy cluster") until
// every member has been connected for a few seconds, so it retries.
func (c *etcdClient) addMember(t *testing.T, url, peerURL string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "adding member "+peerURL, func() error {
		var resp map[string]any
		return c.call(url, "/v3/cluster/member/add", map[string]any{"peerURLs": []string{peerURL}}, &resp)
	})
}

func (c *etcdClient) put(t *testing.T, url, key, value string) {
	t.Helper()
	var resp map[string]any
	req := map[string]string{"key": base64.StdEncoding.EncodeToString([]byte(key)), "value": base64.StdEncoding.EncodeToString([]byte(value))}
	if err := c.call(url, "/v3/kv/put", req, &resp); err != nil {
		t.Fatalf("writing %s: %v", key, err)
	}
}

func (c *etcdClient) get(url, key string) (string, error) {
	var resp struct {
		KVs []struct {
			Value string `json:"value"`
		} `json:"kvs"`
	}
	if err := c.call(url, "/v3/kv/range", map[string]string{"key": base64.StdEncoding.EncodeToString([]byte(key))}, &resp); err != nil {
		return "", err
	}
	if len(resp.KVs) != 1 {
		return "", fmt.Errorf("%d values for %s", len(resp.KVs), key)
	}
	v, err := base64.StdEncoding.DecodeString(resp.KVs[0].Value)
	return string(v), err
}

package loadbalancer

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"marina.dev/marina/internal/files"
)

// Files of a load balancer's directory. The caller writes the first four
// (WriteDir does); the running balancer writes the others.
const (
	// ConfigFile holds the FileConfig, as JSON. It holds no secret.
	ConfigFile = "config.json"
	// CAFile holds the PEM bundle that verifies the backends.
	CAFile = "ca.pem"
	// ClientCertFile and ClientKeyFile, optional, authenticate the checks.
	// The key is a secret: the balancer refuses it unless only its owner
	// can read it, and never logs or copies it.
	ClientCertFile = "client.pem"
	ClientKeyFile  = "client-key.pem"
	// LockFile is flocked exclusively by the running balancer for its
	// lifetime: whoever holds it is, by definition, the directory's
	// balancer.
	LockFile = "lb.lock"
	// PIDFile records the PID of the balancer Start last started.
	PIDFile = "lb.pid"
	// LogFile receives the balancer's standard output and error.
	LogFile = "lb.log"
	// AddressFile holds the address the running balancer listens on,
	// written once it listens.
	AddressFile = "address"
)

// FileConfig is the configuration a balancer process reads from its
// directory. Zero values take the defaults of Config and HealthCheck.
type FileConfig struct {
	// Listen is the address to listen on, host:port. Changing it takes a
	// restart: a cluster's endpoint does not move.
	Listen string `json:"listen"`
	// Backends are the API servers, host:port.
	Backends []string `json:"backends"`
	// Draining are backends that take no new connections and whose
	// connections are left for them to close (an API server restarted
	// gracefully); each is one of Backends.
	Draining []string `json:"draining,omitempty"`
	// ServerName is the name checked in the backends' certificates, when
	// they do not name their IP address.
	ServerName    string          `json:"serverName,omitempty"`
	Path          string          `json:"path,omitempty"`
	Interval      metav1.Duration `json:"interval,omitzero"`
	Timeout       metav1.Duration `json:"timeout,omitzero"`
	FailThreshold int             `json:"failThreshold,omitempty"`
	RiseThreshold int             `json:"riseThreshold,omitempty"`
	// Drain, like Listen, takes a restart; everything else applies to a
	// running balancer.
	Drain metav1.Duration `json:"drain,omitzero"`
}

func (c *FileConfig) check() error {
	if _, port, err := net.SplitHostPort(c.Listen); err != nil || port == "" {
		return fmt.Errorf("listen %q is not host:port", c.Listen)
	}
	_, err := checkAddresses(c.Backends)
	return err
}

// TLSFiles is the health checks' TLS material, in PEM.
type TLSFiles struct {
	// CA verifies the backends' serving certificates. Required.
	CA []byte
	// ClientCert and ClientKey, both or neither, authenticate the checks.
	ClientCert, ClientKey []byte
}

// WriteDir writes a balancer's configuration into dir, creating it (mode
// 0700): the PEM files first, then the config, each atomically and with
// mode 0600, so that a running balancer, which watches them, sees a
// complete new state at the latest with the config.
func WriteDir(dir string, cfg FileConfig, t TLSFiles) error {
	if err := cfg.check(); err != nil {
		return fmt.Errorf("load balancer config: %w", err)
	}
	if len(t.CA) == 0 {
		return errors.New("load balancer config: the CA bundle is empty")
	}
	if (len(t.ClientCert) == 0) != (len(t.ClientKey) == 0) {
		return errors.New("load balancer config: a client certificate needs its key, and the other way round")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating load balancer directory: %w", err)
	}
	for name, data := range map[string][]byte{CAFile: t.CA, ClientCertFile: t.ClientCert, ClientKeyFile: t.ClientKey} {
		path := filepath.Join(dir, name)
		if len(data) == 0 {
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			continue
		}
		if err := files.WriteAtomic(path, data, 0o600); err != nil {
			return err
		}
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return files.WriteAtomic(filepath.Join(dir, ConfigFile), append(data, '\n'), 0o600)
}

// readDir reads dir's configuration and TLS material.
func readDir(dir string) (FileConfig, HealthCheck, error) {
	var cfg FileConfig
	data, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		return cfg, HealthCheck{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return cfg, HealthCheck{}, fmt.Errorf("parsing %s: %w", ConfigFile, err)
	}
	if err := cfg.check(); err != nil {
		return cfg, HealthCheck{}, fmt.Errorf("%s: %w", ConfigFile, err)
	}
	tlsConfig, err := readTLS(dir)
	if err != nil {
		return cfg, HealthCheck{}, err
	}
	tlsConfig.ServerName = cfg.ServerName
	return cfg, HealthCheck{
		TLS:           tlsConfig,
		Path:          cfg.Path,
		Interval:      cfg.Interval.Duration,
		Timeout:       cfg.Timeout.Duration,
		FailThreshold: cfg.FailThreshold,
		RiseThreshold: cfg.RiseThreshold,
	}, nil
}

func readTLS(dir string) (*tls.Config, error) {
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s holds no PEM certificate", CAFile)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	certPath, keyPath := filepath.Join(dir, ClientCertFile), filepath.Join(dir, ClientKeyFile)
	info, err := os.Stat(keyPath)
	if errors.Is(err, os.ErrNotExist) {
		return cfg, nil
	}
	if err != nil {
		return nil, err
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s is readable by others (mode %04o): it is a secret, make it 0600", ClientKeyFile, perm)
	}
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// Not err itself: it would be safe today, but it is about the key.
		return nil, fmt.Errorf("%s and %s are not a certificate and its key", ClientCertFile, ClientKeyFile)
	}
	cfg.Certificates = []tls.Certificate{pair}
	return cfg, nil
}

// dirSignature changes whenever one of the files the balancer reads is
// written, created or removed: files.WriteAtomic renames a new inode over
// the old, so the inode changes even when the size and the time do not.
func dirSignature(dir string) string {
	var b bytes.Buffer
	for _, name := range []string{ConfigFile, CAFile, ClientCertFile, ClientKeyFile} {
		info, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			b.WriteString("-;")
			continue
		}
		var ino uint64
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			ino = st.Ino
		}
		fmt.Fprintf(&b, "%d:%d:%d:%o;", ino, info.Size(), info.ModTime().UnixNano(), info.Mode().Perm())
	}
	return b.String()
}

// runTiming are RunDir's periods; tests shorten them.
type runTiming struct {
	// reload is how often the directory's files are checked for changes.
	reload time.Duration
	// lockWait is how long a starting balancer waits for a lock prober to
	// let go before concluding that another balancer runs the directory.
	lockWait time.Duration
}

var defaultRunTiming = runTiming{reload: time.Second, lockWait: 2 * time.Second}

// RunDir runs the balancer of directory dir until ctx ends, and returns nil
// then. It takes the directory's lock first, and fails with an error
// wrapping ErrRunning if another balancer holds it. It reads its listen
// address, backends and TLS material from the directory, listens, writes
// AddressFile, and from then on applies every change to the files (checked
// every second): the backends and the health checks change in place, a
// config that does not load is logged and the last good one kept.
//
// It polls rather than watching with inotify: a stat of four files a
// second costs nothing, needs no dependency, survives the files being
// replaced by rename (which an inotify watch on the file would not), and
// a second is short next to the health checks' own periods.
func RunDir(ctx context.Context, dir string) error {
	return runDir(ctx, dir, defaultRunTiming)
}

func runDir(ctx context.Context, dir string, t runTiming) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("resolving load balancer directory: %w", err)
	}
	lock, err := lockDir(dir, t.lockWait)
	if err != nil {
		return fmt.Errorf("starting the load balancer of %s: %w", dir, err)
	}
	defer lock.Close()
	log := klog.FromContext(ctx)

	sig := dirSignature(dir)
	cfg, hc, err := readDir(dir)
	if err != nil {
		return fmt.Errorf("load balancer directory %s: %w", dir, err)
	}
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("load balancer: %w", err)
	}
	b, err := New(Config{Backends: cfg.Backends, HealthCheck: hc, Drain: cfg.Drain.Duration, Log: log})
	if err != nil {
		l.Close()
		return err
	}
	b.SetDraining(cfg.Draining)
	addressPath := filepath.Join(dir, AddressFile)
	if err := files.WriteAtomic(addressPath, []byte(l.Addr().String()+"\n"), 0o600); err != nil {
		l.Close()
		return err
	}
	defer os.Remove(addressPath)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- b.Serve(ctx, l) }()
	tick := time.NewTicker(t.reload)
	defer tick.Stop()
	for {
		select {
		case err := <-served:
			return err
		case <-tick.C:
		}
		now := dirSignature(dir)
		if now == sig {
			continue
		}
		if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			// Its cluster's endpoint was removed under it (a state
			// directory deleted by hand): nobody would ever stop it, and
			// it would hold its address for good.
			log.Info("Load balancer directory removed, stopping", "dir", dir)
			return nil
		}
		// Whatever happens, this state has been seen: a bad config is
		// logged once, and the next write is read again.
		sig = now
		next, nextHC, err := readDir(dir)
		if err != nil {
			log.Error(err, "Load balancer config changed but does not load; keeping the last good one", "dir", dir)
			continue
		}
		if next.Listen != cfg.Listen {
			log.Info("The listen address changed; it takes a restart, still listening on the old one", "listen", cfg.Listen, "wanted", next.Listen)
		}
		if err := b.SetBackends(next.Backends); err != nil {
			log.Error(err, "Load balancer config changed but its backends are invalid", "dir", dir)
			continue
		}
		b.SetDraining(next.Draining)
		b.SetHealthCheck(nextHC)
		log.Info("Load balancer config reloaded", "backends", next.Backends)
		cfg = next
	}
}

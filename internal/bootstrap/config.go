package bootstrap

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/clusterpki"
	"marina.dev/marina/internal/pki"
)

// Config is what marina hands a control-plane machine
// (provider.Bootstrap.ControlPlane, as JSON): the cluster's facts and key
// material, without the machine's own facts (its name and address), which
// the machine knows and marina may not know yet. The machine's agent turns
// it into a Machine and its Bundle, as kubeadm join --control-plane does
// with the certificates it downloads.
//
// It holds private keys: it is stored 0600 and never logged (String hides
// it).
type Config struct {
	ClusterName string `json:"clusterName"`
	// Endpoint is host:port of the cluster's control-plane endpoint.
	Endpoint string                   `json:"endpoint"`
	Network  clusterv1.ClusterNetwork `json:"network,omitempty"`
	Version  string                   `json:"version"`
	// EtcdVersion is the stacked etcd's release; empty means the pinned one.
	EtcdVersion string                           `json:"etcdVersion,omitempty"`
	Components  clusterv1.ControlPlaneComponents `json:"components,omitempty"`
	PKI         PKI                              `json:"pki"`
	// Etcd: exactly one of Stacked and External.
	Etcd ConfigEtcd `json:"etcd"`
	// CertValidity is how long the machine's certificates are valid
	// (spec.controlPlane.certificateValidity); zero: pki.LeafValidity.
	CertValidity time.Duration `json:"certValidity,omitempty"`
}

// PKI is a cluster's key material as PEM. The Etcd pair is absent with
// external etcd.
type PKI struct {
	CACert               []byte `json:"caCert"`
	CAKey                []byte `json:"caKey"`
	EtcdCACert           []byte `json:"etcdCACert,omitempty"`
	EtcdCAKey            []byte `json:"etcdCAKey,omitempty"`
	FrontProxyCACert     []byte `json:"frontProxyCACert"`
	FrontProxyCAKey      []byte `json:"frontProxyCAKey"`
	ServiceAccountKey    []byte `json:"serviceAccountKey"`
	ServiceAccountPubKey []byte `json:"serviceAccountPub"`
}

// ConfigEtcd says where the cluster's etcd runs.
type ConfigEtcd struct {
	Stacked  *ConfigStackedEtcd `json:"stacked,omitempty"`
	External *ExternalEtcd      `json:"external,omitempty"`
}

// ConfigStackedEtcd is a stacked member to be.
type ConfigStackedEtcd struct {
	// Join are the client URLs of the running members. Empty: this machine
	// starts a new etcd cluster alone (the cluster's first control-plane
	// machine). Otherwise the machine adds itself as a member through them
	// before it starts its own (etcd's member add), unless it is a member
	// already (a restart).
	Join []string `json:"join,omitempty"`
}

// String hides the key material.
func (c *Config) String() string {
	return fmt.Sprintf("control-plane config of cluster %s (version %s)", c.ClusterName, c.Version)
}

// MarshalLog hides the key material from logr.
func (c *Config) MarshalLog() any { return c.String() }

// Check says what is missing, without quoting key material.
func (c *Config) Check() error {
	var errs []error
	if c.ClusterName == "" {
		errs = append(errs, errors.New("clusterName is empty"))
	}
	if c.Endpoint == "" {
		errs = append(errs, errors.New("endpoint is empty"))
	}
	if c.Version == "" {
		errs = append(errs, errors.New("version is empty"))
	}
	if (c.Etcd.Stacked == nil) == (c.Etcd.External == nil) {
		errs = append(errs, errors.New("etcd: exactly one of stacked and external must be set"))
	}
	p := c.PKI
	if len(p.CACert) == 0 || len(p.CAKey) == 0 || len(p.FrontProxyCACert) == 0 || len(p.FrontProxyCAKey) == 0 ||
		len(p.ServiceAccountKey) == 0 || len(p.ServiceAccountPubKey) == 0 {
		errs = append(errs, errors.New("pki: the cluster CA, the front-proxy CA and the service-account key pair are required"))
	}
	if c.Etcd.Stacked != nil && (len(p.EtcdCACert) == 0 || len(p.EtcdCAKey) == 0) {
		errs = append(errs, errors.New("pki: the etcd CA is required with stacked etcd"))
	}
	return errors.Join(errs...)
}

// EncodeConfig is the document marina hands a control-plane machine.
func EncodeConfig(c *Config) ([]byte, error) {
	if err := c.Check(); err != nil {
		return nil, fmt.Errorf("control-plane config: %w", err)
	}
	return json.Marshal(c)
}

// DecodeConfig reads and checks a document made by EncodeConfig.
func DecodeConfig(data []byte) (*Config, error) {
	var c Config
	if err := json.Unmarshal(data, &c); err != nil {
		// json's errors quote no input beyond a type name and an offset.
		return nil, fmt.Errorf("decoding the control-plane config: %w", err)
	}
	if err := c.Check(); err != nil {
		return nil, fmt.Errorf("control-plane config: %w", err)
	}
	return &c, nil
}

// PKIOf encodes a cluster's key material for a Config.
func PKIOf(s *clusterpki.Set) (PKI, error) {
	var p PKI
	var err error
	enc := func(kp *pki.KeyPair, cert, key *[]byte) {
		if kp == nil || err != nil {
			return
		}
		*cert = kp.CertPEM()
		*key, err = kp.KeyPEM()
	}
	enc(s.CA, &p.CACert, &p.CAKey)
	enc(s.Etcd, &p.EtcdCACert, &p.EtcdCAKey)
	enc(s.FrontProxy, &p.FrontProxyCACert, &p.FrontProxyCAKey)
	if err != nil {
		return PKI{}, fmt.Errorf("encoding the cluster's key material: %w", err)
	}
	p.ServiceAccountKey, p.ServiceAccountPubKey = s.ServiceAccountKey, s.ServiceAccountPub
	return p, nil
}

// Set decodes the key material.
func (p PKI) Set() (*clusterpki.Set, error) {
	s := &clusterpki.Set{ServiceAccountKey: p.ServiceAccountKey, ServiceAccountPub: p.ServiceAccountPubKey}
	var err error
	dec := func(name string, cert, key []byte) *pki.KeyPair {
		if len(cert) == 0 || err != nil {
			return nil
		}
		kp, perr := pki.ParsePEM(cert, key)
		if perr != nil {
			err = fmt.Errorf("the %s CA: %w", name, perr)
		}
		return kp
	}
	s.CA = dec("cluster", p.CACert, p.CAKey)
	s.Etcd = dec("etcd", p.EtcdCACert, p.EtcdCAKey)
	s.FrontProxy = dec("front-proxy", p.FrontProxyCACert, p.FrontProxyCAKey)
	if err != nil {
		return nil, err
	}
	return s, nil
}

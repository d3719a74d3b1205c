// Package pki generates the certificate authorities and certificates marina
// needs (M15): the management plane's own CA and serving and client
// certificates today, a workload cluster's CA (generated, or the user's own)
// later. Keys are ECDSA P-256; everything is PEM-encoded. Private keys are
// written with mode 0600 and never logged.
package pki

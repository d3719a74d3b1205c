// Package capabilities publishes what the running marina controller can do
// (today: the Kubernetes versions its providers can run) in one ConfigMap,
// marina-system/marina-capabilities, and reads it back. The CLI asks it
// (marina upgrade plan) instead of guessing from the host it runs on,
// which need not be the controller's.
package capabilities

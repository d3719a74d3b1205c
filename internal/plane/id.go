package plane

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The controller reads the kube-system namespace for ID.
// +kubebuilder:rbac:groups="",resources=namespaces,resourceNames=kube-system,verbs=get

// ID names the management plane c talks to: its kube-system namespace's
// UID, which is the API server's own, stable over restarts and different
// on every other management plane. Two planes sharing a local provider
// root (marina move's source and target on one host) tell their machines
// apart by it.
func ID(ctx context.Context, c client.Client) (string, error) {
	ns := &corev1.Namespace{}
	if err := c.Get(ctx, client.ObjectKey{Name: metav1.NamespaceSystem}, ns); err != nil {
		return "", fmt.Errorf("reading the management plane's kube-system namespace (its id): %w", err)
	}
	return string(ns.UID), nil
}

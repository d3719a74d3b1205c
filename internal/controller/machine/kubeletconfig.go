package machine

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	clusterv1 "marina.dev/marina/api/v1alpha1"
	"marina.dev/marina/internal/kubeletconfig"
	"marina.dev/marina/provider"
)

// kubeletConfigRecheck is how often a machine whose kubelet configuration
// is missing or bad looks again (ConfigMaps are not watched).
const kubeletConfigRecheck = 10 * time.Second

// kubeletConfig reads and checks the machine's spec.kubeletConfigRef
// (M16). It reports false, with a condition saying what to fix, while the
// ConfigMap is missing or its document is not a KubeletConfiguration: the
// machine is not made until it is.
func (r *Reconciler) kubeletConfig(ctx context.Context, m *clusterv1.Machine) (*provider.KubeletConfig, bool, error) {
	ref := m.Spec.KubeletConfigRef
	if ref == nil {
		return nil, true, nil
	}
	cm := &corev1.ConfigMap{}
	err := r.live.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: ref.Name}, cm)
	switch {
	case apierrors.IsNotFound(err):
		setCondition(m, clusterv1.MachineProvisionedCondition, metav1.ConditionFalse, clusterv1.MachineKubeletConfigUnavailableReason,
			fmt.Sprintf("spec.kubeletConfigRef names configmap %s, which does not exist in namespace %s: create it with a KubeletConfiguration under key %q",
				ref.Name, m.Namespace, kubeletconfig.Key))
		setReady(m)
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("reading the kubelet configuration %s: %w", ref.Name, err)
	}
	c, err := kubeletconfig.Parse(ref.Name, []byte(cm.Data[kubeletconfig.Key]))
	if err != nil {
		setCondition(m, clusterv1.MachineProvisionedCondition, metav1.ConditionFalse, clusterv1.MachineKubeletConfigUnavailableReason, err.Error())
		setReady(m)
		return nil, false, nil
	}
	return &provider.KubeletConfig{Name: c.Name, Data: c.Data}, true, nil
}

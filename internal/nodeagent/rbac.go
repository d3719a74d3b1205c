package nodeagent

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// The identity node agents use in a workload cluster.
const (
	// ServiceAccountNamespace and ServiceAccountName name the agents'
	// ServiceAccount, whose tokens go into machines' bootstraps.
	ServiceAccountNamespace = metav1.NamespaceSystem
	ServiceAccountName      = "marina-node-agent"
	// RoleName names the ClusterRole, the Role in kube-node-lease, and their
	// bindings.
	RoleName = "marina:node-agent"
)

// clusterRules are what an agent does cluster-wide. Leases are granted by a
// Role in kube-node-lease only.
var clusterRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "create", "patch", "update"}},
	{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch", "update"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "delete"}},
	{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch", "update"}},
	{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
}

var leaseRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update", "patch"}},
}

// tokenRules let an agent renew its own token before it expires, and
// nothing else in kube-system.
var tokenRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, ResourceNames: []string{ServiceAccountName}, Verbs: []string{"create"}},
}

// EnsureIdentity creates, or brings back to what marina expects, the
// ServiceAccount kube-system/marina-node-agent, the ClusterRole and
// ClusterRoleBinding marina:node-agent, and the Roles and RoleBindings
// marina:node-agent in kube-node-lease (its Lease) and kube-system (renewing
// its own token). cs must be allowed to manage RBAC
// (the workload cluster's administrator).
func EnsureIdentity(ctx context.Context, cs kubernetes.Interface) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ServiceAccountNamespace, Name: ServiceAccountName}}
	if _, err := cs.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating service account %s/%s: %w", sa.Namespace, sa.Name, err)
	}
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ServiceAccountNamespace, Name: ServiceAccountName}}

	if err := ensureClusterRole(ctx, cs); err != nil {
		return err
	}
	if err := ensureClusterRoleBinding(ctx, cs, subjects); err != nil {
		return err
	}
	for namespace, rules := range map[string][]rbacv1.PolicyRule{
		corev1.NamespaceNodeLease: leaseRules,
		ServiceAccountNamespace:   tokenRules,
	} {
		if err := ensureRole(ctx, cs, namespace, rules); err != nil {
			return err
		}
		if err := ensureRoleBinding(ctx, cs, namespace, subjects); err != nil {
			return err
		}
	}
	return nil
}

func ensureClusterRole(ctx context.Context, cs kubernetes.Interface) error {
	c := cs.RbacV1().ClusterRoles()
	want := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: RoleName}, Rules: clusterRules}
	cur, err := c.Get(ctx, RoleName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err = c.Create(ctx, want, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			err = nil // made by a concurrent call, from the same rules
		}
	case err == nil && !apiequality.Semantic.DeepEqual(cur.Rules, want.Rules):
		cur.Rules = want.Rules
		_, err = c.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("ensuring cluster role %s: %w", RoleName, err)
	}
	return nil
}

func ensureClusterRoleBinding(ctx context.Context, cs kubernetes.Interface, subjects []rbacv1.Subject) error {
	c := cs.RbacV1().ClusterRoleBindings()
	want := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: RoleName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: RoleName},
		Subjects:   subjects,
	}
	cur, err := c.Get(ctx, RoleName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err = c.Create(ctx, want, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			err = nil // made by a concurrent call, from the same rules
		}
	case err == nil && !apiequality.Semantic.DeepEqual(cur.Subjects, want.Subjects):
		// roleRef is immutable and never differs: only subjects can drift.
		cur.Subjects = want.Subjects
		_, err = c.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("ensuring cluster role binding %s: %w", RoleName, err)
	}
	return nil
}

func ensureRole(ctx context.Context, cs kubernetes.Interface, namespace string, rules []rbacv1.PolicyRule) error {
	c := cs.RbacV1().Roles(namespace)
	want := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: RoleName}, Rules: rules}
	cur, err := c.Get(ctx, RoleName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err = c.Create(ctx, want, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			err = nil // made by a concurrent call, from the same rules
		}
	case err == nil && !apiequality.Semantic.DeepEqual(cur.Rules, want.Rules):
		cur.Rules = want.Rules
		_, err = c.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("ensuring role %s/%s: %w", namespace, RoleName, err)
	}
	return nil
}

func ensureRoleBinding(ctx context.Context, cs kubernetes.Interface, namespace string, subjects []rbacv1.Subject) error {
	c := cs.RbacV1().RoleBindings(namespace)
	want := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: RoleName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: RoleName},
		Subjects:   subjects,
	}
	cur, err := c.Get(ctx, RoleName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err = c.Create(ctx, want, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			err = nil // made by a concurrent call, from the same rules
		}
	case err == nil && !apiequality.Semantic.DeepEqual(cur.Subjects, want.Subjects):
		cur.Subjects = want.Subjects
		_, err = c.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("ensuring role binding %s/%s: %w", namespace, RoleName, err)
	}
	return nil
}

// IssueToken returns a new token of the agents' ServiceAccount, valid for
// ttl (the API server enforces at least 10 minutes), from the TokenRequest
// API. The token is secret: pass it on in provider.Bootstrap, never log it.
func IssueToken(ctx context.Context, cs kubernetes.Interface, ttl time.Duration) (string, error) {
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(int64(ttl / time.Second)),
	}}
	res, err := cs.CoreV1().ServiceAccounts(ServiceAccountNamespace).CreateToken(ctx, ServiceAccountName, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("issuing a token for service account %s/%s: %w", ServiceAccountNamespace, ServiceAccountName, err)
	}
	return res.Status.Token, nil
}

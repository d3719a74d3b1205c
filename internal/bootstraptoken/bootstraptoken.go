// Package bootstraptoken lets workers join their cluster the way kubelets
// do, whoever runs its control plane (issue 24): a short-lived bootstrap
// token per machine
// in the workload cluster, used once for TLS bootstrap (a CSR for
// system:node:<name>, approved by marina for the machine's own Node only
// and signed by the cluster's kube-controller-manager), after which the machine runs with its own node
// certificate under the Node authorizer and NodeRestriction.
package bootstraptoken

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"math/big"
	"regexp"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// DefaultTTL is how long a token lives: enough for a machine to start and
// ask for its certificate, short enough to be worthless soon after.
const DefaultTTL = 15 * time.Minute

// Secret keys and values of a bootstrap token (k8s.io/cluster-bootstrap's).
const (
	secretType     corev1.SecretType = "bootstrap.kubernetes.io/token"
	namePrefix                       = "bootstrap-token-"
	keyID                            = "token-id"
	keySecret                        = "token-secret"
	keyExpiration                    = "expiration"
	keyAuth                          = "usage-bootstrap-authentication"
	keyDescription                   = "description"
)

// alphabet is what token ids and secrets are made of.
const alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"

// pattern is a bootstrap token's form: "<id>.<secret>".
var pattern = regexp.MustCompile(`^[a-z0-9]{6}\.[a-z0-9]{16}$`)

// Is reports whether token is a bootstrap token (a ServiceAccount token is
// a JWT).
func Is(token string) bool { return pattern.MatchString(token) }

// idFor derives the token id from the machine's UID, so that every call for
// one machine finds the same Secret.
func idFor(uid types.UID) string {
	sum := sha256.Sum256([]byte(uid))
	id := make([]byte, 6)
	for i := range id {
		id[i] = alphabet[int(sum[i])%len(alphabet)]
	}
	return string(id)
}

// Ensure returns the machine's bootstrap token, making it in the workload
// cluster (kube-system/bootstrap-token-<id>) unless a live one exists: a
// retry hands out the same token. A token with less than a minute left is
// replaced. It creates first and reads only when the token exists: a new
// machine's token never does, and a read would cost its cluster's API
// server a request per worker.
func Ensure(ctx context.Context, cs kubernetes.Interface, uid types.UID, ttl time.Duration, now time.Time) (string, error) {
	id := idFor(uid)
	secrets := cs.CoreV1().Secrets(metav1.NamespaceSystem)
	want, secret, err := newToken(id, uid, ttl, now)
	if err != nil {
		return "", err
	}
	_, err = secrets.Create(ctx, want, metav1.CreateOptions{})
	if err == nil {
		return id + "." + secret, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("writing bootstrap token %s: %w", id, err)
	}
	cur, err := secrets.Get(ctx, namePrefix+id, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading bootstrap token %s: %w", id, err)
	}
	exp, perr := time.Parse(time.RFC3339, string(cur.Data[keyExpiration]))
	live := perr == nil && exp.After(now.Add(time.Minute))
	if live && string(cur.Data[keyDescription]) != description(uid) {
		// Six characters of a hash can collide: two machines never share
		// a token, which would let each ask for the other's certificate.
		return "", fmt.Errorf("bootstrap token %s belongs to another machine until %s", id, exp.UTC().Format(time.RFC3339))
	}
	if live && len(cur.Data[keySecret]) == 16 {
		return id + "." + string(cur.Data[keySecret]), nil
	}
	want.ResourceVersion = cur.ResourceVersion
	if _, err := secrets.Update(ctx, want, metav1.UpdateOptions{}); err != nil {
		// A concurrent call won: the next call reads its token.
		return "", fmt.Errorf("writing bootstrap token %s: %w", id, err)
	}
	return id + "." + secret, nil
}

// newToken is a fresh token Secret for the machine, and its secret part.
func newToken(id string, uid types.UID, ttl time.Duration, now time.Time) (*corev1.Secret, string, error) {
	secret, err := random(16)
	if err != nil {
		return nil, "", err
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: namePrefix + id},
		Type:       secretType,
		Data: map[string][]byte{
			keyID:          []byte(id),
			keySecret:      []byte(secret),
			keyExpiration:  []byte(now.Add(ttl).UTC().Format(time.RFC3339)),
			keyAuth:        []byte("true"),
			keyDescription: []byte(description(uid)),
		},
	}, secret, nil
}

func description(uid types.UID) string { return "marina: TLS bootstrap of machine " + string(uid) }

// Delete removes the machine's token once it has joined; nil if gone.
func Delete(ctx context.Context, cs kubernetes.Interface, uid types.UID) error {
	err := cs.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, namePrefix+idFor(uid), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting the bootstrap token of machine %s: %w", uid, err)
	}
	return nil
}

func random(n int) (string, error) {
	out := make([]byte, n)
	max := big.NewInt(int64(len(alphabet)))
	for i := range out {
		k, err := rand.Int(rand.Reader, max)
		if err != nil {
			return "", fmt.Errorf("generating a bootstrap token: %w", err)
		}
		out[i] = alphabet[k.Int64()]
	}
	return string(out), nil
}

// Username is the user the API server authenticates the machine's token
// as: system:bootstrap:<token id>. A certificate request made with the
// token carries it, which is how marina tells whose request it is.
func Username(uid types.UID) string { return "system:bootstrap:" + idFor(uid) }

// bindings let bootstrap tokens ask for node client certificates, and nodes
// renew their own (kube-controller-manager approves a renewal only for the
// name the node already holds). Unlike kubeadm, bootstrap tokens get no
// automatic approval: kube-controller-manager would sign whatever node
// name a token's holder asks for, so marina approves a worker's first
// certificate itself, for its Machine's Node only (package nodecsr).
var bindings = []struct {
	name, group, role string
}{
	{"marina:node-bootstrapper", "system:bootstrappers", "system:node-bootstrapper"},
	{"marina:node-autoapprove-certificate-rotation", "system:nodes", "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient"},
	// A real node's kube-proxy is a process of its machine run with the
	// node's own credential, not a DaemonSet with a ServiceAccount
	// (docs/architecture.md): nodes may then read Services and
	// EndpointSlices, which the Node authorizer does not grant.
	{"marina:node-proxier", "system:nodes", "system:node-proxier"},
}

// autoApproveBinding is the binding earlier marina releases made, which let
// kube-controller-manager approve any node name a bootstrap token asked
// for. EnsureRBAC removes it.
const autoApproveBinding = "marina:node-autoapprove-bootstrap"

// EnsureRBAC puts the bindings TLS bootstrap needs in the workload cluster,
// and removes the automatic approval an earlier marina granted.
func EnsureRBAC(ctx context.Context, cs kubernetes.Interface) error {
	c := cs.RbacV1().ClusterRoleBindings()
	for _, b := range bindings {
		want := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: b.name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: b.role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: b.group}},
		}
		if _, err := c.Create(ctx, want, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating cluster role binding %s: %w", b.name, err)
		}
	}
	// A kubeconfig that may not delete bindings (a cluster someone else
	// runs) leaves it to the cluster's administrator: docs/security.md.
	if err := c.Delete(ctx, autoApproveBinding, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
		return fmt.Errorf("removing the automatic approval of bootstrap tokens' certificates (cluster role binding %s): %w", autoApproveBinding, err)
	}
	return nil
}

package nodeagent

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"marina.dev/marina/internal/nodeagent/sandbox"
)

// Issue 24, finding 2: every worker joins with its own credential, bound to
// its Node, and is held by the Node authorizer and NodeRestriction. Against
// the real API server with both on, a worker's credential authenticates as
// its node and nothing more: it cannot patch another Node, delete a
// kube-system pod, or mint a token (the shared ServiceAccount it replaces
// could do all three).
func TestAWorkersCredentialIsHeldToItsNode(t *testing.T) {
	ctx := t.Context()
	admin := adminClient(t)
	node, dir, _ := runAgent(t, "held-", fast)
	other, _, _ := runAgent(t, "other-", fast)
	for _, n := range []string{node, other} {
		eventually(t, 60*time.Second, "node "+n+" registered", func() error {
			_, err := admin.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			return err
		})
	}
	worker := workerClient(t, dir)

	review, err := worker.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := review.Status.UserInfo; u.Username != "system:node:"+node || !contains(u.Groups, "system:nodes") {
		t.Errorf("the worker authenticates as %q in %v, want system:node:%s in system:nodes", u.Username, u.Groups, node)
	}
	if _, err := os.Stat(filepath.Join(dir, sandbox.NodeKeyFile)); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, sandbox.NodeKeyFile)); fi.Mode().Perm() != 0o600 {
		t.Errorf("node key mode %v, want 0600", fi.Mode().Perm())
	}

	t.Run("patch another Node", func(t *testing.T) {
		patch := []byte(`{"metadata":{"labels":{"attack":"yes"}}}`)
		_, err := worker.CoreV1().Nodes().Patch(ctx, other, types.MergePatchType, patch, metav1.PatchOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("patching Node %s with %s's credential: err = %v, want Forbidden", other, node, err)
		}
		n, err := admin.CoreV1().Nodes().Get(ctx, other, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := n.Labels["attack"]; ok {
			t.Error("the other Node was labelled")
		}
	})

	t.Run("delete a kube-system pod", func(t *testing.T) {
		for _, bound := range []string{"", other} {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, GenerateName: "victim-"},
				Spec:       corev1.PodSpec{NodeName: bound, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
			}
			pod, err := admin.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = admin.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			})
			// NodeRestriction reads pods from an informer and answers
			// NotFound for one it has not seen yet; the pod survives that
			// too, so ask again until the plugin knows it.
			eventually(t, 30*time.Second, "the delete refused", func() error {
				err := worker.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{})
				if apierrors.IsNotFound(err) {
					return err
				}
				if !apierrors.IsForbidden(err) {
					t.Fatalf("deleting kube-system pod %s (bound to %q) with %s's credential: err = %v, want Forbidden", pod.Name, bound, node, err)
				}
				return nil
			})
			got, err := admin.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil || got.DeletionTimestamp != nil {
				t.Errorf("the pod was deleted (%v)", err)
			}
		}
	})

	t.Run("mint a token", func(t *testing.T) {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, GenerateName: "victim-"}}
		sa, err := admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.CoreV1().ServiceAccounts(sa.Namespace).Delete(ctx, sa.Name, metav1.DeleteOptions{}) })
		req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
		if _, err := worker.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name, req, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("a token of kube-system/%s with %s's credential: err = %v, want Forbidden", sa.Name, node, err)
		}
		// Nor a bootstrap token, which would let it ask for any node's
		// certificate.
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "bootstrap-token-attack"},
			Type:       "bootstrap.kubernetes.io/token",
			StringData: map[string]string{"token-id": "attack", "token-secret": "0123456789abcdef", "usage-bootstrap-authentication": "true"},
		}
		if _, err := worker.CoreV1().Secrets(secret.Namespace).Create(ctx, secret, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("a bootstrap token Secret with %s's credential: err = %v, want Forbidden", node, err)
		}
	})

	t.Run("its own Node stays writable", func(t *testing.T) {
		patch := []byte(`{"metadata":{"annotations":{"example.marina.dev/own":"yes"}}}`)
		if _, err := worker.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Errorf("patching its own Node: %v", err)
		}
	})
}

// workerClient is a client with the node credential the agent of dir got by
// TLS bootstrap.
func workerClient(t *testing.T, dir string) kubernetes.Interface {
	t.Helper()
	var certPEM, keyPEM []byte
	eventually(t, 60*time.Second, "the node's certificate in its sandbox", func() error {
		var err error
		if certPEM, keyPEM, err = readNodeCredential(filepath.Join(dir, sandbox.NodeCertFile), filepath.Join(dir, sandbox.NodeKeyFile)); err != nil {
			return fmt.Errorf("no node credential yet: %w", err)
		}
		return nil
	})
	b, err := sandbox.ReadBootstrap(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := nodeRESTConfig(b)
	cfg.CertData, cfg.KeyData = certPEM, keyPEM
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Package nodecsr judges a worker's request for its first node client
// certificate (issue 24: one node, one identity). kube-controller-manager
// approves such a request from any bootstrap token for whatever node name
// it asks, so whoever read a machine's token in the minutes before its Node
// joined could get another node's identity. marina approves instead, and
// only a request that asks for exactly what the machine the token was made
// for registers as: its own Node's client certificate. Renewals, made as the node with the certificate it holds, stay
// kube-controller-manager's (it approves those only for the node's own
// name).
package nodecsr

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"slices"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Reasons on the Approved or Denied condition marina writes.
const (
	ApprovedReason  = "MarinaMachineJoin"
	WrongNodeReason = "NotTheMachinesNode"
	NodeTakenReason = "NodeNameTaken"
	MalformedReason = "NotANodeClientCertificate"
)

// Verdict is marina's answer to one request.
type Verdict struct {
	Approve bool
	// Reason and Message go on the request's condition; neither holds a
	// secret.
	Reason, Message string
}

// allowedUsages are the sets of usages a node client certificate may ask
// for, as kube-controller-manager's own check allows.
var allowedUsages = [][]certificatesv1.KeyUsage{
	{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageClientAuth},
	{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
}

func sameSet(a, b []certificatesv1.KeyUsage) bool {
	for _, u := range a {
		if !slices.Contains(b, u) {
			return false
		}
	}
	for _, u := range b {
		if !slices.Contains(a, u) {
			return false
		}
	}
	return true
}

// Judge answers a request for a kubelet client certificate made with the
// bootstrap token of a machine whose Node registers as node. takenBy, when
// not empty, says a Node of that name exists that is not the machine's
// (its providerID): a Machine named after a node someone else runs (a
// control-plane node of a cluster marina only adds workers to) must not
// get that node's identity. A request after the machine's own Node joined
// is judged the same as before: a stopped machine whose certificate
// expired is handed a fresh token to join again, and whoever could read
// the token could read the node's key beside it anyway.
func Judge(csr *certificatesv1.CertificateSigningRequest, node, takenBy string) Verdict {
	if !slices.Contains(csr.Spec.Groups, "system:bootstrappers") {
		return Verdict{Reason: MalformedReason, Message: "not made with a bootstrap token (the requester is not in system:bootstrappers)"}
	}
	if csr.Spec.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName {
		return Verdict{Reason: MalformedReason, Message: fmt.Sprintf("signer %q, want %s", csr.Spec.SignerName, certificatesv1.KubeAPIServerClientKubeletSignerName)}
	}
	req, err := parse(csr.Spec.Request)
	if err != nil {
		return Verdict{Reason: MalformedReason, Message: err.Error()}
	}
	want := "system:node:" + node
	if req.Subject.CommonName != want {
		return Verdict{Reason: WrongNodeReason, Message: fmt.Sprintf("asks for %q with the bootstrap token of the machine whose Node is %s", req.Subject.CommonName, node)}
	}
	if takenBy != "" {
		return Verdict{Reason: NodeTakenReason, Message: fmt.Sprintf("a Node named %s exists that is not this machine's (its providerID is %q)", node, takenBy)}
	}
	if !slices.Equal(req.Subject.Organization, []string{"system:nodes"}) {
		return Verdict{Reason: MalformedReason, Message: fmt.Sprintf("organizations %v, want [system:nodes]", req.Subject.Organization)}
	}
	if len(req.DNSNames)+len(req.IPAddresses)+len(req.EmailAddresses)+len(req.URIs) > 0 {
		return Verdict{Reason: MalformedReason, Message: "a node client certificate has no subject alternative names"}
	}
	if !slices.ContainsFunc(allowedUsages, func(set []certificatesv1.KeyUsage) bool { return sameSet(set, csr.Spec.Usages) }) {
		return Verdict{Reason: MalformedReason, Message: fmt.Sprintf("usages %v, want digital signature and client auth (and key encipherment)", csr.Spec.Usages)}
	}
	return Verdict{Approve: true, Reason: ApprovedReason, Message: fmt.Sprintf("marina approves the client certificate of node %s, which its Machine registers as", node)}
}

func parse(raw []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(raw)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("the request is not a PEM certificate request")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the certificate request does not parse: %w", err)
	}
	if err := req.CheckSignature(); err != nil {
		return nil, fmt.Errorf("the certificate request's signature does not verify: %w", err)
	}
	return req, nil
}

// Decided reports whether the request was approved or denied already.
func Decided(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied {
			return true
		}
	}
	return false
}

// Apply writes the verdict on the request.
func Apply(ctx context.Context, cs kubernetes.Interface, csr *certificatesv1.CertificateSigningRequest, v Verdict) error {
	csr = csr.DeepCopy()
	t := certificatesv1.CertificateDenied
	if v.Approve {
		t = certificatesv1.CertificateApproved
	}
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: t, Status: corev1.ConditionTrue, Reason: v.Reason, Message: v.Message, LastUpdateTime: metav1.Now(),
	})
	if _, err := cs.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("writing %s on certificate request %s: %w", t, csr.Name, err)
	}
	return nil
}

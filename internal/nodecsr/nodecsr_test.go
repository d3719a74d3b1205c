package nodecsr

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
)

func request(t *testing.T, tmpl x509.CertificateRequest) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

// A request made with a machine's token is approved only when it asks for
// exactly the client certificate of that machine's Node.
func TestJudge(t *testing.T) {
	node := pkix.Name{CommonName: "system:node:w-1", Organization: []string{"system:nodes"}}
	clientUsages := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	for _, tc := range []struct {
		name    string
		subject pkix.Name
		ips     []net.IP
		raw     []byte // instead of a request made from subject
		signer  string
		usages  []certificatesv1.KeyUsage
		groups  []string // instead of a bootstrap token's
		takenBy string
		approve bool
		reason  string
	}{
		{name: "its own node", subject: node, usages: clientUsages, approve: true, reason: ApprovedReason},
		{name: "its own node, with key encipherment", subject: node, usages: append(clientUsages, certificatesv1.UsageKeyEncipherment), approve: true, reason: ApprovedReason},
		{name: "another node", subject: pkix.Name{CommonName: "system:node:w-2", Organization: []string{"system:nodes"}}, usages: clientUsages, reason: WrongNodeReason},
		{name: "a user, not a node", subject: pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}}, usages: clientUsages, reason: WrongNodeReason},
		{name: "its node in system:masters too", subject: pkix.Name{CommonName: "system:node:w-1", Organization: []string{"system:nodes", "system:masters"}}, usages: clientUsages, reason: MalformedReason},
		{name: "its node with an IP address", subject: node, ips: []net.IP{net.ParseIP("10.0.0.1")}, usages: clientUsages, reason: MalformedReason},
		{name: "a serving certificate", subject: node, usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}, reason: MalformedReason},
		{name: "client and server auth", subject: node, usages: append(clientUsages, certificatesv1.UsageServerAuth), reason: MalformedReason},
		{name: "client auth alone", subject: node, usages: []certificatesv1.KeyUsage{certificatesv1.UsageClientAuth}, reason: MalformedReason},
		{name: "its name, held by a Node that is not its", subject: node, usages: clientUsages, takenBy: "aws:///i-0123", reason: NodeTakenReason},
		{name: "not a bootstrap token", subject: node, usages: clientUsages, groups: []string{"system:authenticated"}, reason: MalformedReason},
		{name: "another signer", subject: node, signer: certificatesv1.KubeAPIServerClientSignerName, usages: clientUsages, reason: MalformedReason},
		{name: "not PEM", raw: []byte("nonsense"), usages: clientUsages, reason: MalformedReason},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := tc.raw
			if raw == nil {
				raw = request(t, x509.CertificateRequest{Subject: tc.subject, IPAddresses: tc.ips})
			}
			signer := tc.signer
			if signer == "" {
				signer = certificatesv1.KubeAPIServerClientKubeletSignerName
			}
			groups := tc.groups
			if groups == nil {
				groups = []string{"system:bootstrappers", "system:authenticated"}
			}
			csr := &certificatesv1.CertificateSigningRequest{Spec: certificatesv1.CertificateSigningRequestSpec{
				Request: raw, SignerName: signer, Usages: tc.usages, Username: "system:bootstrap:abcdef", Groups: groups,
			}}
			v := Judge(csr, "w-1", tc.takenBy)
			if v.Approve != tc.approve || v.Reason != tc.reason {
				t.Errorf("Judge = approve %v, reason %s (%s); want approve %v, reason %s", v.Approve, v.Reason, v.Message, tc.approve, tc.reason)
			}
			if v.Message == "" {
				t.Error("the verdict says nothing")
			}
		})
	}
}

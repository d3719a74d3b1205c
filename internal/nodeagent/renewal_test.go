package nodeagent

import (
	"crypto/x509"
	"testing"
	"time"
)

// Issue 22 (finding 7): when a machine renews its certificates. Machines
// made together renew apart (jitter), and none renews a certificate the CA
// would cut at the same end: near the CA's end that would restart every
// machine's components together, ever more often.
func TestRenewalDue(t *testing.T) {
	now := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	twoYears := &x509.Certificate{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(2 * 365 * 24 * time.Hour)}
	oneMinute := &x509.Certificate{NotBefore: now.Add(-6 * time.Second), NotAfter: now.Add(time.Minute)}
	caEnd := now.Add(10 * 365 * 24 * time.Hour)
	for _, tc := range []struct {
		name      string
		cert      *x509.Certificate
		caEnd     time.Time
		jitter    float64
		wantDue   time.Time
		wantWorth bool
	}{
		{"two years, no jitter: 30 days before the end", twoYears, caEnd, 0, twoYears.NotAfter.Add(-30 * 24 * time.Hour), true},
		{"two years, most jitter: up to 10 days later", twoYears, caEnd, 0.999999, twoYears.NotAfter.Add(-20 * 24 * time.Hour), true},
		{"one minute: a third of its life before the end", oneMinute, caEnd, 0, oneMinute.NotAfter.Add(-22 * time.Second), true},
		{"cut by the CA: not renewed", twoYears, twoYears.NotAfter, 0, twoYears.NotAfter.Add(-30 * 24 * time.Hour), false},
		{"the CA ends a few seconds later: not renewed", oneMinute, oneMinute.NotAfter.Add(10 * time.Second), 0, oneMinute.NotAfter.Add(-22 * time.Second), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			due, worth := renewalDue(tc.cert, tc.caEnd, tc.jitter)
			if d := due.Sub(tc.wantDue); d < -time.Second || d > time.Second {
				t.Errorf("due %s, want %s", due, tc.wantDue)
			}
			if worth != tc.wantWorth {
				t.Errorf("worth renewing %t, want %t", worth, tc.wantWorth)
			}
			if !due.Before(tc.cert.NotAfter) {
				t.Errorf("due %s, not before the certificate ends at %s", due, tc.cert.NotAfter)
			}
		})
	}
}

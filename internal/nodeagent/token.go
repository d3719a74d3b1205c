package nodeagent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"marina.dev/marina/internal/nodeagent/sandbox"
)

// bearerToken holds the agent's current token. Requests read it on every
// call, so a renewed token takes effect without rebuilding the client.
type bearerToken struct{ v atomic.Pointer[string] }

func newBearerToken(token string) *bearerToken {
	t := &bearerToken{}
	t.set(token)
	return t
}

func (t *bearerToken) get() string      { return *t.v.Load() }
func (t *bearerToken) set(token string) { t.v.Store(&token) }

// wrap adds the current token to every request.
func (t *bearerToken) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", "Bearer "+t.get())
		return rt.RoundTrip(req)
	})
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// tokenLifetime reads the issue and expiry times from a JWT's claims. The
// signature is not checked: the agent only schedules its own renewal.
func tokenLifetime(token string) (issued, expires time.Time, err error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, time.Time{}, errors.New("token is not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("decoding token claims: %w", err)
	}
	var claims struct {
		IssuedAt  int64 `json:"iat"`
		ExpiresAt int64 `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("decoding token claims: %w", err)
	}
	if claims.ExpiresAt == 0 {
		return time.Time{}, time.Time{}, errors.New("token has no expiry")
	}
	return time.Unix(claims.IssuedAt, 0), time.Unix(claims.ExpiresAt, 0), nil
}

// renewAt is when a token issued at issued and expiring at expires should be
// replaced: past the given fraction of its life, as the kubelet does with
// its own projected tokens.
func renewAt(issued, expires time.Time, fraction float64) time.Time {
	return issued.Add(time.Duration(float64(expires.Sub(issued)) * fraction))
}

// keepToken renews the agent's token before it expires, with a token of the
// same lifetime, and records it in the sandbox so a restarted agent starts
// with it. A token without readable claims is left alone.
func (a *agent) keepToken(ctx context.Context) {
	every(ctx, a.t.tokenCheck, 0.1, func(ctx context.Context) {
		issued, expires, err := tokenLifetime(a.token.get())
		if err != nil {
			a.log.V(2).Info("Not renewing token", "reason", err.Error())
			return
		}
		if time.Now().Before(renewAt(issued, expires, a.t.tokenRenewFraction)) {
			return
		}
		token, err := IssueToken(ctx, a.cs, expires.Sub(issued))
		if err != nil {
			a.log.Error(err, "Renewing token failed, retrying later", "expires", expires)
			return
		}
		a.token.set(token)
		boot := *a.boot
		boot.Token = token
		if err := sandbox.WriteBootstrap(a.dir, &boot); err != nil {
			a.log.Error(err, "Recording renewed token in the sandbox failed")
			return
		}
		a.log.Info("Renewed token")
	})
}

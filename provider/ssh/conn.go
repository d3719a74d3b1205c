package ssh

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// Credentials are what marina logs in to hosts with: read from the
// machine's Secret on every attempt, never logged.
type Credentials struct {
	// Signer is the private key.
	Signer ssh.Signer
	// Known maps a host (as knownhosts.Normalize writes it) to the keys it
	// may show.
	Known map[string][]ssh.PublicKey
	// Source names the Secret, for errors.
	Source string
}

// ParseCredentials reads a private key and a known_hosts document.
func ParseCredentials(privateKey, knownHosts []byte, source string) (*Credentials, error) {
	if len(privateKey) == 0 {
		return nil, fmt.Errorf("Secret %s has no %s: put the private key marina logs in with there", source, PrivateKeyKey)
	}
	signer, err := ssh.ParsePrivateKey(privateKey)
	if err != nil {
		// The parser's error never quotes the key.
		return nil, fmt.Errorf("Secret %s: %s is not a usable unencrypted private key: %w", source, PrivateKeyKey, err)
	}
	known := map[string][]ssh.PublicKey{}
	rest := knownHosts
	for len(bytes.TrimSpace(rest)) > 0 {
		var hosts []string
		var key ssh.PublicKey
		_, hosts, key, _, rest, err = ssh.ParseKnownHosts(rest)
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("Secret %s: %s is not in known_hosts format: %w", source, KnownHostsKey, err)
		}
		for _, h := range hosts {
			n := knownhosts.Normalize(h)
			known[n] = append(known[n], key)
		}
	}
	if len(known) == 0 {
		return nil, fmt.Errorf("Secret %s has no host keys in %s: add each host's key (ssh-keyscan prints them; check them against the host)", source, KnownHostsKey)
	}
	return &Credentials{Signer: signer, Known: known, Source: source}, nil
}

// hostKeyCallback accepts only a key listed for the host.
func (c *Credentials) hostKeyCallback(target string) ssh.HostKeyCallback {
	return func(_ string, _ net.Addr, key ssh.PublicKey) error {
		want, ok := c.Known[knownhosts.Normalize(target)]
		if !ok {
			return &hostKeyError{msg: fmt.Sprintf("%s is not listed in %s of Secret %s (no host is trusted on first use): add its key", target, KnownHostsKey, c.Source)}
		}
		for _, k := range want {
			if bytes.Equal(k.Marshal(), key.Marshal()) {
				return nil
			}
		}
		return &hostKeyError{msg: fmt.Sprintf("%s showed a %s key (%s) that %s of Secret %s does not list for it: the host changed, or it is not the host you meant", target, key.Type(), ssh.FingerprintSHA256(key), KnownHostsKey, c.Source)}
	}
}

type hostKeyError struct{ msg string }

func (e *hostKeyError) Error() string { return e.msg }

// conn is one SSH connection to a host.
type conn struct {
	host   Host
	client *ssh.Client
}

// dialTimeout bounds connecting and the SSH handshake.
const dialTimeout = 10 * time.Second

// dial connects to h and logs in. Its errors say which of the usual causes
// it was: unreachable, an unknown or changed host key, a refused key.
func dial(ctx context.Context, h Host, creds *Credentials) (*conn, error) {
	target := h.target()
	d := net.Dialer{Timeout: dialTimeout}
	nc, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		return nil, fmt.Errorf("host %s is unreachable: %w", target, err)
	}
	_ = nc.SetDeadline(time.Now().Add(dialTimeout))
	cfg := &ssh.ClientConfig{
		User:            h.User,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(creds.Signer)},
		HostKeyCallback: creds.hostKeyCallback(target),
		Timeout:         dialTimeout,
	}
	sc, chans, reqs, err := ssh.NewClientConn(nc, target, cfg)
	if err != nil {
		nc.Close()
		var hk *hostKeyError
		switch {
		case errors.As(err, &hk):
			return nil, fmt.Errorf("host %s: unknown host key: %s", target, hk.msg)
		case strings.Contains(err.Error(), "unable to authenticate"):
			return nil, fmt.Errorf("host %s refused the key of Secret %s for user %s (wrong key, or not in the user's authorized_keys): %w", target, creds.Source, h.User, err)
		default:
			return nil, fmt.Errorf("host %s: SSH handshake failed: %w", target, err)
		}
	}
	_ = nc.SetDeadline(time.Time{})
	return &conn{host: h, client: ssh.NewClient(sc, chans, reqs)}, nil
}

func (c *conn) Close() error { return c.client.Close() }

// run runs cmd through the user's shell with stdin, and returns its
// standard output and its combined output (stdout and stderr as they came,
// for the errors and events that show a person what happened). Only stdout
// is ever parsed: a host's shell start-up files may write to stderr (a
// version manager's warning, a message of the day) and that text must
// never be taken for the command's answer. A non-zero exit is an error
// wrapping *ssh.ExitError.
// When ctx ends the session is closed and run returns at once; the
// command may go on running on the host (nothing signals a command without
// a terminal), which runStep deals with.
func (c *conn) run(ctx context.Context, cmd string, stdin io.Reader) (stdout, combined []byte, err error) {
	s, err := c.client.NewSession()
	if err != nil {
		return nil, nil, fmt.Errorf("host %s: opening a session: %w", c.host.target(), err)
	}
	defer s.Close()
	var out lockedBuffer
	s.Stdout, s.Stderr, s.Stdin = out.stdout(), &out, stdin
	done := make(chan error, 1)
	go func() { done <- s.Run(cmd) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		// Not waiting for Run: sshd closes the channel only once the
		// command's output ends, which a stuck step may never do. Run
		// returns when the caller closes the connection.
		s.Close()
		return out.stdoutBytes(), out.bytes(), ctx.Err()
	}
	return out.stdoutBytes(), out.bytes(), err
}

// lockedBuffer is the output of a command's stdout and stderr, copied in by
// two goroutines: a bytes.Buffer written from both loses output (a
// ReadFrom that reads nothing still truncates the buffer to the length it
// saw when it started).
// Writes to it are stderr; stdout() is the writer for stdout, whose bytes
// go to both buffers.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // stdout and stderr
	out bytes.Buffer // stdout alone
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

type stdoutWriter struct{ b *lockedBuffer }

func (w stdoutWriter) Write(p []byte) (int, error) {
	w.b.mu.Lock()
	defer w.b.mu.Unlock()
	w.b.out.Write(p)
	return w.b.buf.Write(p)
}

func (b *lockedBuffer) stdout() io.Writer { return stdoutWriter{b} }

func (b *lockedBuffer) bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf.Bytes()...)
}

func (b *lockedBuffer) stdoutBytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.out.Bytes()...)
}

// output runs cmd and returns its standard output, or an error with the
// last lines of everything it printed.
func (c *conn) output(ctx context.Context, cmd string) (string, error) {
	stdout, all, err := c.run(ctx, cmd, nil)
	if err != nil {
		return "", fmt.Errorf("host %s: %w: %s", c.host.target(), err, lastLines(all, 5))
	}
	return string(stdout), nil
}

// upload writes r to path on the host with mode, atomically (a temporary
// file renamed into place), so that a copy cut short is never taken for
// the file.
func (c *conn) upload(ctx context.Context, path string, mode uint32, r io.Reader) error {
	tmp := path + ".part"
	cmd := fmt.Sprintf("set -e; umask 077; mkdir -p %s; cat > %s; chmod %o %s; mv -f %s %s",
		shellQuote(dirOf(path)), shellQuote(tmp), mode, shellQuote(tmp), shellQuote(tmp), shellQuote(path))
	_, out, err := c.run(ctx, cmd, r)
	if err != nil {
		return fmt.Errorf("host %s: copying %s: %w: %s", c.host.target(), path, err, lastLines(out, 5))
	}
	return nil
}

func dirOf(path string) string {
	i := strings.LastIndex(path, "/")
	if i <= 0 {
		return "/"
	}
	return path[:i]
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// lastLines returns the last n non-empty lines of out.
func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

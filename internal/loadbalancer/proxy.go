package loadbalancer

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
)

// pair is one proxied connection: the client's and ours to the backend.
type pair struct {
	client, server net.Conn
	backend        *backend
	once           sync.Once
}

func (p *pair) close() {
	p.once.Do(func() {
		p.client.Close()
		p.server.Close()
	})
}

// handle passes one client connection to a healthy backend, trying the
// next one when connecting fails, and refuses it when none is left.
func (b *Balancer) handle(ctx context.Context, client net.Conn) {
	defer b.wg.Done()
	var tried []*backend
	for {
		be := b.pick(tried)
		if be == nil {
			b.log.V(1).Info("No healthy backend, connection refused", "client", client.RemoteAddr().String(), "tried", len(tried))
			refuse(client)
			return
		}
		tried = append(tried, be)
		d := net.Dialer{Timeout: b.dialTimeout}
		server, err := d.DialContext(ctx, "tcp", be.addr)
		if err != nil {
			b.release(be)
			if ctx.Err() != nil {
				client.Close()
				return
			}
			b.log.V(1).Info("Connecting to a backend failed, trying another", "backend", be.addr, "err", err.Error())
			continue
		}
		p := &pair{client: client, server: server, backend: be}
		if err := b.register(p); err != nil {
			b.release(be)
			server.Close()
			if errors.Is(err, errOutOfService) {
				continue
			}
			client.Close()
			return
		}
		p.pipe()
		b.unregister(p)
		return
	}
}

// refuse closes a connection with a reset rather than a clean end, so the
// client fails at once with "connection reset" instead of reading EOF
// mid-handshake.
func refuse(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// pipe copies both ways until both are done. A clean end of one direction
// is passed on as a half-close, as TCP allows; an error in either closes
// both connections, which ends the other direction too.
func (p *pair) pipe() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.copy(p.server, p.client)
	}()
	p.copy(p.client, p.server)
	<-done
	p.close()
}

func (p *pair) copy(dst, src net.Conn) {
	// TCPConn.ReadFrom splices on Linux: the bytes stay in the kernel.
	if _, err := io.Copy(dst, src); err != nil {
		p.close()
		return
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		if err := tc.CloseWrite(); err != nil {
			p.close()
		}
		return
	}
	p.close()
}

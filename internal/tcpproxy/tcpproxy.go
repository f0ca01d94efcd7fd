// Package tcpproxy is a TCP proxy for tests that make a real server
// unreachable for a while without stopping it (the servers on this
// project's machines are shared by every test running at once): Cut resets
// the connections through the proxy, and every new one as it comes, until
// Restore.
//
// It is the project's one such proxy: adapters/sqs/sqstest.Proxy wraps it
// for code outside the module.
package tcpproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// dialTimeout bounds the proxy's dial of its target.
const dialTimeout = 5 * time.Second

// Proxy forwards each connection made to Addr to the target.
type Proxy struct {
	l      net.Listener
	target string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{} // both ends of every forwarded connection
	wg    sync.WaitGroup

	refused atomic.Int64
}

// New starts a proxy to target (host:port) on a free port of 127.0.0.1.
// Close it when done.
func New(target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tcpproxy: %w", err)
	}
	p := &Proxy{l: l, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

// Start is New for a test: it fails t if the proxy cannot start, and
// closes the proxy, with every connection through it, when t ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Cut resets every connection through the proxy (both ends, as a peer
// that went away does); until Restore, a new connection is reset as soon
// as it is accepted, and counted in Refused.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		reset(c)
	}
}

// Restore forwards new connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// Refused is how many connections the proxy reset as they came, while cut.
func (p *Proxy) Refused() int64 { return p.refused.Load() }

// Close stops the proxy, resets its connections and waits for its
// goroutines. Calling it again does nothing more.
func (p *Proxy) Close() error {
	err := p.l.Close()
	p.Cut()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func (p *Proxy) accept() {
	for {
		c, err := p.l.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		p.wg.Go(func() { p.forward(c) })
	}
}

// track registers c, or reports false while the proxy is cut.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

// forget closes cs and unregisters them.
func (p *Proxy) forget(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		c.Close()
	}
}

func (p *Proxy) forward(c net.Conn) {
	if !p.track(c) {
		p.refused.Add(1) // before the reset: a client that saw it sees the count
		reset(c)
		return
	}
	s, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		reset(c) // the target is down: so is the proxy, to the client
		p.forget(c)
		return
	}
	if !p.track(s) { // cut while dialling: Cut reset c
		reset(s)
		p.forget(c)
		return
	}
	// Either direction ending ends both: the protocols proxied (AMQP,
	// HTTP) do not half-close.
	var copies sync.WaitGroup
	copies.Go(func() { _, _ = io.Copy(s, c); p.forget(c, s) })
	copies.Go(func() { _, _ = io.Copy(c, s); p.forget(c, s) })
	copies.Wait()
}

// reset closes c with a TCP reset.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

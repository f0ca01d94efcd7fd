// Package tcpproxy is a TCP proxy for tests that make a real server
// unreachable for a while without stopping it (the servers on this
// project's machines are shared by every test running at once): Cut closes
// the connections through the proxy and refuses new ones until Restore.
package tcpproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards each connection made to Addr to the target.
type Proxy struct {
	l      net.Listener
	target string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// Start starts a proxy to target (host:port) on a free port of 127.0.0.1;
// it is closed, with every connection through it, when t ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{l: l, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Cut closes every connection through the proxy; until Restore, a new
// connection is closed as soon as it is accepted (the client sees EOF, as
// from a server that went away).
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
}

// Restore forwards new connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

func (p *Proxy) close() {
	p.l.Close()
	p.Cut()
	p.wg.Wait()
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

// track registers c, or closes it and reports false while the proxy is cut.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

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
		return
	}
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		p.forget(c)
		return
	}
	if !p.track(s) {
		p.forget(c)
		return
	}
	var copies sync.WaitGroup
	copies.Go(func() { _, _ = io.Copy(s, c); p.forget(c, s) })
	copies.Go(func() { _, _ = io.Copy(c, s); p.forget(c, s) })
	copies.Wait()
}

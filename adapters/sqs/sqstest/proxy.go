package sqstest

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is a TCP proxy on a loopback port in front of an SQS endpoint, for
// outage tests: point a client at Endpoint, then Cut makes the endpoint
// unreachable (every open connection is reset and every new one is reset
// as soon as it is accepted) until Restore.
type Proxy struct {
	ln     net.Listener
	target string // host:port

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{} // both ends of every piped connection
	wg    sync.WaitGroup

	refused atomic.Int64
}

// NewProxy starts a proxy to endpoint ("http://127.0.0.1:9324"). Close it
// when done.
func NewProxy(endpoint string) (*Proxy, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("sqstest: proxy to %q: want http://host:port", endpoint)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("sqstest: proxy: %w", err)
	}
	p := &Proxy{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Endpoint is the proxy's endpoint, to use instead of the one it fronts.
func (p *Proxy) Endpoint() string { return "http://" + p.ln.Addr().String() }

// Cut resets every connection through the proxy and resets the new ones
// until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		reset(c)
	}
}

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Refused is how many connections the proxy reset as they came, while cut.
func (p *Proxy) Refused() int64 { return p.refused.Load() }

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			p.refused.Add(1)
			reset(c)
			continue
		}
		p.wg.Add(1)
		go p.pipe(c)
	}
}

// track adds c to the connections Cut resets, unless the proxy is cut.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) pipe(c net.Conn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil || !p.track(up) {
		if up != nil {
			reset(up)
		}
		reset(c)
		p.untrack(c)
		return
	}
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		done <- struct{}{}
	}
	go cp(up, c)
	go cp(c, up)
	// HTTP does not half-close: once one side is done, so is the other.
	<-done
	c.Close()
	up.Close()
	<-done
	p.untrack(c)
	p.untrack(up)
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// reset closes c with a TCP reset, as a peer that went away does.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

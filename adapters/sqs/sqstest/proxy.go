package sqstest

import (
	"fmt"
	"net/url"

	"github.com/ackwise/ackwise/internal/tcpproxy"
)

// Proxy is a TCP proxy on a loopback port in front of an SQS endpoint, for
// outage tests: point a client at Endpoint, then Cut makes the endpoint
// unreachable (every open connection is reset and every new one is reset
// as soon as it is accepted) until Restore.
type Proxy struct {
	p *tcpproxy.Proxy
}

// NewProxy starts a proxy to endpoint ("http://127.0.0.1:9324"). Close it
// when done.
func NewProxy(endpoint string) (*Proxy, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("sqstest: proxy to %q: want http://host:port", endpoint)
	}
	p, err := tcpproxy.New(u.Host)
	if err != nil {
		return nil, fmt.Errorf("sqstest: proxy: %w", err)
	}
	return &Proxy{p: p}, nil
}

// Endpoint is the proxy's endpoint, to use instead of the one it fronts.
func (p *Proxy) Endpoint() string { return "http://" + p.p.Addr() }

// Cut resets every connection through the proxy and resets the new ones
// until Restore.
func (p *Proxy) Cut() { p.p.Cut() }

// Restore lets connections through again.
func (p *Proxy) Restore() { p.p.Restore() }

// Refused is how many connections the proxy reset as they came, while cut.
func (p *Proxy) Refused() int64 { return p.p.Refused() }

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() error { return p.p.Close() }

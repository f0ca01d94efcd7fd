package rabbitmq

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
)

// gateProxy forwards TCP connections to the test broker. While held, what
// the broker sends (publisher confirms among it) waits in the proxy; what
// the client sends goes through. It closes everything when the test ends.
type gateProxy struct {
	mu   sync.Mutex
	open chan struct{} // closed while the gate is open
	l    net.Listener
}

// proxyListener listens for a test proxy in front of the test broker, and
// returns the listener (closed when the test ends), the broker's address
// and the URL that dials the proxy instead.
func proxyListener(t *testing.T) (l net.Listener, broker, proxyURL string) {
	t.Helper()
	u, err := url.Parse(testURL())
	if err != nil {
		t.Fatal(err)
	}
	l, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	broker = u.Host
	u.Host = l.Addr().String()
	return l, broker, u.String()
}

func newGateProxy(t *testing.T) (*gateProxy, string) {
	t.Helper()
	l, broker, proxyURL := proxyListener(t)
	g := &gateProxy{open: make(chan struct{}), l: l}
	close(g.open)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", broker)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, b)
			mu.Unlock()
			go func() { _, _ = io.Copy(b, c); b.Close() }()
			go func() {
				buf := make([]byte, 32<<10)
				for {
					n, err := b.Read(buf)
					if n > 0 {
						g.mu.Lock()
						open := g.open
						g.mu.Unlock()
						<-open
						if _, werr := c.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		g.release()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return g, proxyURL
}

// hold stops what the broker sends from reaching the clients.
func (g *gateProxy) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default:
	}
}

// refuse closes the proxy's listener: dialling it is refused from now on.
func (g *gateProxy) refuse() { g.l.Close() }

// release lets it through again.
func (g *gateProxy) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// pendingConfirms is how many publishes of p wait for their confirm.
func (p *publisher) pendingConfirms() int {
	p.mu.Lock()
	s := p.cur
	p.mu.Unlock()
	if s == nil {
		return 0
	}
	s.pendMu.Lock()
	defer s.pendMu.Unlock()
	return len(s.pending)
}

// waitFor polls cond until it holds, failing the test after testTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCloseWaitsForMovesInFlight: a Nack whose copy is published but not
// yet confirmed when Close runs (the engine's drain timeout passed, say)
// must still ack the original once the copy is confirmed. Before, Close
// killed the consumer channel first and only then waited for the confirm:
// the Nack's ack found its channel dead, the broker requeued the original,
// and the copy sat in the wait queue too: a duplicate.
func TestCloseWaitsForMovesInFlight(t *testing.T) {
	c := needBroker(t)
	gate, proxyURL := newGateProxy(t)
	cfg := testConfig(t, Classic, time.Minute)
	declare(t, cfg)
	sink := newSink(t, SinkConfig{URL: testURL(), RoutingKey: cfg.Queue})
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "m", Payload: []byte("m")}); err != nil {
		t.Fatal(err)
	}
	cfg.URL = proxyURL
	src := newSource(t, cfg)
	m := receive(t, src)

	// The copy reaches the broker; its confirm waits in the proxy.
	gate.hold()
	nacked := make(chan error, 1)
	go func() { nacked <- src.Nack(ctxT(t), m, time.Minute) }()
	waitFor(t, "the copy to be published", func() bool { return src.pub.pendingConfirms() > 0 })

	closed := make(chan struct{})
	go func() { src.Close(); close(closed) }()
	ss := m.Handle.(*receipt).s
	waitFor(t, "Close to wait for the move or kill the channel", func() bool {
		return ss.isDead.Load() || src.waitingForMoves()
	})
	gate.release()
	<-closed

	if err := <-nacked; err != nil {
		t.Errorf("Nack across Close: %v, want the original acked after its copy was confirmed", err)
	}
	if n := queueDepth(t, c, cfg.Queue); n != 0 {
		t.Errorf("work queue holds %d messages after Close: the original was requeued beside its copy (a duplicate)", n)
	}
	v, err := cfg.validate()
	if err != nil {
		t.Fatal(err)
	}
	if n := queueDepth(t, c, v.waitQueues[0]); n != 1 {
		t.Errorf("wait queue holds %d messages, want the copy", n)
	}
}

// waitingForMoves reports whether Close waits for moves in flight.
func (s *Source) waitingForMoves() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.movesIdle != nil
}

package rabbitmq

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
)

// resetProxy forwards TCP connections to the test broker. While resetting
// is set, a new connection is forwarded until the client sends its
// credentials (connection.start-ok), which the proxy keeps from the broker
// and answers by resetting the connection: what a client sees of a broker
// restarting mid-handshake. Each such reset is sent on resets.
type resetProxy struct {
	mu        sync.Mutex
	resetting bool
	conns     []net.Conn
	resets    chan struct{}
}

func newResetProxy(t *testing.T) (*resetProxy, string) {
	t.Helper()
	l, broker, proxyURL := proxyListener(t)
	p := &resetProxy{resets: make(chan struct{}, 64)}
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
			p.mu.Lock()
			resetting := p.resetting
			p.conns = append(p.conns, c, b)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(c, b); c.Close() }()
			go func() {
				defer b.Close()
				if !resetting {
					_, _ = io.Copy(b, c)
					return
				}
				header := make([]byte, 8) // "AMQP\x00\x00\x09\x01"
				if _, err := io.ReadFull(c, header); err != nil {
					return
				}
				if _, err := b.Write(header); err != nil {
					return
				}
				// The client answers the broker's connection.start with
				// start-ok: its frame header is enough.
				if _, err := io.ReadFull(c, make([]byte, 7)); err != nil {
					return
				}
				_ = c.(*net.TCPConn).SetLinger(0) // close with RST
				c.Close()
				select {
				case p.resets <- struct{}{}:
				default: // nobody counts any more
				}
			}()
		}
	}()
	t.Cleanup(p.closeAll)
	return p, proxyURL
}

// setResetting switches between forwarding and resetting new connections.
func (p *resetProxy) setResetting(r bool) {
	p.mu.Lock()
	p.resetting = r
	p.mu.Unlock()
}

// closeAll closes every connection the proxy holds.
func (p *resetProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestPublisherHandshakeResetIsNotRefusal: amqp091-go reports a connection
// reset after the client sent its credentials as ErrCredentials, the 403
// it also reports for a broker refusing a login by closing the socket.
// refusedForGood took it for a refusal for good, so while a broker
// restarted (resetting handshakes in flight), Publish failed at once,
// permanently: producer.Publisher stopped retrying, and a handler
// publishing with the sink had its message dead-lettered for an outage.
// Only a connection.close the broker sends is a refusal (the sink asks
// RabbitMQ for one with authentication_failure_close); a publish during
// the resets waits, and goes through once the broker answers again.
func TestPublisherHandshakeResetIsNotRefusal(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	proxy, proxied := newResetProxy(t)
	sink := newSink(t, SinkConfig{URL: proxied, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName,
		ReconnectInitialInterval: 20 * time.Millisecond, ReconnectMaxInterval: 50 * time.Millisecond})
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "before"}); err != nil {
		t.Fatal(err)
	}

	proxy.setResetting(true)
	proxy.closeAll()
	// The third reset means two attempts' failures were handled (the
	// reconnect loop tries one at a time), the last two in a row resets.
	wait := ctxT(t)
	for range 3 {
		select {
		case <-proxy.resets:
		case <-wait.Done():
			t.Fatal("the sink did not try to reconnect")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := sink.Publish(ctx, &ackwise.Message{ID: "during"})
	if cl := ackwise.ClassOf(err); err == nil || cl == ackwise.ClassPermanent || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish while handshakes are reset: %v (class %v), want its ctx's deadline, transient", err, cl)
	}

	proxy.setResetting(false)
	ctx = ctxT(t)
	for {
		err := sink.Publish(ctx, &ackwise.Message{ID: "after"})
		if err == nil {
			break
		}
		if cl := ackwise.ClassOf(err); cl == ackwise.ClassPermanent || ctx.Err() != nil {
			t.Fatalf("no publish once the broker answers again: %v (class %v)", err, cl)
		}
	}
	if n := queueDepth(t, c, cfg.Queue); n != 2 {
		t.Fatalf("queue holds %d messages, want before and after", n)
	}
}

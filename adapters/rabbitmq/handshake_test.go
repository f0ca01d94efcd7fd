package rabbitmq

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
)

// handshakeFault is what handshakeProxy does to a new connection once the
// client sends its credentials (connection.start-ok).
type handshakeFault int

const (
	// forward: nothing, the connection is forwarded to the broker.
	forward handshakeFault = iota
	// stallHandshake: the proxy plays connection.start itself and never
	// answers start-ok, holding the connection open without a word: a
	// broker too busy to answer, never a refusal.
	stallHandshake
	// resetHandshake: forwarded until start-ok, which the proxy keeps from
	// the broker and answers by resetting the connection: a broker
	// restarting mid-handshake.
	resetHandshake
)

// handshakeProxy forwards TCP connections to the test broker, or fails
// their handshakes with its fault. Each connection failed is sent on
// faulted.
type handshakeProxy struct {
	mu      sync.Mutex
	fault   handshakeFault
	conns   []net.Conn
	faulted chan struct{}
}

func newHandshakeProxy(t *testing.T) (*handshakeProxy, string) {
	t.Helper()
	l, broker, proxyURL := proxyListener(t)
	p := &handshakeProxy{faulted: make(chan struct{}, 64)}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			fault := p.fault
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			if fault == stallHandshake {
				go p.stallAfterStartOk(c)
				continue
			}
			b, err := net.Dial("tcp", broker)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, b)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(c, b); c.Close() }()
			go func() {
				defer b.Close()
				if fault == resetHandshake {
					p.resetAtStartOk(c, b)
					return
				}
				_, _ = io.Copy(b, c)
			}()
		}
	}()
	t.Cleanup(p.closeAll)
	return p, proxyURL
}

// setFault sets what happens to the handshakes of new connections.
func (p *handshakeProxy) setFault(f handshakeFault) {
	p.mu.Lock()
	p.fault = f
	p.mu.Unlock()
}

// closeAll closes every connection the proxy holds.
func (p *handshakeProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *handshakeProxy) signal() {
	select {
	case p.faulted <- struct{}{}:
	default: // nobody counts any more
	}
}

// resetAtStartOk forwards the client's protocol header to the broker b,
// then resets c once the client sends start-ok.
func (p *handshakeProxy) resetAtStartOk(c, b net.Conn) {
	header := make([]byte, 8) // "AMQP\x00\x00\x09\x01"
	if _, err := io.ReadFull(c, header); err != nil {
		return
	}
	if _, err := b.Write(header); err != nil {
		return
	}
	// The client answers the broker's connection.start with start-ok: its
	// frame header is enough.
	if _, err := io.ReadFull(c, make([]byte, 7)); err != nil {
		return
	}
	_ = c.(*net.TCPConn).SetLinger(0) // close with RST
	c.Close()
	p.signal()
}

// stallAfterStartOk plays connection.start to c and never answers the
// client's start-ok; closeAll closes c.
func (p *handshakeProxy) stallAfterStartOk(c net.Conn) {
	header := make([]byte, 8) // "AMQP\x00\x00\x09\x01"
	if _, err := io.ReadFull(c, header); err != nil {
		c.Close()
		return
	}
	// connection.start: version 0-9, no server properties, PLAIN, en_US.
	var payload []byte
	payload = binary.BigEndian.AppendUint16(payload, 10)
	payload = binary.BigEndian.AppendUint16(payload, 10)
	payload = append(payload, 0, 9)
	payload = binary.BigEndian.AppendUint32(payload, 0)
	for _, s := range []string{"PLAIN", "en_US"} {
		payload = binary.BigEndian.AppendUint32(payload, uint32(len(s)))
		payload = append(payload, s...)
	}
	frame := []byte{1, 0, 0}
	frame = binary.BigEndian.AppendUint32(frame, uint32(len(payload)))
	frame = append(append(frame, payload...), 0xCE)
	if _, err := c.Write(frame); err != nil {
		c.Close()
		return
	}
	if _, err := c.Read(make([]byte, 1)); err != nil { // start-ok began
		c.Close()
		return
	}
	p.signal()
}

// publishThroughHandshakeFault publishes through the sink while every
// reconnection's handshake meets fault: after faulted handshakes (the
// reconnect loop tries one at a time, so all but the last were handled), a
// publish must wait for its ctx, transient, not fail permanently; once the
// proxy forwards again, publishing goes on, and the queue holds what was
// published before and after.
func publishThroughHandshakeFault(t *testing.T, fault handshakeFault, faulted int) {
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	proxy, proxied := newHandshakeProxy(t)
	sink := newSink(t, SinkConfig{URL: proxied, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName,
		ReconnectInitialInterval: 20 * time.Millisecond, ReconnectMaxInterval: 50 * time.Millisecond})
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "before"}); err != nil {
		t.Fatal(err)
	}

	proxy.setFault(fault)
	proxy.closeAll()
	wait, cancelWait := context.WithTimeout(context.Background(), 2*DefaultDialTimeout)
	defer cancelWait()
	for range faulted {
		select {
		case <-proxy.faulted:
		case <-wait.Done():
			t.Fatal("the sink did not try to reconnect")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := sink.Publish(ctx, &ackwise.Message{ID: "during"})
	if cl := ackwise.ClassOf(err); err == nil || cl == ackwise.ClassPermanent || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish while handshakes fail: %v (class %v), want its ctx's deadline, transient", err, cl)
	}

	// Healed: the failed attempts are closed and the next one goes
	// through.
	proxy.setFault(forward)
	proxy.closeAll()
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

// TestPublisherHandshakeTimeoutIsNotRefusal: amqp091-go reports any failure
// to read the answer to connection.start-ok as ErrCredentials, a 403,
// because a broker may refuse a login by closing the socket without a
// word. refusedForGood took a handshake that ran out of time
// (DefaultDialTimeout, 30s: this test takes that long) for a refusal, so a
// broker too busy to answer one reconnection made Publish fail at once,
// permanently: producer.Publisher stopped retrying, and a handler
// publishing with the sink had its message dead-lettered for an outage.
func TestPublisherHandshakeTimeoutIsNotRefusal(t *testing.T) {
	t.Parallel()
	publishThroughHandshakeFault(t, stallHandshake, 2)
}

// TestPublisherHandshakeResetIsNotRefusal: amqp091-go reports a connection
// reset after the client sent its credentials as ErrCredentials, the 403
// it also reports for a broker refusing a login by closing the socket.
// refusedForGood took it for a refusal for good, so while a broker
// restarted (resetting handshakes in flight), Publish failed at once,
// permanently. Only a connection.close the broker sends is a refusal (the
// sink asks RabbitMQ for one with authentication_failure_close).
func TestPublisherHandshakeResetIsNotRefusal(t *testing.T) {
	t.Parallel()
	publishThroughHandshakeFault(t, resetHandshake, 3)
}

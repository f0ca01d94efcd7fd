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

// stallProxy forwards TCP connections to the test broker until cut is set;
// from then on it plays the broker's first handshake step itself
// (connection.start) and then stalls once the client answers
// (connection.start-ok), holding the connection open without a word: a
// broker too busy to answer, never a refusal. Each such stall is sent on
// cuts.
type stallProxy struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
	cuts  chan struct{}
}

func newStallProxy(t *testing.T) (*stallProxy, string) {
	t.Helper()
	l, broker, proxyURL := proxyListener(t)
	p := &stallProxy{cuts: make(chan struct{}, 64)}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			cut := p.cut
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			if cut {
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
			go func() { _, _ = io.Copy(b, c); b.Close() }()
			go func() { _, _ = io.Copy(c, b); c.Close() }()
		}
	}()
	t.Cleanup(p.closeAll)
	return p, proxyURL
}

// setCut switches between forwarding and cutting new connections.
func (p *stallProxy) setCut(cut bool) {
	p.mu.Lock()
	p.cut = cut
	p.mu.Unlock()
}

// closeAll closes every connection the proxy holds.
func (p *stallProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *stallProxy) stallAfterStartOk(c net.Conn) {
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
	select {
	case p.cuts <- struct{}{}:
	default: // nobody counts any more
	}
	// Never answer; closeAll closes c.
}

// TestPublisherHandshakeTimeoutIsNotRefusal: amqp091-go reports any failure
// to read the answer to connection.start-ok as ErrCredentials, a 403,
// because a broker may refuse a login by closing the socket without a
// word. refusedForGood took a handshake that ran out of
// time (DefaultDialTimeout, 30s: this test takes that long) for a refusal,
// so a broker too busy to answer one reconnection made Publish fail at
// once, permanently: producer.Publisher stopped retrying, and a handler
// publishing with the sink had its message dead-lettered for an outage.
func TestPublisherHandshakeTimeoutIsNotRefusal(t *testing.T) {
	t.Parallel()
	needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	proxy, proxied := newStallProxy(t)
	sink := newSink(t, SinkConfig{URL: proxied, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName,
		ReconnectInitialInterval: 20 * time.Millisecond, ReconnectMaxInterval: 50 * time.Millisecond})
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "before"}); err != nil {
		t.Fatal(err)
	}

	proxy.setCut(true)
	proxy.closeAll()
	// The second stalled handshake means the first attempt's failure was
	// handled (the reconnect loop tries one at a time).
	wait, cancelWait := context.WithTimeout(context.Background(), 2*DefaultDialTimeout)
	defer cancelWait()
	for range 2 {
		select {
		case <-proxy.cuts:
		case <-wait.Done():
			t.Fatal("the sink did not try to reconnect")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := sink.Publish(ctx, &ackwise.Message{ID: "during"})
	if cl := ackwise.ClassOf(err); err == nil || cl == ackwise.ClassPermanent || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish after a reconnection attempt timed out: %v (class %v), want its ctx's deadline, transient", err, cl)
	}

	// Healed: the stalled attempt is closed (no refusal either: the broker
	// sent no connection.close) and the next one goes through.
	proxy.setCut(false)
	proxy.closeAll()
	ctx = ctxT(t)
	for {
		err := sink.Publish(ctx, &ackwise.Message{ID: "after"})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no publish once the broker answers again: %v", err)
		}
	}
}

package rabbitmq

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// logRecorder is a slog.Handler that keeps every record.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// matching returns the records whose message contains s.
func (l *logRecorder) matching(s string) []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []slog.Record
	for _, r := range l.recs {
		if strings.Contains(r.Message, s) {
			out = append(out, r)
		}
	}
	return out
}

// attr returns the value of r's attribute key.
func attr(r slog.Record, key string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// nested returns a header value of depth tables, one inside the other.
func nested(depth int) any {
	var v any = "leaf"
	for range depth {
		v = amqp.Table{"n": v}
	}
	return v
}

// A delivery whose header table amqp091-go refuses to read (nested 40
// levels deep; it reads 32) used to close the consumer's connection each
// time it was delivered: the broker redelivered it and every message
// prefetched with it forever, and on a quorum queue each close added to
// the x-delivery-count of every message in flight, so one that failed once
// went to the dead-letter queue for max-attempts, again at every close. Now
// the poison costs nothing: it is delivered with the unreadable entry as
// its encoded bytes and named in ackwise-unreadable-headers, with a warning
// naming the cause; every other message is handled as usual, once (or
// twice, for one failing once), none dead-lettered, and the connection
// never closes.
func TestUnreadableHeaderTableCostsNoConsumer(t *testing.T) {
	t.Parallel()
	for _, qt := range []QueueType{Classic, Quorum} {
		t.Run(string(qt), func(t *testing.T) {
			t.Parallel()
			c := needBroker(t)
			cfg := testConfig(t, qt, 200*time.Millisecond)
			logs := &logRecorder{}
			cfg.Logger = slog.New(logs)
			declare(t, cfg)
			v, err := cfg.validate()
			if err != nil {
				t.Fatal(err)
			}

			// 10 honest messages, the poison, 10 more; every third honest
			// one fails once (transiently) before it succeeds.
			var ids []string
			for i := range 21 {
				id := fmt.Sprintf("honest-%02d", i)
				p := amqp.Publishing{MessageId: id, Headers: amqp.Table{ackwise.HeaderEventID: id, "x-tenant": "acme"}, Body: []byte(id)}
				if i == 10 {
					id = "poison"
					p = amqp.Publishing{MessageId: id, Headers: amqp.Table{ackwise.HeaderEventID: id, "deep": nested(40), "x-tenant": "acme"}, Body: []byte("poison body")}
				}
				ids = append(ids, id)
				rawPublish(t, c, cfg.Queue, p)
			}
			// The client library itself cannot read the poison: the
			// witness that the test sends what it means to.
			requireUnreadableByClient(t, c, amqp.Table{"deep": nested(40)})

			var mu sync.Mutex
			runs := map[string]int{}
			var poison *ackwise.Message
			all := make(chan struct{})
			closeAll := sync.OnceFunc(func() { close(all) })
			h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
				mu.Lock()
				defer mu.Unlock()
				runs[m.ID]++
				if m.ID == "poison" {
					poison = &ackwise.Message{ID: m.ID, Payload: append([]byte(nil), m.Payload...), Headers: m.Headers.Clone()}
				}
				var n int
				if strings.HasSuffix(m.ID, "0") || strings.HasSuffix(m.ID, "3") || strings.HasSuffix(m.ID, "6") {
					n = 1 // fails once
				}
				if runs[m.ID] <= n {
					return errors.New("flaky dependency")
				}
				if allSucceeded(runs, ids) {
					closeAll()
				}
				return nil
			})
			src := &movesSeen{Source: newSource(t, cfg), errs: make(chan error, 1024)}
			stop := runEngine(t, src, h, consumer.Config{
				RetryMode: consumer.RetryBroker,
				Retry:     retry.Policy{MaxAttempts: 3, Tiers: []time.Duration{200 * time.Millisecond}},
				Logger:    slog.New(logs),
			})
			select {
			case <-all:
			case <-time.After(3 * testTimeout):
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("not every message was handled: runs %v; %d connection losses logged", runs, len(logs.matching("channel lost")))
			}
			if err, _ := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			src.Close()

			mu.Lock()
			defer mu.Unlock()
			for _, id := range ids {
				want := 1
				if strings.HasSuffix(id, "0") || strings.HasSuffix(id, "3") || strings.HasSuffix(id, "6") {
					want = 2
				}
				if runs[id] != want {
					t.Errorf("%s handled %d times, want %d", id, runs[id], want)
				}
			}
			if poison == nil {
				t.Fatal("the poison was never handed to the handler")
			}
			if string(poison.Payload) != "poison body" || poison.Headers.Get("x-tenant") != "acme" {
				t.Errorf("poison delivered as payload %q, headers %v", poison.Payload, poison.Headers)
			}
			var names []string
			if err := json.Unmarshal([]byte(poison.Headers.Get(HeaderUnreadable)), &names); err != nil || len(names) != 1 || names[0] != "deep" {
				t.Errorf("poison's %s = %q, want [\"deep\"]", HeaderUnreadable, poison.Headers.Get(HeaderUnreadable))
			}
			warns := logs.matching("header table")
			if len(warns) == 0 || !strings.Contains(attr(warns[0], "reason"), "nested deeper than 32") || attr(warns[0], "message_id") != "poison" {
				t.Errorf("no warning naming the unreadable header and its cause: %v", warns)
			}
			if lost := logs.matching("channel lost"); len(lost) > 0 {
				t.Errorf("%d connection losses; the first: %v", len(lost), lost[0])
			}
			if dls := getAll(t, c, v.DeadLetterQueue); len(dls) != 0 {
				t.Errorf("%d messages dead-lettered, want none; the first: %v", len(dls), dls[0].Headers)
			}
			if n := queueDepth(t, c, cfg.Queue); n != 0 {
				t.Errorf("%d messages left in the work queue", n)
			}
		})
	}
}

func allSucceeded(runs map[string]int, ids []string) bool {
	for _, id := range ids {
		n := 1
		if strings.HasSuffix(id, "0") || strings.HasSuffix(id, "3") || strings.HasSuffix(id, "6") {
			n = 2
		}
		if runs[id] < n {
			return false
		}
	}
	return true
}

// requireUnreadableByClient checks, on a queue of its own, that a plain
// amqp091-go client loses its connection to a message with headers h: the
// witness that a test sends what it means to.
func requireUnreadableByClient(t *testing.T, c *amqp.Connection, h amqp.Table) {
	t.Helper()
	q := "ackwise-test-witness-" + randSuffix()
	if err := withChannel(c, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(q, false, false, false, false, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer deleteQueue(t, c, q)
	rawPublish(t, c, q, amqp.Publishing{Headers: h, Body: []byte("x")})
	pc, err := amqp.Dial(testURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	closes := pc.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := pc.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ch.Get(q, true); err == nil || ok {
		t.Fatalf("a plain client read the message (%v, %v): the test sends nothing it cannot read", ok, err)
	}
	select {
	case e := <-closes:
		if e == nil || e.Code != amqp.FrameError || e.Server {
			t.Fatalf("plain client's connection closed with %v, want its own frame error", e)
		}
	case <-time.After(testTimeout):
		t.Fatal("the plain client's connection stayed open")
	}
}

// tlsProxy terminates TLS in front of the test broker with a self-signed
// certificate for 127.0.0.1 and returns the amqps:// URL that dials it and
// a TLS config that trusts it.
func tlsProxy(t *testing.T) (string, *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "ackwise test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	l, broker, proxyURL := proxyListener(t)
	tl := tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12})
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", broker)
			if err != nil {
				c.Close()
				continue
			}
			go func() { _, _ = io.Copy(b, c); b.Close() }()
			go func() { _, _ = io.Copy(c, b); c.Close() }()
		}
	}()
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return strings.Replace(proxyURL, "amqp://", "amqps://", 1), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// Over TLS the filter reads the frames in clear: a source on an amqps://
// URL reads a delivery with a header table amqp091-go cannot read, and
// the connection stays up. (amqp091-go used to do the TLS itself, around
// the socket the adapter dialled: a filter there would have seen only
// ciphertext.)
func TestUnreadableHeaderOverTLS(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	rawPublish(t, c, cfg.Queue, amqp.Publishing{MessageId: "poison", Headers: amqp.Table{"deep": nested(40)}, Body: []byte("p")})
	rawPublish(t, c, cfg.Queue, amqp.Publishing{MessageId: "after", Body: []byte("a")})
	cfg.URL, cfg.TLS = tlsProxy(t)
	logs := &logRecorder{}
	cfg.Logger = slog.New(logs)
	src := newSource(t, cfg)
	for _, want := range []string{"poison", "after"} {
		m := receive(t, src)
		if m.ID != want || (want == "poison" && m.Headers.Get(HeaderUnreadable) != `["deep"]`) {
			t.Fatalf("received %q with %s = %q, want %q", m.ID, HeaderUnreadable, m.Headers.Get(HeaderUnreadable), want)
		}
		if err := src.Ack(ctxT(t), m); err != nil {
			t.Fatal(err)
		}
	}
	if lost := logs.matching("channel lost"); len(lost) > 0 {
		t.Fatalf("connection lost: %v", lost[0])
	}
}

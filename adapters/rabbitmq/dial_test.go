package rabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// silentListener accepts TCP connections and never answers: a broker that
// hangs in the AMQP handshake (or a port that is not AMQP at all). It
// closes everything when the test ends.
func silentListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// TestDialHonoursContextDuringHandshake: ctx bounds the whole connection
// attempt, the AMQP handshake included, not only the TCP connect.
func TestDialHonoursContextDuringHandshake(t *testing.T) {
	t.Parallel()
	addr := silentListener(t)
	url := "amqp://guest:hush-secret@" + addr + "/"
	for name, open := range map[string]func(context.Context) error{
		"source": func(ctx context.Context) error {
			_, err := NewSource(ctx, Config{URL: url, Queue: "q"})
			return err
		},
		"sink": func(ctx context.Context) error {
			_, err := NewSink(ctx, SinkConfig{URL: url, RoutingKey: "q"})
			return err
		},
		"declare": func(ctx context.Context) error {
			return Declare(ctx, Config{URL: url, Queue: "q"})
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := open(ctx)
			// Far below DefaultDialTimeout (30s), which bounded it before.
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("returned after %v; ctx expired after 200ms", took)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v, want one wrapping context.DeadlineExceeded", err)
			}
			if err != nil && strings.Contains(err.Error(), "hush-secret") {
				t.Errorf("error leaks the password: %v", err)
			}
		})
	}
}

// TestTLSConfigNeedsAMQPS: a TLS config with an amqp:// URL would be
// ignored by the client and the credentials sent in clear text.
func TestTLSConfigNeedsAMQPS(t *testing.T) {
	t.Parallel()
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	_, err := Config{URL: "amqp://guest:t0psecret@localhost/", Queue: "q", TLS: tc}.validate()
	if err == nil || !strings.Contains(err.Error(), "TLS") || !strings.Contains(err.Error(), "amqps") {
		t.Errorf("source: TLS with amqp://: %v, want an error naming TLS and amqps", err)
	}
	_, err = SinkConfig{URL: "amqp://guest:t0psecret@localhost/", RoutingKey: "q", TLS: tc}.validate()
	if err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Errorf("sink: TLS with amqp://: %v, want an error", err)
	}
	if err != nil && strings.Contains(err.Error(), "t0psecret") {
		t.Errorf("error leaks the password: %v", err)
	}
	if _, err := (Config{URL: "amqps://guest:t0psecret@localhost/", Queue: "q", TLS: tc}).validate(); err != nil {
		t.Errorf("TLS with amqps://: %v", err)
	}
}

// TestDialDoesNotWriteCallersTLSConfig: amqp091-go fills in ServerName on
// the tls.Config it is given; with the caller's own config that is a data
// race between connections dialling at once (a source's consumer and mover
// reconnecting together) and a surprise for the caller.
func TestDialDoesNotWriteCallersTLSConfig(t *testing.T) {
	t.Parallel()
	addr := silentListener(t)
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = NewSink(ctx, SinkConfig{URL: "amqps://guest:guest@" + addr + "/", RoutingKey: "q", TLS: tc})
		}()
	}
	wg.Wait()
	if tc.ServerName != "" {
		t.Fatalf("caller's tls.Config modified: ServerName = %q", tc.ServerName)
	}
}

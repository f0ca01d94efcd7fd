package rabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"
)

// dial opens one AMQP connection. ctx bounds the whole attempt: the TCP
// connect, the TLS handshake and the AMQP handshake (each also at most
// DefaultDialTimeout). amqp091-go's own automatic recovery stays off:
// ackwise owns recovery so that delivery tags of a dead channel are never
// used on a new one.
func (c conn) dial(ctx context.Context) (*amqp.Connection, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("rabbitmq: connect to %s: %w", c.redacted, err)
	}
	// The socket being dialled, so that ctx can cut its handshake short.
	var mu sync.Mutex
	var socket *readErrConn
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if socket != nil {
			_ = socket.SetDeadline(time.Unix(1, 0)) // in the past: fail pending reads and writes
		}
	})
	defer stop()
	cfg := amqp.Config{
		Heartbeat:       c.heartbeat,
		TLSClientConfig: c.tls.Clone(), // amqp091-go writes ServerName into it
		Properties:      amqp.NewConnectionProperties(),
		Dial: func(network, addr string) (net.Conn, error) {
			dctx, cancel := context.WithTimeout(ctx, DefaultDialTimeout)
			defer cancel()
			var d net.Dialer
			nc, err := d.DialContext(dctx, network, addr)
			if err != nil {
				return nil, err
			}
			// The deadline covers the AMQP handshake; amqp091-go clears it
			// once the connection is open.
			if err := nc.SetDeadline(time.Now().Add(DefaultDialTimeout)); err != nil {
				nc.Close()
				return nil, err
			}
			rc := &readErrConn{Conn: nc}
			mu.Lock()
			socket = rc
			mu.Unlock()
			if ctx.Err() != nil { // cancelled before the socket was known
				nc.Close()
				return nil, ctx.Err()
			}
			return rc, nil
		},
	}
	if cfg.TLSClientConfig == nil {
		if u, err := amqp.ParseURI(c.url); err == nil && u.Scheme == "amqps" {
			cfg.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
	}
	cfg.Properties.SetClientConnectionName(c.name)
	ac, err := amqp.DialConfig(c.url, cfg)
	if !stop() && err == nil {
		// ctx ended while the handshake finished: the socket's deadline
		// may already be in the past, so the connection is not usable.
		ac.Close()
		err = ctx.Err()
	}
	if err != nil && (errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrVhost)) {
		// amqp091-go reports any failure to read the broker's answer to
		// start-ok or open as one of these 403s: a broker refusing a login
		// closes the socket without a word (RabbitMQ resets it, so a
		// closed or reset socket cannot be told from a refusal). A read
		// that timed out is a broker too slow to answer, not a refusal:
		// say so, or refusedForGood would fail publishes permanently for
		// a transient fault.
		mu.Lock()
		rc := socket
		mu.Unlock()
		var ne net.Error
		if rerr := rc.readErr(); errors.As(rerr, &ne) && ne.Timeout() {
			err = fmt.Errorf("the broker did not answer the AMQP handshake in time: %w", rerr)
		}
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			if errors.Is(err, cerr) {
				return nil, fmt.Errorf("rabbitmq: connect to %s: %w", c.redacted, cerr)
			}
			return nil, fmt.Errorf("rabbitmq: connect to %s: %w (%v)", c.redacted, cerr, err)
		}
		return nil, fmt.Errorf("rabbitmq: connect to %s: %w%s", c.redacted, err, dialHint(err))
	}
	return ac, nil
}

// readErrConn keeps the first error a read of its socket returned.
type readErrConn struct {
	net.Conn
	err atomic.Pointer[error]
}

func (c *readErrConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		c.err.CompareAndSwap(nil, &err)
	}
	return n, err
}

// readErr returns the first read error of c (nil: none, or c is nil).
func (c *readErrConn) readErr() error {
	if c == nil {
		return nil
	}
	if p := c.err.Load(); p != nil {
		return *p
	}
	return nil
}

// dialHint points at the likely cause of a failed connection.
func dialHint(err error) string {
	var ae *amqp.Error
	var ne net.Error
	switch {
	case errors.As(err, &ae) && (ae.Code == amqp.AccessRefused || ae.Code == amqp.NotAllowed):
		return " (wrong user, password or vhost?)"
	case errors.As(err, &ne) && ne.Timeout():
		return " (broker unreachable or TLS/port mismatch?)"
	case errors.Is(err, amqp.ErrCredentials), errors.Is(err, amqp.ErrSASL):
		return " (wrong user or password?)"
	}
	return ""
}

// refusedForGood reports whether err is the broker refusing a connection
// in a way that trying again cannot cure until someone changes the
// broker's users or permissions: 403 (wrong user or password, no SASL
// mechanism in common) or 530 (no access to the vhost, or no such vhost).
// A 530 also says that a connection limit was reached or the vhost is
// down, which pass: the reason tells them apart.
func refusedForGood(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.Code {
	case amqp.AccessRefused:
		return true
	case amqp.NotAllowed:
		r := strings.ToLower(ae.Reason)
		return !strings.Contains(r, "limit") && !strings.Contains(r, "down")
	}
	return false
}

// backoff returns the reconnection schedule: exponential with jitter from the
// initial to the max interval, never giving up on its own.
func (c conn) backoff() backoff.BackOff {
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(c.initial),
		backoff.WithMaxInterval(c.max),
		backoff.WithMaxElapsedTime(0),
	)
}

// sleep waits d or until done is closed, and reports whether it waited the
// whole time.
func sleep(d time.Duration, done <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}

// contextFor returns a context cancelled when done is closed.
func contextFor(done <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-done:
		case <-ctx.Done():
		}
		cancel()
	}()
	return ctx, cancel
}

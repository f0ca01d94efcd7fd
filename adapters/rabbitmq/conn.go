package rabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ackwise/ackwise"
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
	// TLS is done here rather than by amqp091-go, so that the frame filter
	// reads the broker's frames in clear (amqp091-go wraps the socket
	// Dial returns in TLS for an amqps:// URL: it is given the URL as
	// amqp:// with the port of amqps).
	url, tlsCfg, err := c.plainURL()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: connect to %s: %w", c.redacted, err)
	}
	cfg := amqp.Config{
		Heartbeat:  c.heartbeat,
		FrameSize:  clientFrameMax,
		Properties: amqp.NewConnectionProperties(),
		Dial: func(network, addr string) (net.Conn, error) {
			dctx, cancel := context.WithTimeout(ctx, DefaultDialTimeout)
			defer cancel()
			var d net.Dialer
			nc, err := d.DialContext(dctx, network, addr)
			if err != nil {
				return nil, err
			}
			// The deadline covers the TLS and AMQP handshakes; amqp091-go
			// clears it once the connection is open.
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
			var clear net.Conn = rc
			if tlsCfg != nil {
				tc := tls.Client(rc, tlsCfg)
				if err := tc.HandshakeContext(dctx); err != nil {
					nc.Close()
					return nil, err
				}
				clear = tc
			}
			return newFrameFilter(clear, clientFrameMax, c.reportUnreadable), nil
		},
	}
	if u, err := amqp.ParseURI(c.url); err == nil {
		cfg.SASL = failureCloseSASL(u, cfg.Properties)
	}
	cfg.Properties.SetClientConnectionName(c.name)
	ac, err := amqp.DialConfig(url, cfg)
	if !stop() && err == nil {
		// ctx ended while the handshake finished: the socket's deadline
		// may already be in the past, so the connection is not usable.
		ac.Close()
		err = ctx.Err()
	}
	if err != nil && (errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrVhost)) {
		// amqp091-go reports any failure to read the broker's answer to
		// start-ok or open that is not a connection.close as one of these
		// 403s: a socket closed or reset mid-handshake (a broker
		// restarting), or a broker refusing a login without a word (one
		// that ignores authentication_failure_close). A read that timed
		// out is a broker too slow to answer: say so.
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

// clientFrameMax is the frame_max the client asks for (amqp091-go's
// default, and RabbitMQ's); the broker's, if lower, wins.
const clientFrameMax = 131072

// plainURL returns the URL to give amqp091-go and the TLS config for
// Dial to use (nil: none): for an amqps:// URL, the URL as amqp:// with the
// port of amqps (5671 unless given) and c's TLS config (TLS 1.2 or later if
// none was given) with ServerName the URL's host unless set, as amqp091-go
// would use.
func (c conn) plainURL() (string, *tls.Config, error) {
	uri, err := amqp.ParseURI(c.url)
	if err != nil || uri.Scheme != "amqps" {
		return c.url, nil, nil // amqp091-go reports a bad URL itself
	}
	u, err := neturl.Parse(c.url)
	if err != nil {
		return "", nil, errors.New("URL is malformed")
	}
	u.Scheme = "amqp"
	if u.Port() == "" {
		u.Host = net.JoinHostPort(u.Hostname(), strconv.Itoa(uri.Port))
	}
	cfg := c.tls.Clone()
	if cfg == nil {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if cfg.ServerName == "" {
		cfg.ServerName = uri.Host
	}
	return u.String(), cfg, nil
}

// reportUnreadable logs a delivery whose header table amqp091-go could not
// have read and that the frame filter made readable.
func (c conn) reportUnreadable(u unreadable) {
	c.log.Warn("rabbitmq: a delivery's header table cannot be read by amqp091-go; its unreadable entries are passed on as byte arrays, named in "+HeaderUnreadable,
		"connection", c.name, "channel", u.channel, "message_id", u.messageID,
		"headers", strings.Join(u.names, ", "), ackwise.LogKeyReason, u.reason, "values_kept", u.kept)
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
	case errors.Is(err, amqp.ErrCredentials), errors.Is(err, amqp.ErrVhost):
		return " (connection closed during the AMQP handshake: broker restarting, or refusing the login?)"
	case errors.As(err, &ae) && (ae.Code == amqp.AccessRefused || ae.Code == amqp.NotAllowed):
		return " (wrong user, password or vhost?)"
	case errors.As(err, &ne) && ne.Timeout():
		return " (broker unreachable or TLS/port mismatch?)"
	}
	return ""
}

// failureCloseSASL returns the SASL mechanisms amqp091-go would take from
// u (as its Config.setSASL does), each also advertising the client
// capability authentication_failure_close in props: RabbitMQ then answers
// a refused login with connection.close 403 ACCESS_REFUSED instead of
// closing the socket, which reads the same as a connection reset
// mid-handshake. amqp091-go writes its own capabilities table into props
// (replacing any of ours) just before it asks the mechanism for its
// response (connection.go, openTune), so the capability is added then;
// TestPublisherRefusedForGoodFailsPermanently fails if that changes. nil
// (amqp091-go's default) for a mechanism it does not know, so that it
// reports that itself.
func failureCloseSASL(u amqp.URI, props amqp.Table) []amqp.Authentication {
	var out []amqp.Authentication
	if len(u.AuthMechanism) == 0 {
		return []amqp.Authentication{failureCloseAuth{u.PlainAuth(), props}}
	}
	for _, m := range u.AuthMechanism {
		switch strings.ToUpper(m) {
		case "PLAIN":
			out = append(out, failureCloseAuth{u.PlainAuth(), props})
		case "AMQPLAIN":
			out = append(out, failureCloseAuth{u.AMQPlainAuth(), props})
		case "EXTERNAL":
			out = append(out, failureCloseAuth{&amqp.ExternalAuth{}, props})
		default:
			return nil
		}
	}
	return out
}

// failureCloseAuth is a SASL mechanism that advertises
// authentication_failure_close (see failureCloseSASL). amqp091-go blanks
// the password of its own mechanisms after connecting, not of this one; the
// password stays in memory as long as the URL does (conn.url, for
// redialling), and neither is ever logged unredacted.
type failureCloseAuth struct {
	amqp.Authentication
	props amqp.Table
}

func (a failureCloseAuth) Response() string {
	if caps, ok := a.props["capabilities"].(amqp.Table); ok {
		caps["authentication_failure_close"] = true
	}
	return a.Authentication.Response()
}

// refusedForGood reports whether err is the broker refusing a connection
// in a way that trying again cannot cure until someone changes the
// broker's users or permissions: a connection.close the broker sent with
// 403 (wrong user or password) or 530 (no access to the vhost, or no such
// vhost), or no SASL mechanism in common with the broker's list. A 530
// also says that a connection limit was reached or the vhost is down,
// which pass: the reason tells them apart. amqp091-go's ErrCredentials and
// ErrVhost are no refusal: it returns them for a socket closed without a
// connection.close, which a broker restarting does too.
func refusedForGood(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) || !(ae.Server || ae == amqp.ErrSASL) {
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

// redial is the reconnection schedule over a connection's lives: it starts
// over only after a connection that stayed up for the max interval. A
// connection lost soon after it opened (one a message kills each time it is
// delivered, a broker that closes it at once) is made again ever more
// slowly, up to the max interval, not in a storm.
type redial struct {
	b   backoff.BackOff
	max time.Duration
	up  time.Time // when the current connection opened; zero while down
}

func (c conn) redial() *redial { return &redial{b: c.backoff(), max: c.max} }

// connected records that a connection opened now.
func (r *redial) connected() { r.up = time.Now() }

// wait returns how long to wait before the next attempt, after the
// connection was lost or an attempt failed.
func (r *redial) wait() time.Duration {
	if !r.up.IsZero() && time.Since(r.up) >= r.max {
		r.b.Reset()
	}
	r.up = time.Time{}
	return r.b.NextBackOff()
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

package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
)

// rabbitmqctl runs the broker's own tool and fails the test on error.
func rabbitmqctl(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("rabbitmqctl %v: %v: %s", args, err, out)
	}
}

// TestPublisherRefusedForGoodFailsPermanently: once the broker refuses the
// publisher's reconnection for good (its password changed: 403; its
// permissions on the vhost revoked: 530), Publish fails at once with a
// permanent error carrying the broker's refusal. Before, it waited for a
// reconnection that could not come until its ctx ended, and the error
// (context deadline exceeded) was transient, so producer.Publisher retried.
// The sink keeps reconnecting meanwhile: once access is given back, it
// publishes again.
func TestPublisherRefusedForGoodFailsPermanently(t *testing.T) {
	c := needBroker(t)
	for name, tc := range map[string]struct {
		revoke, restore []string
		code            int
	}{
		"password changed":    {revoke: []string{"change_password", "USER", "not-the-old-one"}, restore: []string{"change_password", "USER", "pw"}, code: amqp.AccessRefused},
		"vhost access denied": {revoke: []string{"clear_permissions", "-p", "/", "USER"}, restore: []string{"set_permissions", "-p", "/", "USER", ".*", ".*", ".*"}, code: amqp.NotAllowed},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			user := "ackwise-test-" + randSuffix()
			subst := func(args []string) []string {
				out := make([]string, len(args))
				for i, a := range args {
					if a == "USER" {
						a = user
					}
					out[i] = a
				}
				return out
			}
			cfg, sink := userSink(t, user, testURL())

			rabbitmqctl(t, subst(tc.revoke)...)
			if closeConnections(t, cfg.ConnectionName) == 0 {
				t.Fatal("no connection of the sink to close")
			}
			err := sink.Publish(ctxT(t), &ackwise.Message{ID: "refused"})
			var ae *amqp.Error
			if errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ae) || ae.Code != tc.code {
				t.Fatalf("Publish after the broker refused the reconnection: %v, want the broker's %d at once", err, tc.code)
			}
			if cl := ackwise.ClassOf(err); cl != ackwise.ClassPermanent {
				t.Fatalf("class %v, want permanent: %v", cl, err)
			}

			rabbitmqctl(t, subst(tc.restore)...)
			ctx := ctxT(t)
			for {
				err := sink.Publish(ctx, &ackwise.Message{ID: "after"})
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("no publish once access was given back: %v", err)
				}
				if !errors.As(err, &ae) {
					t.Fatalf("Publish while reconnecting: %v", err)
				}
			}
			if n := queueDepth(t, c, cfg.Queue); n != 2 {
				t.Fatalf("queue holds %d messages, want before and after", n)
			}
		})
	}
}

// A 530 also reports a connection limit reached or a vhost down, which
// pass: only the refusals of access are for good, and only those the
// broker sent.
func TestRefusedForGoodCodes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{amqp.ErrSASL, true},
		// amqp091-go's answer to a socket closed mid-handshake, not the broker's.
		{amqp.ErrCredentials, false},
		{amqp.ErrVhost, false},
		{&amqp.Error{Code: amqp.AccessRefused, Reason: "not from the broker"}, false},
		{&amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED - Login was refused", Server: true}, true},
		{&amqp.Error{Code: amqp.NotAllowed, Reason: "NOT_ALLOWED - access to vhost '/' refused for user 'u'", Server: true}, true},
		{&amqp.Error{Code: amqp.NotAllowed, Reason: "NOT_ALLOWED - access to vhost '/' refused for user 'u': connection limit (10) is reached", Server: true}, false},
		{&amqp.Error{Code: amqp.NotAllowed, Reason: "NOT_ALLOWED - vhost / is down", Server: true}, false},
		{&amqp.Error{Code: amqp.ConnectionForced, Server: true}, false},
		{amqp.ErrClosed, false},
		{context.DeadlineExceeded, false},
	} {
		if got := refusedForGood(fmt.Errorf("connect: %w", tc.err)); got != tc.want {
			t.Errorf("refusedForGood(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestPublisherRefusalClearedByTransientFailure: a refusal for good stands
// only until a reconnection fails for another reason: once the broker
// cannot be reached (the connection is refused at the socket), publishes
// must wait again (transient), not keep failing permanently for the rest
// of the outage.
func TestPublisherRefusalClearedByTransientFailure(t *testing.T) {
	t.Parallel()
	needBroker(t)
	user := "ackwise-test-" + randSuffix()
	gate, proxyURL := newGateProxy(t)
	cfg, sink := userSink(t, user, proxyURL)
	rabbitmqctl(t, "change_password", user, "not-the-old-one")
	if closeConnections(t, cfg.ConnectionName) == 0 {
		t.Fatal("no connection of the sink to close")
	}
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "refused"}); ackwise.ClassOf(err) != ackwise.ClassPermanent {
		t.Fatalf("Publish after the broker refused the reconnection: %v (class %v), want permanent", err, ackwise.ClassOf(err))
	}
	gate.refuse() // the broker is gone: the next reconnection is refused at the socket
	ctx := ctxT(t)
	for {
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		err := sink.Publish(short, &ackwise.Message{ID: "down"})
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && ackwise.ClassOf(err) != ackwise.ClassPermanent {
			return // waiting for a reconnection again
		}
		if ctx.Err() != nil {
			t.Fatalf("Publish still fails with %v (class %v) while the broker cannot be reached, want a wait", err, ackwise.ClassOf(err))
		}
	}
}

// userSink adds user (password pw, all permissions on /, deleted when the
// test ends), declares a queue and opens a sink publishing to it as user
// through brokerURL, reconnecting fast, and publishes one message, "before".
func userSink(t *testing.T, user, brokerURL string) (Config, *Sink) {
	t.Helper()
	rabbitmqctl(t, "add_user", user, "pw")
	t.Cleanup(func() { rabbitmqctl(t, "delete_user", user) })
	rabbitmqctl(t, "set_permissions", "-p", "/", user, ".*", ".*", ".*")
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, "pw")
	sink := newSink(t, SinkConfig{URL: u.String(), RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName,
		ReconnectInitialInterval: 50 * time.Millisecond, ReconnectMaxInterval: 200 * time.Millisecond})
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "before"}); err != nil {
		t.Fatal(err)
	}
	return cfg, sink
}

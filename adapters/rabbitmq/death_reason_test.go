package rabbitmq

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
)

// TestChannelDeathLogsBrokerReason: when the broker closes the consumer
// channel (here with 406 PRECONDITION_FAILED for an unknown delivery tag;
// consumer_timeout closes it with 406 too), the reconnection warning carries
// the broker's reason, also when a blocked Receive sees the deliveries end
// before the close notification is handled, and the consumer_timeout hint
// only when the reason is that timeout.
func TestChannelDeathLogsBrokerReason(t *testing.T) {
	needBroker(t)
	cfg := testConfig(t, Classic)
	logs := make(chan slog.Record, 64)
	cfg.Logger = slog.New(recordHandler{ch: logs})
	declare(t, cfg)
	src := newSource(t, cfg)
	ss, err := src.current(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	// A Receive blocked on the deliveries when the channel dies.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		buf := make([]*ackwise.Message, 1)
		_, _ = src.Receive(ctx, buf)
	}()
	// An ack of a delivery tag the broker never sent: it closes the
	// channel with 406.
	if err := ss.ch.Ack(1<<40, false); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(testTimeout)
	for {
		select {
		case r := <-logs:
			if r.Message != "rabbitmq: consumer channel lost; reconnecting" {
				continue
			}
			var errText, hint string
			r.Attrs(func(a slog.Attr) bool {
				switch a.Key {
				case "error":
					errText = a.Value.String()
				case "hint":
					hint = a.Value.String()
				}
				return true
			})
			if !strings.Contains(errText, "406") && !strings.Contains(errText, "PRECONDITION_FAILED") {
				t.Fatalf("reconnection warning's error %q, want the broker's 406", errText)
			}
			if hint != "" {
				t.Fatalf("reconnection warning for an unknown delivery tag blames consumer_timeout: %q", hint)
			}
			return
		case <-timeout:
			t.Fatal("no reconnection warning")
		}
	}
}

// TestDeathHint: the consumer_timeout hint is given for the broker's
// timeout close only, not for every 406; the unreadable-frame hint for the
// client's own frame error only.
func TestDeathHint(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		hint bool
	}{
		{&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value used: 1800000 ms. This timeout value can be configured, see consumers doc guide to learn more"}, true},
		{&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - unknown delivery tag 42"}, false},
		{&amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"}, false},
		{errors.New("rabbitmq: consumer cancelled by the broker or channel closed"), false},
		// amqp091-go's own close when it cannot read a frame, and the
		// broker's frame error (not the client's).
		{&amqp.Error{Code: amqp.FrameError, Reason: `Exception (502) Reason: "invalid field or value inside of a frame"`}, true},
		{&amqp.Error{Code: amqp.FrameError, Reason: "FRAME_ERROR", Server: true}, false},
	} {
		if got := deathHint(c.err) != ""; got != c.hint {
			t.Errorf("deathHint(%v) given: %v, want %v", c.err, got, c.hint)
		}
	}
}

package gcppubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// Capabilities follow the subscription: a delay tier only for a fixed
// retry backoff, the broker's count only with a dead-letter policy, order
// only with message ordering.
func TestCapabilitiesFromSubscription(t *testing.T) {
	t.Parallel()
	dur := durationpb.New
	for _, c := range []struct {
		name string
		ps   *pubsubpb.Subscription
		want adapters.Capabilities
	}{
		{"plain", &pubsubpb.Subscription{}, adapters.Capabilities{}},
		{"fixed backoff", &pubsubpb.Subscription{RetryPolicy: &pubsubpb.RetryPolicy{MinimumBackoff: dur(30 * time.Second), MaximumBackoff: dur(30 * time.Second)}},
			adapters.Capabilities{Delay: true, DelayTiers: []time.Duration{30 * time.Second}, MaxDelay: 30 * time.Second}},
		{"exponential backoff", &pubsubpb.Subscription{RetryPolicy: &pubsubpb.RetryPolicy{MinimumBackoff: dur(time.Second), MaximumBackoff: dur(time.Minute)}}, adapters.Capabilities{}},
		{"defaults: 10s to 600s", &pubsubpb.Subscription{RetryPolicy: &pubsubpb.RetryPolicy{}}, adapters.Capabilities{}},
		{"maximum 10s: the default minimum", &pubsubpb.Subscription{RetryPolicy: &pubsubpb.RetryPolicy{MaximumBackoff: dur(10 * time.Second)}},
			adapters.Capabilities{Delay: true, DelayTiers: []time.Duration{10 * time.Second}, MaxDelay: 10 * time.Second}},
		{"dead-letter policy and ordering", &pubsubpb.Subscription{DeadLetterPolicy: &pubsubpb.DeadLetterPolicy{MaxDeliveryAttempts: 5}, EnableMessageOrdering: true},
			adapters.Capabilities{DeliveryCount: true, Ordered: true}},
	} {
		got := capabilities(c.ps)
		if got.Delay != c.want.Delay || !slices.Equal(got.DelayTiers, c.want.DelayTiers) || got.MaxDelay != c.want.MaxDelay ||
			got.DeliveryCount != c.want.DeliveryCount || got.Ordered != c.want.Ordered || got.Lease != 0 || got.ExtendLease || got.Log {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func openSource(t *testing.T, f *fake, cfg Config) *Source {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src, err := NewSource(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

// withMessages returns a fake with a destination shaped by shape (nil:
// plain) holding msgs.
func withMessages(t *testing.T, shape func(*pubsubpb.Subscription), msgs ...*ackwise.Message) (*fake, dest) {
	t.Helper()
	f := newFake(t)
	d := f.create(t, shape)
	publish(t, f, d, msgs...)
	return f, d
}

// openSink opens a sink on d, closed when the test ends.
func openSink(t *testing.T, f *fake, d dest) *Sink {
	t.Helper()
	sink, err := NewSink(context.Background(), d.sinkConfig(f))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	return sink
}

func publish(t *testing.T, f *fake, d dest, msgs ...*ackwise.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sink := openSink(t, f, d)
	for _, m := range msgs {
		if err := sink.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
}

func receive(t *testing.T, src *Source) *ackwise.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	buf := make([]*ackwise.Message, 1)
	if n, err := src.Receive(ctx, buf); n != 1 {
		t.Fatalf("receive: %v", err)
	}
	return buf[0]
}

// With a dead-letter policy, Attempt is Pub/Sub's DeliveryAttempt.
func TestAttemptFromDeliveryAttempt(t *testing.T) {
	t.Parallel()
	f, d := withMessages(t, func(ps *pubsubpb.Subscription) {
		ps.DeadLetterPolicy = &pubsubpb.DeadLetterPolicy{DeadLetterTopic: "projects/" + testProject + "/topics/dlt-" + ps.Name[strings.LastIndex(ps.Name, "/")+3:], MaxDeliveryAttempts: 5}
	}, &ackwise.Message{ID: "ev", Payload: []byte("x")})
	src := openSource(t, f, d.sourceConfig(f))
	if !src.Capabilities().DeliveryCount {
		t.Fatal("Capabilities.DeliveryCount false with a dead-letter policy")
	}
	ctx := context.Background()
	for want := 1; want <= 3; want++ {
		m := receive(t, src)
		if m.Attempt != want {
			t.Fatalf("delivery %d: Attempt %d", want, m.Attempt)
		}
		if want < 3 {
			if err := src.Release(ctx, m); err != nil {
				t.Fatal(err)
			}
		} else if err := src.Ack(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
}

// Without a retry policy the source cannot delay: Nack fails and settles
// nothing (the message is still the consumer's to ack).
func TestNackWithoutDelay(t *testing.T) {
	t.Parallel()
	f, d := withMessages(t, nil, &ackwise.Message{ID: "ev", Payload: []byte("x")})
	src := openSource(t, f, d.sourceConfig(f))
	m := receive(t, src)
	ctx := context.Background()
	if err := src.Nack(ctx, m, time.Second); err == nil {
		t.Fatal("Nack without Capabilities.Delay: nil error")
	}
	if !src.Valid(m) {
		t.Fatal("the failed Nack settled the message")
	}
	if err := src.Ack(ctx, m); err != nil {
		t.Fatal(err)
	}
}

// On an ordered subscription the source says so, and delivers a key's
// messages in publish order.
func TestOrdered(t *testing.T) {
	t.Parallel()
	var in []*ackwise.Message
	for i := range 4 {
		in = append(in, &ackwise.Message{ID: fmt.Sprint(i), Key: "k", Payload: []byte{byte(i)}})
	}
	f, d := withMessages(t, func(ps *pubsubpb.Subscription) { ps.EnableMessageOrdering = true }, in...)
	src := openSource(t, f, d.sourceConfig(f))
	if !src.Capabilities().Ordered {
		t.Fatal("Capabilities.Ordered false on an ordered subscription")
	}
	for _, want := range in {
		m := receive(t, src)
		if m.ID != want.ID || m.Key != "k" {
			t.Fatalf("received %s key %q, want %s", m.ID, m.Key, want.ID)
		}
		if err := src.Ack(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
}

// A delivery held past MaxExtension is a warning as it happens, is no
// longer Valid, and its Ack fails as "may be redelivered".
func TestHeldPastMaxExtension(t *testing.T) {
	t.Parallel()
	f, d := withMessages(t, nil, &ackwise.Message{ID: "ev", Payload: []byte("x")})
	cfg := d.sourceConfig(f)
	cfg.MaxExtension = 100 * time.Millisecond
	rec := &recordLog{}
	cfg.Logger = slog.New(rec)
	src := openSource(t, f, cfg)
	m := receive(t, src)
	// The warning comes while the delivery is still held (its handler
	// would still run), not only at its settle.
	for deadline := time.Now().Add(10 * time.Second); !rec.has("WARN gcppubsub: a delivery was held past max_extension"); {
		if time.Now().After(deadline) {
			t.Fatalf("logged %q, want a warning naming max_extension", rec.msgs)
		}
		time.Sleep(10 * time.Millisecond) // a log has no event to await
	}
	if src.Valid(m) || !rec.has("max_extension=100ms") {
		t.Fatalf("Valid %v past MaxExtension; logged %q", src.Valid(m), rec.msgs)
	}
	if err := src.Ack(context.Background(), m); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("Ack past MaxExtension: %v, want ErrReceiptInvalid", err)
	}
}

// Attempt is never read from a producer's attributes: a forged
// ackwise-attempt (or Pub/Sub's own attribute name) leaves it at 1, with
// and without a dead-letter policy.
func TestForgedAttemptIgnored(t *testing.T) {
	t.Parallel()
	for _, shape := range []func(*pubsubpb.Subscription){nil, dlPolicy(5)} {
		f, d := withMessages(t, shape)
		f.srv.Publish("projects/"+testProject+"/topics/"+d.topic, []byte("x"), map[string]string{ackwise.HeaderAttempt: "99", "googclient_deliveryattempt": "42"})
		src := openSource(t, f, d.sourceConfig(f))
		if m := receive(t, src); m.Attempt != 1 {
			t.Fatalf("dead-letter policy %v: Attempt %d from forged attributes", shape != nil, m.Attempt)
		}
	}
}

// On an exactly-once subscription a failed ack result is "may be
// redelivered" (ErrReceiptInvalid), never done.
func TestExactlyOnceAckFailure(t *testing.T) {
	t.Parallel()
	f := newFake(t, pstest.WithErrorInjection("Acknowledge", codes.PermissionDenied, "denied"))
	d := f.create(t, func(ps *pubsubpb.Subscription) { ps.EnableExactlyOnceDelivery = true })
	publish(t, f, d, &ackwise.Message{ID: "ev", Payload: []byte("x")})
	cfg := d.sourceConfig(f)
	cfg.Logger = testLogger(t)
	src := openSource(t, f, cfg)
	m := receive(t, src)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := src.Ack(ctx, m); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("Ack with a failed result: %v, want ErrReceiptInvalid", err)
	}
}

// With a fixed retry backoff the source delays through Pub/Sub: Nack
// settles the delivery (nacks it) and the redelivery's Attempt is counted
// by the source, there being no dead-letter policy. pstest redelivers a
// nack at once, whatever the retry policy: the delay itself is Pub/Sub's.
func TestNackWithFixedBackoff(t *testing.T) {
	t.Parallel()
	f, d := withMessages(t, func(ps *pubsubpb.Subscription) {
		ps.RetryPolicy = &pubsubpb.RetryPolicy{MinimumBackoff: durationpb.New(10 * time.Second), MaximumBackoff: durationpb.New(10 * time.Second)}
	}, &ackwise.Message{ID: "ev", Payload: []byte("x")})
	src := openSource(t, f, d.sourceConfig(f))
	if c := src.Capabilities(); !c.Delay || !slices.Equal(c.DelayTiers, []time.Duration{10 * time.Second}) || c.DeliveryCount {
		t.Fatalf("capabilities %+v", c)
	}
	ctx := context.Background()
	m := receive(t, src)
	if err := src.Nack(ctx, m, time.Second); err != nil {
		t.Fatal(err)
	}
	if src.Valid(m) {
		t.Fatal("Valid after Nack")
	}
	again := receive(t, src)
	if again.ID != "ev" || again.Attempt != 2 {
		t.Fatalf("redelivered %s attempt %d, want ev attempt 2", again.ID, again.Attempt)
	}
	if err := src.Ack(ctx, again); err != nil {
		t.Fatal(err)
	}
}

// On an exactly-once subscription an ack confirmed by Pub/Sub is done.
func TestExactlyOnceAck(t *testing.T) {
	t.Parallel()
	f, d := withMessages(t, func(ps *pubsubpb.Subscription) { ps.EnableExactlyOnceDelivery = true }, &ackwise.Message{ID: "ev", Payload: []byte("x")})
	src := openSource(t, f, d.sourceConfig(f))
	m := receive(t, src)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := src.Ack(ctx, m); err != nil {
		t.Fatal(err)
	}
	if pm := f.srv.Message(m.BrokerID); pm == nil || pm.Acks != 1 {
		t.Fatalf("pstest holds %+v, want one ack", pm)
	}
}

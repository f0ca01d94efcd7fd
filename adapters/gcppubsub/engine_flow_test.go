package gcppubsub

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// outcomes is a consumer.Observer that passes each outcome on.
type outcomes chan consumer.Outcome

func (o outcomes) Observe(_ *ackwise.Message, oc consumer.Outcome, _ time.Duration) { o <- oc }

// runConsumer runs a consumer on src until the test ends.
func runConsumer(t *testing.T, src *Source, h ackwise.Handler, cfg consumer.Config) {
	t.Helper()
	c, err := consumer.New(src, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// On an ordered subscription, under 8 workers and over 3 streams, the
// messages of each key are handled one at a time in publish order, the
// keys side by side.
func TestEngineOrderedKeys(t *testing.T) {
	t.Parallel()
	const keys, perKey = 4, 5
	var in []*ackwise.Message
	for i := range perKey {
		for k := range keys {
			in = append(in, &ackwise.Message{ID: fmt.Sprintf("k%d-%d", k, i), Key: fmt.Sprintf("k%d", k), Payload: []byte{byte(i)}})
		}
	}
	f, d := withMessages(t, func(ps *pubsubpb.Subscription) { ps.EnableMessageOrdering = true }, in...)
	cfg := d.sourceConfig(f)
	cfg.Streams = 3
	src := openSource(t, f, cfg)
	var (
		mu      sync.Mutex
		running = map[string]int{}
		order   = map[string][]int{}
		overlap []string
	)
	obs := make(outcomes, len(in)*2)
	runConsumer(t, src, ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		mu.Lock()
		running[m.Key]++
		if running[m.Key] > 1 {
			overlap = append(overlap, m.ID)
		}
		order[m.Key] = append(order[m.Key], int(m.Payload[0]))
		mu.Unlock()
		time.Sleep(2 * time.Millisecond) // the handler's work: gives a second message of its key the chance to overlap
		mu.Lock()
		running[m.Key]--
		mu.Unlock()
		return nil
	}), consumer.Config{Concurrency: 8, Observer: obs})
	timeout := time.After(60 * time.Second)
	for acked := 0; acked < len(in); {
		select {
		case o := <-obs:
			if o != consumer.Acked {
				t.Fatalf("outcome %v", o)
			}
			acked++
		case <-timeout:
			t.Fatalf("%d of %d acked", acked, len(in))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(overlap) > 0 {
		t.Errorf("messages run beside another of their key: %v", overlap)
	}
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		if want := []int{0, 1, 2, 3, 4}; !slices.Equal(order[key], want) {
			t.Errorf("key %s handled in order %v, want %v", key, order[key], want)
		}
	}
}

// On an exactly-once subscription, an ack whose result failed is observed
// as SettleFailed (the message may be delivered again) and logged, never
// as Acked; Pub/Sub holds it unacked.
func TestEngineExactlyOnceFailedAckNotDone(t *testing.T) {
	t.Parallel()
	f := newFake(t, pstest.WithErrorInjection("Acknowledge", codes.FailedPrecondition, "ack id expired"))
	d := f.create(t, func(ps *pubsubpb.Subscription) { ps.EnableExactlyOnceDelivery = true })
	publish(t, f, d, &ackwise.Message{ID: "ev", Payload: []byte("x")})
	cfg := d.sourceConfig(f)
	rec := &recordLog{}
	cfg.Logger = slog.New(rec)
	src := openSource(t, f, cfg)
	obs := make(outcomes, 100)
	handled := make(chan string, 100)
	runConsumer(t, src, ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		handled <- m.BrokerID
		return nil
	}), consumer.Config{Observer: obs})
	select {
	case o := <-obs:
		if o != consumer.SettleFailed {
			t.Fatalf("first outcome %v, want settle-failed", o)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no outcome")
	}
	id := <-handled
	if !rec.has("exactly-once ack failed") {
		t.Errorf("no warning logged: %q", rec.msgs)
	}
	if pm := f.srv.Message(id); pm == nil || pm.Acks != 0 {
		t.Errorf("pstest holds %+v, want no ack", pm)
	}
	for {
		select {
		case o := <-obs:
			if o == consumer.Acked {
				t.Fatal("a failed exactly-once ack was observed as acked")
			}
		default:
			return
		}
	}
}

// A handler that outlives the subscription's ack deadline (10s) keeps its
// delivery: the client extends the deadline (modacks pstest records), the
// message is delivered once, handled once and acked.
func TestEngineHandlerOutlivesAckDeadline(t *testing.T) {
	t.Parallel()
	f, d := withMessages(t, nil, &ackwise.Message{ID: "ev", Payload: []byte("x")})
	cfg := d.sourceConfig(f) // ack deadline 10s, on the subscription and per extension
	src := openSource(t, f, cfg)
	const hold = 15 * time.Second // past the 10s ack deadline
	obs := make(outcomes, 10)
	handled := make(chan string, 10)
	runConsumer(t, src, ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		handled <- m.BrokerID
		time.Sleep(hold) // the slow handler is the case under test, not a wait for an event
		return nil
	}), consumer.Config{Observer: obs})
	var id string
	select {
	case id = <-handled:
	case <-time.After(30 * time.Second):
		t.Fatal("not handled")
	}
	select {
	case o := <-obs:
		if o != consumer.Acked {
			t.Fatalf("outcome %v, want acked", o)
		}
	case <-time.After(hold + 30*time.Second):
		t.Fatal("no outcome")
	}
	select {
	case again := <-handled:
		t.Fatalf("handled again (%s): the delivery was not extended", again)
	default:
	}
	// The client sends acks in batches every 100ms: poll pstest for it.
	pm := f.srv.Message(id)
	for deadline := time.Now().Add(10 * time.Second); pm.Acks == 0 && time.Now().Before(deadline); pm = f.srv.Message(id) {
		time.Sleep(20 * time.Millisecond)
	}
	if pm.Deliveries != 1 || pm.Acks != 1 {
		t.Fatalf("pstest holds %+v, want 1 delivery and 1 ack", pm)
	}
	extended := 0
	for _, ma := range pm.Modacks {
		if ma.AckDeadline > 0 && ma.ReceivedAt.Sub(pm.PublishTime) > 2*time.Second {
			extended++
		}
	}
	if extended == 0 {
		t.Fatalf("no ack-deadline extension among %+v", pm.Modacks)
	}
}

// Broker-managed dead letters under the engine: a handler failing
// permanently sees Attempt 1, 2, 3 from Pub/Sub's DeliveryAttempt (the
// engine hands each delivery back, DeadLetter being the policy's), and the
// subscription's dead-letter policy forwards the message after its 3
// deliveries, data byte for byte.
func TestEngineBrokerManagedDeadLetters(t *testing.T) {
	t.Parallel()
	payload := []byte{0xfe, 'x', 0x00}
	f, d := withMessages(t, dlPolicy(3), &ackwise.Message{ID: "ev", Payload: payload})
	cfg := d.sourceConfig(f)
	cfg.DeadLetterTopic = ""
	cfg.Retry.MaxAttempts = 3
	src := openSource(t, f, cfg)
	attempts := make(chan int, 10)
	runConsumer(t, src, ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		attempts <- m.Attempt
		return ackwise.Permanent(errors.New("cannot decode"))
	}), consumer.Config{Retry: retry.Policy{MaxAttempts: 3}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dl := f.awaitDeadLetters(ctx, t, d, 1)
	if len(dl) != 1 || !bytes.Equal(dl[0].Payload, payload) || dl[0].ID != "ev" {
		t.Fatalf("dead letters %+v", dl)
	}
	var seen []int
	for len(attempts) > 0 {
		seen = append(seen, <-attempts)
	}
	if !slices.Equal(seen, []int{1, 2, 3}) {
		t.Fatalf("attempts %v, want [1 2 3]", seen)
	}
}

package rabbitmq

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
)

// The broker refuses one message by closing the channel (here a CC header
// that is a string, not an array: 406 "invalid message"), while other
// Publish calls have messages unconfirmed on that channel. Only the refused
// message's call fails; the others are sent again on the next channel and
// succeed. Before, every call with a message in flight on the dying channel
// got the refusal, marked ackwise.Permanent, so producer.Publisher dropped
// messages the broker never objected to.
func TestChannelRefusalFailsOnlyTheCulprit(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName})

	const rounds, good = 5, 8
	want := map[string]bool{}
	for r := range rounds {
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make([]error, good)
		for i := range good {
			id := fmt.Sprintf("good-%d-%d", r, i)
			want[id] = true
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = sink.Publish(ctxT(t), &ackwise.Message{ID: id, Payload: []byte("ok")})
			}()
		}
		var badErr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			badErr = sink.Publish(ctxT(t), &ackwise.Message{ID: fmt.Sprintf("bad-%d", r), Payload: []byte("x"),
				Headers: ackwise.Headers{{Key: "CC", Value: "someone@example.com"}}})
		}()
		close(start)
		wg.Wait()
		var ae *amqp.Error
		if !errors.As(badErr, &ae) || ae.Code != amqp.PreconditionFailed || ackwise.ClassOf(badErr) != ackwise.ClassPermanent {
			t.Fatalf("round %d: refused message: %v (class %v), want a permanent 406", r, badErr, ackwise.ClassOf(badErr))
		}
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: innocent message %d failed with the other call's refusal: %v (class %v)", r, i, err, ackwise.ClassOf(err))
			}
		}
	}
	for _, d := range getAll(t, c, cfg.Queue) {
		id, _ := d.Headers[ackwise.HeaderEventID].(string)
		if id != "" && id[0] == 'b' {
			t.Fatalf("refused message %q was stored", id)
		}
		delete(want, id)
	}
	if len(want) > 0 {
		t.Fatalf("%d confirmed messages missing from the queue: %v", len(want), want)
	}
}

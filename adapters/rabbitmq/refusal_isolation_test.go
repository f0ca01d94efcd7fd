package rabbitmq

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
)

// The broker refuses one message by closing the channel (here its routing
// key, which the user's topic permissions do not allow: 403), while other
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
	sink, goodKey := goodOnlySink(t, c, cfg)
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
				errs[i] = sink.Publish(ctxT(t), &ackwise.Message{ID: id, Key: goodKey, Payload: []byte("ok")})
			}()
		}
		var badErr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			badErr = sink.Publish(ctxT(t), &ackwise.Message{ID: fmt.Sprintf("bad-%d", r), Key: "bad", Payload: []byte("x")})
		}()
		close(start)
		wg.Wait()
		var ae *amqp.Error
		if !errors.As(badErr, &ae) || ae.Code != amqp.AccessRefused || ackwise.ClassOf(badErr) != ackwise.ClassPermanent {
			t.Fatalf("round %d: refused message: %v (class %v), want a permanent 403", r, badErr, ackwise.ClassOf(badErr))
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

// goodOnlySink returns a sink on amq.topic, whose messages go with their
// Key, for a user whose topic permissions allow routing key goodKey alone:
// the broker refuses any other by closing the channel (403). cfg's queue
// is bound to goodKey, named after the queue: amq.topic is shared by every
// test running at once, and a fixed key would bind each such test's queue
// to the others' messages.
func goodOnlySink(t *testing.T, c *amqp.Connection, cfg Config) (sink *Sink, goodKey string) {
	t.Helper()
	goodKey = "good-" + cfg.Queue
	if err := withChannel(c, func(ch *amqp.Channel) error {
		return ch.QueueBind(cfg.Queue, goodKey, "amq.topic", false, nil)
	}); err != nil {
		t.Fatal(err)
	}
	user := "ackwise-test-" + randSuffix()
	rabbitmqctl(t, "add_user", user, "pw")
	t.Cleanup(func() { rabbitmqctl(t, "delete_user", user) })
	rabbitmqctl(t, "set_permissions", "-p", "/", user, ".*", ".*", ".*")
	rabbitmqctl(t, "set_topic_permissions", "-p", "/", user, "amq.topic", "^"+regexp.QuoteMeta(goodKey)+"$", ".*")
	u, err := url.Parse(cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, "pw")
	return newSink(t, SinkConfig{URL: u.String(), Exchange: "amq.topic", ConnectionName: cfg.ConnectionName}), goodKey
}

package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// sourceURL is a rabbit:// URL of the test broker for queue, with the
// parameters q and the test broker's vhost.
func sourceURL(t *testing.T, queue string, q url.Values) string {
	t.Helper()
	u, err := newConn(testURL(), nil, 0, "", 0, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	parsed, _ := amqp.ParseURI(u.url)
	q.Set("vhost", parsed.Vhost)
	return (&url.URL{
		Scheme:   "rabbit",
		User:     url.UserPassword(parsed.Username, parsed.Password),
		Host:     fmt.Sprintf("%s:%d", parsed.Host, parsed.Port),
		Path:     "/" + queue,
		RawQuery: q.Encode(),
	}).String()
}

// TestURLWithoutTiersRetriesInPlace: a source opened by a URL that names no
// tiers has no wait queues: it starts on a topology without them (before,
// it refused to start for want of the default tiers' wait queue), reports
// no Delay, and the engine's default (RetryAuto) retries a failed message
// in place. RetryBroker refuses such a source with an error that says to
// name tiers.
func TestURLWithoutTiersRetriesInPlace(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg) // the work queue and its dead-letter queue: no wait queues
	src, err := adapters.OpenSource(ctxT(t), sourceURL(t, cfg.Queue, url.Values{"connection_name": {cfg.ConnectionName}}))
	if err != nil {
		t.Fatalf("OpenSource without tiers: %v", err)
	}
	t.Cleanup(func() { src.Close() })
	if caps := src.Capabilities(); caps.Delay || len(caps.DelayTiers) != 0 || caps.MaxDelay != 0 {
		t.Fatalf("capabilities without tiers %+v: want no Delay", caps)
	}
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil })
	if _, err := consumer.New(src, h, consumer.Config{RetryMode: consumer.RetryBroker}); err == nil || !strings.Contains(err.Error(), "tiers") {
		t.Fatalf("RetryBroker without tiers: %v, want an error naming the missing tiers", err)
	}
	if err := src.Nack(ctxT(t), &ackwise.Message{}, time.Second); !errors.Is(err, ErrNoTiers) {
		t.Fatalf("Nack without tiers: %v, want ErrNoTiers", err)
	}

	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName + "-sink"})
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "r", Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var attempts []int
	done := make(chan struct{})
	h = ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, m.Attempt)
		if m.Attempt == 1 {
			return errors.New("503")
		}
		close(done)
		return nil
	})
	cons, err := consumer.New(src, h, consumer.Config{Retry: retry.Policy{InitialInterval: 10 * time.Millisecond, Jitter: retry.NoJitter}})
	if err != nil {
		t.Fatalf("RetryAuto without tiers: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- cons.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatal("the failed message was not handled again")
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	s := cons.Stats()
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(attempts, []int{1, 2}) || s.Retried != 1 || s.Acked != 1 {
		t.Fatalf("attempts %v, stats %+v: want one retry in place, then the ack", attempts, s)
	}
	if n := len(getAll(t, c, cfg.Queue+".dlq")); n != 0 {
		t.Fatalf("%d dead letters, want none", n)
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/kafka" // registers kafka://
	"github.com/ackwise/ackwise/adapters/memory"
	_ "github.com/ackwise/ackwise/adapters/rabbitmq" // registers amqp://
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

// transport is where the events travel: the in-memory broker on a virtual
// clock, or a real broker opened by URL.
type transport struct {
	sink adapters.Sink
	src  adapters.Source // the queue or topic, with its retry tiers
	dlq  adapters.Source // its dead-letter queue or topic, read at the end
	// clock is the virtual clock on the in-memory broker, else the real
	// one.
	clock  ackwise.Clock
	mem    *memory.Broker
	vclock *memory.VirtualClock
	closes []func() error
}

func (t *transport) close() {
	for i := len(t.closes) - 1; i >= 0; i-- {
		_ = t.closes[i]()
	}
}

// openTransport opens the in-memory broker when broker is "", else the
// broker at the URL broker (amqp:// or kafka://, no path): queue is the
// RabbitMQ queue or Kafka topic, with a wait queue or retry topic per
// delay of schedule and a dead-letter queue or topic, QUEUE.dlq.
func openTransport(ctx context.Context, broker, queue string, schedule []time.Duration) (*transport, error) {
	if broker == "" {
		return openMemory(queue)
	}
	source, sink, dead, err := brokerURLs(broker, queue, schedule)
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(broker, "kafka:") {
		if err := createTopics(ctx, source); err != nil {
			return nil, err
		}
	}
	t := &transport{clock: ackwise.SystemClock}
	open := func(what, u string) (adapters.Source, error) {
		s, err := adapters.OpenSource(ctx, u)
		if err != nil {
			return nil, fmt.Errorf("open the %s: %w", what, err)
		}
		t.closes = append(t.closes, s.Close)
		return s, nil
	}
	if t.src, err = open("queue", source); err == nil { // declares the topology first
		if t.sink, err = adapters.OpenSink(ctx, sink); err == nil {
			t.closes = append(t.closes, t.sink.Close)
			t.dlq, err = open("dead-letter queue", dead)
		}
	}
	if err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

// brokerURLs returns the URLs of the queue's source (which declares the
// topology), of its sink, and of a source on its dead-letter queue.
func brokerURLs(broker, queue string, schedule []time.Duration) (source, sink, dead string, err error) {
	u, err := url.Parse(broker)
	if err != nil {
		return "", "", "", fmt.Errorf("-broker: %w", errors.Unwrap(err))
	}
	if strings.Trim(u.Path, "/") != "" {
		return "", "", "", fmt.Errorf("-broker %s: give the broker only: the queue is -queue", u.Redacted())
	}
	tiers := make([]string, len(schedule))
	for i, d := range schedule {
		tiers[i] = d.String()
	}
	with := func(path string, params ...string) string {
		v := u.Query()
		for i := 0; i+1 < len(params); i += 2 {
			v.Set(params[i], params[i+1])
		}
		c := *u
		c.Path, c.RawQuery = "/"+path, v.Encode()
		return c.String()
	}
	switch u.Scheme {
	case "amqp", "amqps":
		return with(queue, "declare", "true", "tiers", strings.Join(tiers, ",")),
			with(queue), with(queue+dlqSuffix, "plain", "true"), nil
	case "kafka":
		return with(queue, "group", "webhooks", "tiers", strings.Join(tiers, ",")),
			with(queue), with(queue+dlqSuffix, "group", "webhooks-dlq"), nil
	}
	return "", "", "", fmt.Errorf("-broker %s: want amqp://, amqps:// or kafka://, or nothing for the in-memory broker", u.Redacted())
}

const dlqSuffix = ".dlq"

// createTopics creates the Kafka topic of the source URL, its retry topics
// and its dead-letter topic (4 partitions each), leaving those that exist
// alone.
func createTopics(ctx context.Context, source string) error {
	u, err := url.Parse(source)
	if err != nil {
		return err
	}
	cfg, err := kafka.ParseURL(u)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := kafka.CreateTopics(ctx, cfg, 4, -1); err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	return nil
}

func openMemory(queue string) (*transport, error) {
	vclock := memory.NewVirtualClock(time.Time{})
	b, err := memory.New(memory.Config{Clock: vclock})
	if err != nil {
		return nil, err
	}
	t := &transport{clock: vclock, mem: b, vclock: vclock}
	if err := b.CreateQueue(queue, memory.QueueConfig{Lease: time.Hour}); err != nil {
		return nil, err
	}
	// The broker delivers every 9th message twice, as any broker may.
	if _, err := b.InjectFault(queue, memory.Fault{Kind: memory.FaultDuplicate, Every: 9}); err != nil {
		return nil, err
	}
	if t.sink, err = b.Sink(queue); err != nil {
		return nil, err
	}
	if t.src, err = b.QueueSource(queue); err != nil {
		return nil, err
	}
	if t.dlq, err = b.QueueSource(queue + dlqSuffix); err != nil {
		return nil, err
	}
	return t, nil
}

// waitSettled waits until every one of the events was settled (delivered
// or dead-lettered). On the in-memory broker it advances the virtual
// clock whenever the workers are idle; on a real one, the retries take
// their real time, up to limit.
func (t *transport) waitSettled(ctx context.Context, o *outcomes, queue string, events int, limit time.Duration) error {
	if t.mem != nil {
		return waitIdle(t.mem, queue, events, 5*time.Minute, t.vclock, t.vclock.Now())
	}
	select {
	case <-o.all:
		return nil
	case <-time.After(limit):
		return fmt.Errorf("%d of %d events settled after %v", o.count(), events, limit)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitIdle waits until events messages were published and every one is
// settled (acked or dead-lettered), advancing the clock by step each time
// nothing is ready or in flight.
func waitIdle(b *memory.Broker, queue string, events int, step time.Duration, clock *memory.VirtualClock, start time.Time) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := b.Stats(queue)
		if err != nil {
			return err
		}
		settled := int(st.Acked + st.DeadLettered)
		if st.Published >= int64(events) && st.Ready == 0 && st.InFlight == 0 {
			if st.Delayed == 0 && settled >= int(st.Published) {
				return nil
			}
			if clock.Now().Sub(start) > 48*time.Hour {
				return fmt.Errorf("messages still delayed after two virtual days: %+v", st)
			}
			clock.Advance(step)
			continue
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not settled after two minutes: %+v", st)
		}
		time.Sleep(2 * time.Millisecond) // the workers run in real time: poll the broker's counts
	}
}

// deadLetters reads the dead letters of the events ids from the
// dead-letter queue (acking them) and returns each one's envelope by event
// ID.
func (t *transport) deadLetters(ctx context.Context, ids map[string]bool, limit time.Duration) (map[string]dlq.Envelope, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	got := map[string]dlq.Envelope{}
	buf := make([]*ackwise.Message, 64)
	for len(got) < len(ids) {
		n, err := t.dlq.Receive(ctx, buf)
		if err != nil {
			return nil, fmt.Errorf("read the dead letters (%d of %d): %w", len(got), len(ids), err)
		}
		for _, m := range buf[:n] {
			env, err := dlq.Decode(m.Headers)
			if err != nil {
				return nil, err
			}
			if ids[m.EventID()] {
				got[m.EventID()] = env
			}
			if err := t.dlq.Ack(ctx, m); err != nil {
				return nil, err
			}
		}
	}
	return got, nil
}

// outcomes records how the consumer settled each event (a
// consumer.Observer).
type outcomes struct {
	mu      sync.Mutex
	want    int
	settled map[string]consumer.Outcome // Acked or DeadLettered, by event ID
	all     chan struct{}               // closed once want events are settled
}

func newOutcomes(want int) *outcomes {
	return &outcomes{want: want, settled: map[string]consumer.Outcome{}, all: make(chan struct{})}
}

func (o *outcomes) Observe(m *ackwise.Message, out consumer.Outcome, _ time.Duration) {
	if out != consumer.Acked && out != consumer.DeadLettered {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	n := len(o.settled)
	if out == consumer.DeadLettered || o.settled[m.EventID()] != consumer.DeadLettered {
		o.settled[m.EventID()] = out
	}
	if n < o.want && len(o.settled) == o.want {
		close(o.all)
	}
}

func (o *outcomes) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.settled)
}

// deadLettered returns the event IDs the consumer dead-lettered.
func (o *outcomes) deadLettered() map[string]bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	ids := map[string]bool{}
	for id, out := range o.settled {
		if out == consumer.DeadLettered {
			ids[id] = true
		}
	}
	return ids
}

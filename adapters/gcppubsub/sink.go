package gcppubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"cloud.google.com/go/pubsub/v2"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// Sink publishes to one Pub/Sub topic through the v2 publisher, with
// message ordering enabled: a message's Key is its OrderingKey.
type Sink struct {
	client *pubsub.Client
	pub    *pubsub.Publisher
	log    *slog.Logger

	mu     sync.RWMutex // held shared by Publish, exclusively by Close
	closed bool
}

var _ adapters.Sink = (*Sink)(nil)

// NewSink opens a publisher on the topic. It does not check the topic
// exists: the first Publish does.
func NewSink(ctx context.Context, cfg SinkConfig) (*Sink, error) {
	switch {
	case cfg.Project == "":
		return nil, errors.New("gcppubsub: SinkConfig.Project is empty")
	case cfg.Topic == "":
		return nil, errors.New("gcppubsub: SinkConfig.Topic is empty")
	case cfg.Endpoint != "" && cfg.Emulator != "":
		return nil, errors.New("gcppubsub: SinkConfig.Endpoint and SinkConfig.Emulator are both set")
	}
	client, err := newClient(ctx, cfg.Project, cfg.Endpoint, cfg.Emulator, cfg.ClientOptions)
	if err != nil {
		return nil, err
	}
	pub := client.Publisher("projects/" + cfg.Project + "/topics/" + cfg.Topic)
	if cfg.Publish != nil {
		pub.PublishSettings = *cfg.Publish
	}
	pub.EnableMessageOrdering = true
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sink{client: client, pub: pub, log: log.With("topic", pub.String())}, nil
}

// Publish publishes msgs and awaits every result. A message's attributes
// are its headers (the last value of a repeated key; the engine's hop
// headers dropped) and its event ID (Message.EventID) as ackwise-event-id;
// its Key is its ordering key. The failures are listed in an
// *adapters.PublishError. A failure on an ordering key pauses that key in
// the client (the messages of the key after it fail too, with
// pubsub.ErrPublishingPaused); Publish resumes the key once every result
// is in, and each failed message's error says so: publishing it again
// may put it after messages of its key published since.
func (s *Sink) Publish(ctx context.Context, msgs ...*ackwise.Message) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return adapters.ErrClosed
	}
	results := make([]*pubsub.PublishResult, len(msgs))
	for i, m := range msgs {
		results[i] = s.pub.Publish(ctx, toPubsub(m))
	}
	errs := make([]error, len(msgs))
	paused := map[string]bool{}
	for i, r := range results {
		if _, err := r.Get(ctx); err != nil {
			errs[i] = err
			if k := msgs[i].Key; k != "" {
				paused[k] = true
			}
		}
	}
	for k := range paused {
		s.pub.ResumePublish(k)
	}
	if len(paused) > 0 {
		s.log.Warn("gcppubsub: publishing failed on ordering keys, which were resumed: a message published again may come after later messages of its key", "keys", len(paused))
	}
	for i, err := range errs {
		if err == nil {
			continue
		}
		if k := msgs[i].Key; k != "" {
			errs[i] = fmt.Errorf("gcppubsub: publish of ordering key %q failed, and the key was resumed: %w", k, err)
		} else {
			errs[i] = fmt.Errorf("gcppubsub: publish failed: %w", err)
		}
	}
	return adapters.NewPublishError(errs)
}

// toPubsub returns the Pub/Sub message of m.
func toPubsub(m *ackwise.Message) *pubsub.Message {
	attrs := make(map[string]string, len(m.Headers)+1)
	for _, kv := range m.Headers {
		if ackwise.IsHopHeader(kv.Key) {
			continue
		}
		attrs[kv.Key] = kv.Value
	}
	if id := m.EventID(); id != "" {
		attrs[ackwise.HeaderEventID] = id
	}
	return &pubsub.Message{Data: m.Payload, Attributes: attrs, OrderingKey: m.Key}
}

// Close flushes, waits for the outstanding publishes and closes the client.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.pub.Stop()
	return s.client.Close()
}

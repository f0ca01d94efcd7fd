package memory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// Sink publishes into one queue or topic.
//
// Publish returns once every message is stored: the in-memory equivalent of
// a publisher confirm. It copies each message's payload and headers, so the
// caller may reuse its buffers at once. It sets the ackwise-event-id header
// from Message.ID; a message with an empty ID keeps its headers as they are
// (the broker never invents an ID; an ID already in the headers is used as
// the stored message's ID). It drops the engine's hop headers
// ackwise-attempt and ackwise-first-failure, as the Kafka and RabbitMQ
// sinks do: a handler that forwards the headers of a retry publishes a new
// message, not a retry. Publish may be called concurrently.
type Sink struct {
	b      *Broker
	d      destination
	closed atomic.Bool
	obs    *observer // opened by URL with a logger, meter or tracer provider
}

var _ adapters.Sink = (*Sink)(nil)

// Name returns the queue or topic the sink publishes into.
func (s *Sink) Name() string { return s.d.base().name }

// Publish stores msgs in order. On a topic each message goes to the
// partition of its key. It fails with adapters.ErrClosed after Close,
// ErrNotFound once the destination was deleted, ErrUnavailable during an
// outage and ctx's error when ctx is done, storing none of msgs. An
// injected publish fault stops it at the matching message: the messages
// before it are stored, and Publish returns an *adapters.PublishError that
// lists the matching message with the fault's error (stored all the same
// with AfterStore) and each later one as not attempted.
func (s *Sink) Publish(ctx context.Context, msgs ...*ackwise.Message) error {
	if s.closed.Load() {
		return adapters.ErrClosed
	}
	for i, m := range msgs {
		if m == nil {
			return fmt.Errorf("memory: Publish: msgs[%d] is nil", i)
		}
	}
	at, err := s.b.publishInto(ctx, s.d, withoutHopHeaders(msgs))
	if at < 0 {
		return err
	}
	if s.obs != nil {
		k := FaultFailPublish
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			k = FaultHangPublish
		}
		s.obs.report(ctx, Event{Kind: EventFault, Fault: k, Dest: s.Name(), ID: msgs[at].EventID()})
	}
	errs := make([]error, len(msgs))
	errs[at] = err
	for i := at + 1; i < len(msgs); i++ {
		errs[i] = fmt.Errorf("memory: publish to %q: msgs[%d] not attempted: msgs[%d] failed first", s.Name(), i, at)
	}
	return adapters.NewPublishError(errs)
}

// withoutHopHeaders returns msgs, with copies in place of the messages that
// carry ackwise-attempt or ackwise-first-failure (the caller's are left as
// they are) made without them.
func withoutHopHeaders(msgs []*ackwise.Message) []*ackwise.Message {
	var out []*ackwise.Message
	hop := func(h ackwise.Header) bool { return ackwise.IsHopHeader(h.Key) }
	for i, m := range msgs {
		if !slices.ContainsFunc(m.Headers, hop) {
			continue
		}
		if out == nil {
			out = slices.Clone(msgs)
		}
		c := *m
		c.Headers = slices.DeleteFunc(m.Headers.Clone(), hop)
		out[i] = &c
	}
	if out == nil {
		return msgs
	}
	return out
}

// Close makes later Publish calls fail with adapters.ErrClosed. Nothing is
// buffered, so there is nothing to flush.
func (s *Sink) Close() error {
	s.closed.Store(true)
	return nil
}

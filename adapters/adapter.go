package adapters

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// ErrReceiptInvalid is returned (wrapped) by a settle call whose delivery can
// no longer be settled by this consumer: the channel that delivered it died,
// its Kafka partition was revoked, its visibility timeout ran out. The broker
// redelivers such a message; the engine counts it and moves on.
var ErrReceiptInvalid = errors.New("adapters: receipt no longer valid")

// ErrClosed is returned by calls on a closed source or sink.
var ErrClosed = errors.New("adapters: closed")

// Capabilities says what a source's broker can do. The engine picks its
// strategy from these flags, never from type assertions. The optional parts
// of a source that change what a call costs or how soon something happens,
// never what the engine does ([Recycler], [BatchAcker], [Detacher],
// [Invalidator]), are declared apart, in [Extensions].
type Capabilities struct {
	// Log means the source is a partitioned log (Kafka): messages carry
	// Partition and Offset, Ack marks a record settled, and the source commits
	// an offset only once every record below it is settled (invariant 2).
	Log bool
	// Delay means Nack redelivers after the given delay through the broker's
	// own mechanism (visibility timeout, wait queue, retry topic, nack with a
	// retry policy). Without it the engine retries in place.
	Delay bool
	// MaxDelay is the longest delay Nack honours (SQS: 12h); longer delays are
	// cut to it. Zero means no limit.
	MaxDelay time.Duration
	// DelayTiers, when set, are the only delays Nack can honour (one wait
	// queue or retry topic per tier); the adapter rounds a delay up to the next
	// tier. Set, they are the adapter's word that its user named tiers: the
	// engine's default retry mode then retries through the broker, even on
	// an Ordered source (consumer.RetryAuto).
	DelayTiers []time.Duration
	// Lease is how long a delivery stays invisible to other consumers before
	// the broker redelivers it; zero where deliveries have no lease (a log
	// partition owned by this member).
	Lease time.Duration
	// ExtendLease means ExtendLease pushes the lease back. The engine
	// heartbeats in-flight messages at a third of Lease.
	ExtendLease bool
	// DeliveryCount means Attempt comes from the broker's own count, so it
	// survives consumer crashes and restarts.
	DeliveryCount bool
	// Ordered means the broker delivers messages of one key in publish order
	// (a log partition, an SQS FIFO group, a Pub/Sub ordering key).
	Ordered bool
	// BrokerDeadLetters means DeadLetter writes no dead letter: it hands
	// the message back, and the broker's own policy moves it to its
	// dead-letter destination once its delivery count reaches the limit
	// (an SQS RedrivePolicy's maxReceiveCount), as the broker holds it,
	// without the dlq envelope. A message that failed permanently before
	// that limit is delivered, and handled, again until then.
	BrokerDeadLetters bool
}

// Source delivers messages from one queue, subscription or consumer group.
//
// The engine calls Receive from one goroutine and the settle methods (Ack,
// Nack, DeadLetter, Release, ExtendLease) from many, concurrently; a Source
// must be safe for that. Each delivered message is settled at most once:
// the engine does, and a Source fails a second settle of a delivery without
// acting on it.
type Source interface {
	// Receive fills buf with up to len(buf) messages and returns how many it
	// filled. It blocks until at least one message is there, ctx is done, or
	// the source is closed (then it returns ErrClosed). The engine bounds the
	// messages in flight by the length of buf; a Source never holds more
	// unsettled deliveries than the engine asked for plus one broker batch.
	Receive(ctx context.Context, buf []*ackwise.Message) (int, error)

	// Ack settles msg as done: the broker will not deliver it again. On a log
	// it marks the record settled; its offset is committed once all records
	// below it are settled.
	Ack(ctx context.Context, msg *ackwise.Message) error

	// Nack asks for msg to be delivered again after delay, as attempt
	// msg.Attempt+1. Adapters that move the message (a wait queue, a retry
	// topic) settle the original only after the broker confirmed the move
	// (invariant 3). Sources without Capabilities.Delay return an error.
	Nack(ctx context.Context, msg *ackwise.Message, delay time.Duration) error

	// DeadLetter moves msg to the dead-letter destination with env added to
	// its headers, payload and original headers unchanged, and settles it at
	// its source once the broker confirmed the dead letter (invariants 3 and
	// 4).
	DeadLetter(ctx context.Context, msg *ackwise.Message, env dlq.Envelope) error

	// Release hands msg back unsettled, for redelivery as soon as the broker
	// allows (shutdown, a lost partition). It is never an acknowledgement: on
	// a log the offset is simply not committed.
	Release(ctx context.Context, msg *ackwise.Message) error

	// ExtendLease pushes msg's lease to d from now. Sources without
	// Capabilities.ExtendLease do nothing and return nil, or an error
	// where a lease exists but cannot be extended (a Kafka share group on
	// brokers before 4.2); the engine calls it only when the capability is
	// set. The engine's
	// heartbeat runs concurrently with settles, so ExtendLease can arrive
	// after msg was settled: it must then change nothing (a released or
	// nacked message is not held for the lease) and return nil or
	// ErrReceiptInvalid. It also runs while the engine changes the fields
	// it owns once a message is delivered (Attempt and FirstFailure, on an
	// in-place retry; Payload, through Detacher): ExtendLease and Valid
	// must not read those; the delivery's own state belongs in its Handle.
	ExtendLease(ctx context.Context, msg *ackwise.Message, d time.Duration) error

	// Valid reports whether msg is still this consumer's to handle (its Kafka
	// partition was not revoked, its channel is alive). The engine checks it
	// before running a handler and releases a message that is no longer valid.
	// It must be cheap.
	Valid(msg *ackwise.Message) bool

	// Capabilities describes the broker behind the source.
	Capabilities() Capabilities

	// Extensions declares the optional parts the source implements; see
	// [Extensions] for what a wrapper around a source must do with them.
	Extensions() Extensions

	// Close stops receiving and commits what is settled. Unsettled deliveries
	// are left to the broker to redeliver.
	Close() error
}

// Extensions are the optional parts of a [Source]: each field is the
// source's implementation of that part (usually the source itself), or nil
// when the source does not have it. They change what a call costs or how
// soon something happens, never what the engine does, so a source may leave
// every field nil. The engine reads them once, in consumer.New, and uses
// each one declared; nothing looks for them by type assertion. A source
// returns the same Extensions from every call, and the conformance suite
// (package adaptertest) checks each one it declares.
//
// A wrapper that embeds a Source inherits its Extensions, and with them
// calls that reach the wrapped source around the wrapper's own methods. So
// a wrapper that changes what a method does overrides Extensions and drops
// (or replaces with its own) each field that stands in for that method or
// relies on it:
//   - one that changes Ack drops or replaces BatchAcker, whose AckBatch
//     would ack around it;
//   - one that changes Valid (says no where the wrapped source says yes)
//     does not pass Invalidator through unchanged: the engine is to be told
//     when the wrapper's Valid turns false, which the wrapped source does
//     not know; with Invalidator nil, the engine learns it when a wait ends;
//   - one that hands out messages of its own (copies, other Message values)
//     drops Recycler and Detacher: they act only on the messages the wrapped
//     source delivered, and ignore others;
//   - one that changes Receive, Nack, DeadLetter, Release or ExtendLease
//     keeps them all: none of the four stands in for those.
//
// dlq.Backlogger (a destination's depth, for dlq.Redrive and the CLI's dlq
// stats) is not among them: the engine never asks for it; see its
// documentation.
type Extensions struct {
	// Recycler takes back delivered messages for reuse.
	Recycler Recycler
	// BatchAcker acks finished messages together, for less than one Ack
	// each.
	BatchAcker BatchAcker
	// Detacher gives a message waiting in place memory of its own.
	Detacher Detacher
	// Invalidator tells the engine when deliveries stop being Valid.
	Invalidator Invalidator
	// AttemptsChecker checks the consumer's max attempts against the
	// broker's own delivery count for dead letters.
	AttemptsChecker AttemptsChecker
}

// AttemptsChecker is implemented by sources whose broker also counts
// deliveries toward a dead-letter move of its own: an SQS queue's
// RedrivePolicy (maxReceiveCount), a Pub/Sub subscription's dead-letter
// policy (MaxDeliveryAttempts). consumer.New calls CheckAttempts once with
// the max attempts of the consumer's retry policy (defaults applied;
// retry.Unlimited is -1), so that the two are checked where they are used
// together, whatever the source's own configuration says. An error, which
// names both counts, fails New: the broker would move messages the consumer
// still retries, or the consumer give up on messages the broker does not
// move yet. A mismatch the source only advises against is logged, not
// returned.
type AttemptsChecker interface {
	CheckAttempts(maxAttempts int) error
}

// Recycler is implemented by sources that reuse the memory of delivered
// messages, to spare the garbage collector one Message per delivery. The
// engine calls Recycle once for every message it received (in batches),
// when it is done with it: after the message was settled or released, observed, and the next
// message of its key released. From then on the source may hand out the same
// *Message again, so nothing may use msg after Recycle: handlers,
// middleware and observers must not keep a message (or its Headers) beyond
// their call, as the Message contract says. A message whose handler is still
// running past the drain deadline is recycled only once that handler
// returns. Callers that drive a source directly need not call Recycle.
type Recycler interface {
	// Recycle takes back messages this source delivered. It is safe for
	// concurrent use and ignores messages it did not deliver.
	Recycle(msgs ...*ackwise.Message)
}

// Detacher is implemented by sources whose messages share memory with
// other records: a Kafka message's Payload points into the fetch (or the
// decompressed record batch) it came from, and keeps all of it alive as long
// as the message is kept. Detach gives msg's Payload memory of its own. The
// engine calls it when a message starts waiting in place (a retry in place,
// a failed move tried again, a redelivery held after a failed settle, a
// message held by the open breaker), which may last long: without it, every
// waiting message would keep a whole fetch in memory. It is called while no
// handler runs msg, and must be safe for concurrent use on different
// messages.
type Detacher interface {
	// Detach gives msg memory of its own; it ignores messages this source
	// did not deliver.
	Detach(msg *ackwise.Message)
}

// Invalidator is implemented by sources whose deliveries stop being Valid
// on an event: a Kafka partition revoked, a RabbitMQ channel closed or a
// delivery held past its ConsumerTimeoutWarn, a Kafka share source or a
// memory source closed, a memory log partition that changed hands. A lease
// that runs out is time, not an event: no source tells of it. The engine
// checks Valid when a message's wait in place ends (a retry in place, a
// failed move tried again, a held redelivery) and when an open breaker
// probes with it, and a message stays in flight while it waits or is held:
// told of the event, it hands back at once the waiting and held messages no
// longer Valid, so that a revoke waiting for a partition's messages in
// flight, or the redeliveries of a dead channel's messages queued behind
// them, do not wait for their timers (up to 5s for a failed move, the whole
// retry delay for a retry in place, the probe interval for a message the
// breaker holds). Without it they are handed back when their wait ends or
// the probe reaches them.
type Invalidator interface {
	// OnInvalid sets f, which the source calls each time messages it
	// delivered stopped being Valid, after Valid began to return false for
	// them (a message that stopped being Valid never is again). The source
	// calls f without holding its own locks; f may call Valid, and must
	// return quickly without waiting on the source. A later call replaces f; nil
	// removes it. The engine sets it when Run starts.
	OnInvalid(f func())
}

// InvalidHook implements Invalidator for a source that embeds it: the
// source calls Invalidated when deliveries stopped being Valid. The zero
// value is ready to use and safe for concurrent use.
type InvalidHook struct {
	f atomic.Pointer[func()]
}

// OnInvalid sets f (see Invalidator); nil removes it.
func (h *InvalidHook) OnInvalid(f func()) {
	if f == nil {
		h.f.Store(nil)
		return
	}
	h.f.Store(&f)
}

// Invalidated calls the function OnInvalid set, if any. Call it without
// holding locks that function's Valid calls need.
func (h *InvalidHook) Invalidated() {
	if f := h.f.Load(); f != nil {
		(*f)()
	}
}

// BatchAcker is implemented by sources that ack a batch of messages for
// less than acking each one (one lock, one call). The engine acks the
// messages its workers finished together through AckBatch when the source
// declares it (Extensions.BatchAcker), and through Ack otherwise. A wrapper
// that embeds a source and changes Ack must drop or replace BatchAcker in
// the Extensions it returns: the engine would otherwise ack through the
// embedded source's AckBatch, around the wrapper's Ack.
type BatchAcker interface {
	// AckBatch acks each of msgs as Ack would, in order, and sets errs[i]
	// to the error Ack would have returned for msgs[i] (nil once acked).
	// len(errs) must equal len(msgs). It is safe for concurrent use.
	AckBatch(ctx context.Context, msgs []*ackwise.Message, errs []error)
}

// Sink publishes messages to one topic, exchange or queue.
//
// Publish may be called concurrently.
type Sink interface {
	// Publish returns once the broker confirmed every message (publisher
	// confirms, acks=all, a SendMessage response) or refused some.
	//
	// Once it handed messages to the broker, Publish reports per message: it
	// returns a *[PublishError] listing each message that was not confirmed
	// with its own error (a record too large, a nack, a basic.return), and a
	// message not listed was confirmed. A message whose fate it cannot know
	// (ctx ended before its confirm came, the connection was lost) is listed
	// with that error: it may still be published. Any other error (a closed
	// sink, ctx done before anything was sent, a broker outage) stands for
	// every message, as a PublishError listing them all with it would; some
	// of them may then have been published too.
	//
	// Publishing a failed message again is safe for consumers that
	// deduplicate on the stable event ID, which Publish sets from Message.ID
	// (header ackwise-event-id); [PublishFailures] tells which to publish
	// again whatever error Publish returned.
	Publish(ctx context.Context, msgs ...*ackwise.Message) error

	// Close flushes and waits for outstanding confirmations.
	Close() error
}

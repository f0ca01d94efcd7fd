package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// Sink produces to one topic with acks=all and idempotent writes. Records
// with a key go to the partition of the key (murmur2, as the Java client
// does); records without one are spread. Publish may be called concurrently.
type Sink struct {
	cfg     SinkConfig
	cl      *kgo.Client
	mu      sync.RWMutex // guards closed, held only to read or set it
	closed  bool
	closeMu sync.Mutex // serializes Close: a second Close waits for the first

	closeFlushTimeout time.Duration // how long Close flushes; tests shorten it
}

var _ adapters.Sink = (*Sink)(nil)

// NewSink returns a sink on cfg.Topic once a broker answered. It fails when
// the config is invalid (the error names the field and value) or no broker
// can be reached before ctx is done.
//
// It reads the topic's max.message.bytes (when it can: the topic exists and
// DescribeConfigs is allowed) and batches records under it, so that the
// broker never refuses a batch of records that each fit: franz-go batches up
// to 1,000,012 bytes a partition, and does not split a refused batch. A
// limit lowered later is not followed (a batch over it is refused as a
// whole, see Publish); kgo.ProducerBatchMaxBytes in Options overrides it.
// franz-go measures a record before compression: one over the limit that
// would compress under it is refused too.
func NewSink(ctx context.Context, cfg SinkConfig) (*Sink, error) {
	cfg.ClientConfig = cfg.ClientConfig.withDefaults()
	if err := cfg.ClientConfig.validate(fieldsOf("SinkConfig"), cfg.Topic); err != nil {
		return nil, err
	}
	limits := new(batchLimits)
	opts := append(cfg.ClientConfig.opts(),
		kgo.DefaultProduceTopic(cfg.Topic),
		// Key -> partition with the Java client's hashing, so that other
		// producers of the same keys agree on partitions.
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		limits.opt(),
	)
	opts = append(opts, cfg.Options...)
	cl, err := newClient(ctx, cfg.optionsName("SinkConfig"), cfg.Brokers, opts, nil)
	if err != nil {
		return nil, err
	}
	limits.read(ctx, cl, cfg.Topic)
	return &Sink{cfg: cfg, cl: cl, closeFlushTimeout: 30 * time.Second}, nil
}

// newClient makes the client and returns it once one of brokers answered;
// optionsName names the config's Options in errors. Options come last, so they could weaken the
// guarantees the adapter documents: it refuses those weakerProduce reports,
// and those check (when not nil) reports, rather than produce with fewer.
func newClient(ctx context.Context, optionsName string, brokers []string, opts []kgo.Opt, check func(*kgo.Client) error) (*kgo.Client, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: new client: %w", err)
	}
	err = weakerProduce(optionsName, cl)
	if err == nil && check != nil {
		err = check(cl)
	}
	if err == nil {
		if perr := cl.Ping(ctx); perr != nil {
			err = fmt.Errorf("kafka: cannot reach brokers %v (TLS or SASL misconfigured?): %w", brokers, perr)
		}
	}
	if err != nil {
		cl.Close()
		return nil, err
	}
	return cl, nil
}

// weakerProduce reports Options (named optionsName in errors) that turned off
// idempotent writes or acks=all: the sink publishes, and the sources move
// records to retry and dead-letter topics, with both, confirmed before an
// offset is committed past.
func weakerProduce(optionsName string, cl *kgo.Client) error {
	if off, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); off {
		return fmt.Errorf("kafka: %s disable idempotent writes: records are produced idempotently, with acks=all", optionsName)
	}
	if acks, ok := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); ok && acks != kgo.AllISRAcks() {
		return fmt.Errorf("kafka: %s set acks other than all: records are produced idempotently, with acks=all", optionsName)
	}
	return nil
}

// Client returns the franz-go client behind the sink.
func (s *Sink) Client() *kgo.Client { return s.cl }

// Publish produces msgs and returns once the broker acknowledged (acks=all)
// or refused each: nil when it acknowledged all, else an
// *adapters.PublishError listing each record that failed with its error (a
// record the broker refuses for good, such as one over the topic's
// max.message.bytes, marked ackwise.Permanent) and each record still
// unconfirmed when ctx ended, with ctx's error (it may still be written).
// After Close it returns adapters.ErrClosed. Header ackwise-event-id is set
// from Message.ID, replacing any the message carries; a message without an
// ID keeps the one it has. The engine's hop headers ackwise-attempt and
// ackwise-first-failure are not published (a handler that forwards the
// headers of a retry must not make the new record start at that retry's
// attempt); the other headers go out as they are.
//
// Kafka refuses a batch of records of one partition as a whole: a record
// too large for the broker fails the records that franz-go batched with it
// (same partition, same moment) with the same error. Under the
// max.message.bytes NewSink read, a record too large fails alone, before it
// is sent.
func (s *Sink) Publish(ctx context.Context, msgs ...*ackwise.Message) error {
	if len(msgs) == 0 {
		if s.isClosed() {
			return adapters.ErrClosed
		}
		return nil
	}
	recs := make([]*kgo.Record, len(msgs))
	backing := make([]kgo.Record, len(msgs))
	for i, m := range msgs {
		r := &backing[i]
		r.Topic = s.cfg.Topic
		r.Value = m.Payload
		if m.Key != "" {
			r.Key = []byte(m.Key)
		}
		r.Headers = recordHeaders(m)
		recs[i] = r
	}
	// No lock is held while the records are handed to the client: Produce
	// blocks while the client's buffer is full (kgo.MaxBufferedRecords),
	// which, with the broker gone, lasts until the client is closed, and
	// Close must still get to close it. Close flushes (boundedly) and
	// closes the client, which fails what is still unconfirmed, a record
	// waiting for room in the buffer, and a record handed to it afterwards
	// (ErrClientClosed), so this wait ends.
	if s.isClosed() {
		return adapters.ErrClosed
	}
	return adapters.NewPublishError(produceConfirmed(ctx, s.cl, recs, func(err error) error { return produceError(s.cfg.Topic, err) }))
}

func (s *Sink) isClosed() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.closed
}

// produceConfirmed produces recs and waits for the broker to confirm them
// all, or for ctx to end. It returns each record's outcome: nil once
// confirmed, its error, or ctx's for a record still unconfirmed when ctx
// ended; wrap, when not nil, is applied to each error. Not ProduceSync: with
// idempotent writes franz-go keeps retrying a record it may have sent, past
// ctx, for as long as the broker is unreachable. The records may still be
// written after ctx ended (a duplicate, if the caller produces them again).
func produceConfirmed(ctx context.Context, cl *kgo.Client, recs []*kgo.Record, wrap func(error) error) []error {
	var (
		mu   sync.Mutex
		errs = make([]error, len(recs))
		done = make([]bool, len(recs))
		wg   sync.WaitGroup
	)
	if wrap == nil {
		wrap = func(err error) error { return err }
	}
	wg.Add(len(recs))
	for i, r := range recs {
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				err = wrap(err)
			}
			mu.Lock()
			errs[i], done[i] = err, true
			mu.Unlock()
			wg.Done()
		})
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
		return errs
	case <-ctx.Done():
	}
	unconfirmed := wrap(fmt.Errorf("not confirmed: %w", ctx.Err()))
	mu.Lock()
	defer mu.Unlock()
	out := make([]error, len(recs)) // errs is still written by late promises
	for i := range out {
		out[i] = errs[i]
		if !done[i] {
			out[i] = unconfirmed
		}
	}
	return out
}

// produceOne produces rec and waits for the broker to confirm it, as
// produceConfirmed does.
func produceOne(ctx context.Context, cl *kgo.Client, rec *kgo.Record) error {
	return produceConfirmed(ctx, cl, []*kgo.Record{rec}, nil)[0]
}

// recordHeaders converts m's headers for a record a user publishes (Sink,
// TransactSession outputs; not a retry-topic hop or a dead letter). When
// m.ID is set it is the event ID (Message.EventID) and the record's only
// ackwise-event-id, first; a header the message carried under that name
// (stale, copied from another event, or empty) is dropped. Without m.ID
// that header passes as it is. The engine's hop headers ackwise-attempt
// and ackwise-first-failure are dropped: copied from a retry a handler
// handled, they would count a new message's attempts from that retry's.
func recordHeaders(m *ackwise.Message) []kgo.RecordHeader {
	n := len(m.Headers)
	if m.ID != "" {
		n++
	}
	if n == 0 {
		return nil
	}
	hs := make([]kgo.RecordHeader, 0, n)
	if m.ID != "" {
		hs = append(hs, kgo.RecordHeader{Key: ackwise.HeaderEventID, Value: []byte(m.ID)})
	}
	for _, kv := range m.Headers {
		switch {
		case m.ID != "" && kv.Key == ackwise.HeaderEventID, ackwise.IsHopHeader(kv.Key):
			continue
		}
		hs = append(hs, kgo.RecordHeader{Key: kv.Key, Value: []byte(kv.Value)})
	}
	return hs
}

// Close waits (at most 30s) for outstanding produces (Flush) and closes the
// client; records still unconfirmed then fail, and the Publish calls waiting
// for them return their error. It is idempotent.
func (s *Sink) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	s.mu.Lock()
	was := s.closed
	s.closed = true
	s.mu.Unlock()
	if was {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.closeFlushTimeout)
	defer cancel()
	err := s.cl.Flush(ctx)
	s.cl.Close()
	if err != nil {
		return fmt.Errorf("kafka: flush on close: %w", err)
	}
	return nil
}

// produceError wraps a failed produce. A broker error that retrying cannot
// cure (a record too large, an authorization failure: franz-go already
// retried the others) is marked ackwise.Permanent, so that a retrying
// caller (producer.Publisher) stops at once instead of after every attempt.
func produceError(topic string, err error) error {
	if errors.Is(err, kgo.ErrClientClosed) {
		// Close failed it: what Publish returns after Close, so that a
		// retrying caller stops (the record may still have been written).
		return fmt.Errorf("kafka: produce to %s: %w: %w", topic, adapters.ErrClosed, err)
	}
	err = fmt.Errorf("kafka: produce to %s: %w", topic, err)
	var ke *kerr.Error
	if errors.As(err, &ke) && !ke.Retriable {
		return ackwise.Permanent(err)
	}
	return err
}

package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// DefaultTransactBatch is the most records in one transaction when
// TransactConfig.PollBatch is 0: a transaction holds its outputs until it
// commits.
const DefaultTransactBatch = 1024

// TransactConfig configures a [TransactSession] (NewTransactSession). The
// zero value of every field but Brokers, Topic, Group and TransactionalID
// means the documented default.
type TransactConfig struct {
	ClientConfig
	// Topic is the input topic. Required.
	Topic string
	// Group is the consumer group. Required.
	Group string
	// TransactionalID is the producer's transactional ID. It must be
	// stable across restarts of the same logical worker and unique among
	// running workers: a restarted worker with the same ID fences the old
	// one. Required.
	TransactionalID string
	// PollBatch is the most records in one transaction. Zero means
	// DefaultTransactBatch.
	PollBatch int
	// FetchMaxBytes and FetchMaxPartitionBytes bound the client's fetches,
	// as in SourceConfig. Zero means the client's defaults.
	FetchMaxBytes          int32
	FetchMaxPartitionBytes int32
	// StartOffset is where a group with no committed offset starts:
	// "earliest" (the default) or "latest".
	StartOffset string
}

func (c TransactConfig) consume() consumeFields {
	return consumeFields{fieldsOf("TransactConfig"), c.ClientConfig, c.Topic, c.Group, c.StartOffset, c.PollBatch, c.FetchMaxBytes, c.FetchMaxPartitionBytes}
}

// Output is one record a [Transform] emits.
type Output struct {
	// Topic is where the record goes. Required.
	Topic string
	// Key picks the partition; empty means no key.
	Key string
	// Payload is the record value.
	Payload []byte
	// Headers are the record headers, but ackwise-attempt and
	// ackwise-first-failure, which are dropped as [Sink.Publish] drops them.
	Headers ackwise.Headers
	// ID, when set, is written as header ackwise-event-id, in place of any
	// such header in Headers (one copied from the input, say).
	ID string
}

// Transform handles one input message and emits its outputs. It runs inside
// the transaction of the batch the message came in: returning an error
// aborts the whole batch (its outputs are never visible to read_committed
// consumers, its input offsets are not committed) and the batch is consumed
// again, after a pause that doubles with each failed attempt in a row (100ms
// up to 10s, with jitter). A Transform that fails for ever on one record
// therefore stalls the session: handle permanent failures inside it, for
// example by emitting the record to a dead-letter topic, which then commits
// exactly once as well. A record consumed again after an abort comes with
// Attempt one higher and FirstFailure set (every record the aborted batch
// delivered, not only the failing one), so a Transform can dead-letter a
// record that failed too often; the count is kept by the session in memory
// and starts again from 1 on another member, after a restart, or when the
// session, counting more than 65,536 records, forgets all but those of the
// batch it just aborted (records of partitions lost after an abort are
// never committed here). A panic in a Transform aborts the transaction (the batch
// is consumed again, its attempts counted), then goes on out of Run.
type Transform func(ctx context.Context, in *ackwise.Message, emit func(Output)) error

// TransactSession is Kafka-to-Kafka exactly-once processing
// (consume-transform-produce) on franz-go's GroupTransactSession: the outputs
// of a batch and the batch's input offsets commit in one Kafka transaction,
// or not at all. Consumers of the outputs must read with read_committed
// isolation (the ackwise Source does). A rebalance during a batch aborts it,
// and the next owner consumes it again. A batch must end within the
// producer's transaction timeout (kgo.TransactionTimeout in Options, 40s by
// default), counted from its first output: the broker aborts a longer
// transaction, nothing of the batch is committed, and the session's late
// commit fails (as fenced, on kfake), which ends Run with an error that
// matches [ErrTransactionTimeout] as well as the broker's error. Where
// franz-go recovers from the abort instead (a broker that answers
// TRANSACTION_ABORTABLE, say), Run goes on, logs that error at Warn level and
// consumes the batch again. A batch still running at 80% of the timeout is
// logged at Warn level.
//
// It is an opt-in mode beside [Source]: it does not run handlers through the
// consumer engine, has no retry topics, and settles whole batches, not
// records. Run must not be called concurrently with itself.
type TransactSession struct {
	cfg  TransactConfig
	sess *kgo.GroupTransactSession
	log  *slog.Logger
	// endTimeout bounds the flush of a batch's outputs, and separately the
	// End of its transaction; tests shorten it.
	endTimeout time.Duration
	// txnTimeout is the producer's transaction timeout; 0 if unknown.
	txnTimeout time.Duration
	// attempts counts the deliveries of records whose batch was aborted,
	// until a batch commits them (Run's goroutine only).
	attempts map[txnRecord]txnAttempt

	closeOnce sync.Once
}

// ErrTransactionTimeout is matched (with errors.Is) by the error Run returns
// when ending a batch's transaction failed and the transaction had run
// longer than the producer's transaction timeout: the broker aborted it,
// and nothing of the batch was committed. The error also wraps the broker's
// (PRODUCER_FENCED, say). Shorten batches (TransactConfig.PollBatch, the
// fetch limits) or raise kgo.TransactionTimeout.
var ErrTransactionTimeout = errors.New("kafka: transaction ran longer than the transaction timeout")

// txnTimeoutError is an error of a transaction that ran longer than the
// transaction timeout: it names both, and matches ErrTransactionTimeout and
// err.
type txnTimeoutError struct {
	ran, timeout time.Duration
	err          error
}

func (e *txnTimeoutError) Error() string {
	return fmt.Sprintf("kafka: batch's transaction ran %v, longer than the transaction timeout %v: "+
		"the broker aborts such a transaction, so nothing of the batch was committed; "+
		"shorten batches (TransactConfig.PollBatch, fetch limits) or raise kgo.TransactionTimeout: %v",
		e.ran.Round(time.Millisecond), e.timeout, e.err)
}

func (e *txnTimeoutError) Unwrap() []error { return []error{ErrTransactionTimeout, e.err} }

// txnRecord names an input record.
type txnRecord struct {
	topic     string
	partition int32
	offset    int64
}

// maxTxnAttempts bounds TransactSession.attempts (see countAttempts).
const maxTxnAttempts = 1 << 16

// txnAttempt is what is known of an input record's aborted deliveries.
type txnAttempt struct {
	n     int       // deliveries so far
	first time.Time // when the first of them was aborted
}

// NewTransactSession joins cfg.Group on cfg.Topic with a transactional
// producer. It fails when the config is invalid or no broker can be reached.
func NewTransactSession(ctx context.Context, cfg TransactConfig) (*TransactSession, error) {
	cfg.ClientConfig = cfg.ClientConfig.withDefaults()
	cfg.StartOffset = startOffset(cfg.StartOffset)
	if err := cfg.consume().validate(); err != nil {
		return nil, err
	}
	if cfg.TransactionalID == "" {
		return nil, errors.New("kafka: TransactConfig.TransactionalID is empty")
	}
	if err := refuseCommitOptions(cfg.optionsName("TransactConfig"), cfg.Options, false); err != nil {
		return nil, err
	}
	start := kgo.NewOffset().AtStart()
	if cfg.StartOffset == "latest" {
		start = kgo.NewOffset().AtEnd()
	}
	opts := append(cfg.consume().opts(),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topic),
		kgo.TransactionalID(cfg.TransactionalID),
		kgo.ConsumeResetOffset(start),
		kgo.RequireStableFetchOffsets(),
	)
	opts = append(opts, cfg.Options...)
	sess, err := kgo.NewGroupTransactSession(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: new transact session: %w", err)
	}
	if err := sess.Client().Ping(ctx); err != nil {
		sess.Close()
		return nil, fmt.Errorf("kafka: cannot reach brokers %v (TLS or SASL misconfigured?): %w", cfg.Brokers, err)
	}
	txnTimeout, _ := sess.Client().OptValue(kgo.TransactionTimeout).(time.Duration)
	return &TransactSession{cfg: cfg, sess: sess, log: cfg.Logger, endTimeout: 30 * time.Second, txnTimeout: txnTimeout, attempts: map[txnRecord]txnAttempt{}}, nil
}

// Run consumes batches and runs fn on each message until ctx is done (then
// it returns nil) or the transaction or a fetch fails in a way that cannot
// be retried, an authorization failure say (then it returns the error).
// Each batch commits exactly once: outputs and input offsets together.
func (s *TransactSession) Run(ctx context.Context, fn Transform) error {
	// Between attempts at a batch whose transform or outputs failed: the
	// same batch comes back at once, and would fail again at once.
	pause := &backoff.ExponentialBackOff{
		InitialInterval:     txnRetryMin,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         txnRetryMax,
		Clock:               backoff.SystemClock,
	}
	pause.Reset()
	for {
		if ctx.Err() != nil {
			return nil
		}
		limit := s.cfg.PollBatch
		if limit == 0 {
			limit = DefaultTransactBatch
		}
		fetches := s.sess.PollRecords(ctx, limit)
		if fetches.IsClientClosed() {
			return adapters.ErrClosed
		}
		// A Kafka error retrying will not cure (an authorization failure,
		// say) ends Run: franz-go keeps trying, and a Run that only logged
		// it (the default Logger discards) would poll for ever without a
		// word. Other errors (a broker down, data loss franz-go recovers
		// from) are only logged. The batch's records, if any, are left
		// uncommitted.
		if fatal := fetchErrors(fetches, s.log, fatalFetch); fatal != nil {
			return fatal
		}
		if fetches.NumRecords() == 0 {
			continue
		}
		failed, err := s.batch(ctx, fetches, fn)
		if err != nil {
			return err
		}
		if !failed {
			pause.Reset()
			continue
		}
		t := time.NewTimer(pause.NextBackOff())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil
		}
	}
}

// fetchErrors logs the fetch errors of fetches at Warn (but those of a
// context ended) and returns the first that fatal says ends consuming.
func fetchErrors(fetches kgo.Fetches, log *slog.Logger, fatal func(error) bool) error {
	var first error
	fetches.EachError(func(t string, p int32, err error) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return
		}
		log.Warn("kafka: fetch error", ackwise.LogKeyTopic, t, ackwise.LogKeyPartition, p, ackwise.LogKeyError, err)
		if first == nil && fatal(err) {
			first = fmt.Errorf("kafka: fetch %s/%d: %w", t, p, err)
		}
	})
	return first
}

// fatalFetch reports whether a fetch error ends Run: a Kafka error marked
// not retriable (an authorization failure, say), except franz-go's notice
// of a lost group membership, which it cures by rejoining. Other errors (a
// broker down, data loss franz-go reset past) are only logged: franz-go
// keeps trying.
func fatalFetch(err error) bool {
	ke, ok := errors.AsType[*kerr.Error](err)
	return ok && !ke.Retriable && !rejoinedGroup(err)
}

// rejoinedGroup reports franz-go's notice that the group membership was lost
// in a way it cures by rejoining (the coordinator forgot the member, its
// generation or epoch went stale): the kerr errors it wraps are marked not
// retriable, yet the session goes on, and the next End aborts the batch of
// the lost membership.
func rejoinedGroup(err error) bool {
	gs, ok := errors.AsType[*kgo.ErrGroupSession](err)
	if !ok {
		return false
	}
	for _, e := range []error{kerr.UnknownMemberID, kerr.IllegalGeneration, kerr.RebalanceInProgress, kerr.StaleMemberEpoch, kerr.FencedMemberEpoch} {
		if errors.Is(gs.Err, e) {
			return true
		}
	}
	return false
}

// The pause before a failed batch is consumed again: txnRetryMin after the
// first failure, doubling up to txnRetryMax.
const (
	txnRetryMin = 100 * time.Millisecond
	txnRetryMax = 10 * time.Second
)

// batch runs one transaction. failed reports an abort because the
// transform or an output failed.
func (s *TransactSession) batch(ctx context.Context, fetches kgo.Fetches, fn Transform) (failed bool, _ error) {
	if err := s.sess.Begin(); err != nil {
		return false, fmt.Errorf("kafka: begin transaction: %w", err)
	}
	var delivered []txnRecord
	ended := false
	defer func() {
		if ended {
			return
		}
		// The transform panicked (or called runtime.Goexit): abort before
		// the panic goes on, so that no transaction stays open (holding
		// back read_committed readers of the outputs until the broker's
		// transaction timeout) and the batch is consumed again by a Run
		// called anew.
		p := recover()
		endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.endTimeout)
		defer cancel()
		if _, err := s.sess.End(endCtx, kgo.TryAbort); err != nil {
			s.log.Warn("kafka: abort after a panic failed", ackwise.LogKeyError, err)
		} else {
			s.countAttempts(fetches, delivered, false)
		}
		if p != nil {
			panic(p)
		}
	}()
	var mu sync.Mutex
	var produceErr, fnErr error
	// The broker counts the transaction timeout from the transaction's
	// first record (from its offsets' commit in End if it has none):
	// firstOut is when the first output was produced.
	var firstOut time.Time
	var warn *time.Timer
	defer func() {
		mu.Lock()
		if warn != nil {
			warn.Stop()
		}
		mu.Unlock()
	}()
	emit := func(o Output) {
		mu.Lock()
		if firstOut.IsZero() {
			firstOut = time.Now()
			if s.txnTimeout > 0 {
				warn = time.AfterFunc(s.txnTimeout*4/5, func() {
					s.log.Warn("kafka: batch's transaction has run 80% of the transaction timeout; the broker aborts it at the timeout, and nothing of the batch is committed",
						ackwise.LogKeyTimeout, s.txnTimeout)
				})
			}
		}
		mu.Unlock()
		rec := &kgo.Record{Topic: o.Topic, Value: o.Payload}
		if o.Key != "" {
			rec.Key = []byte(o.Key)
		}
		rec.Headers = recordHeaders(&ackwise.Message{ID: o.ID, Headers: o.Headers}) // o.ID the only event ID
		s.sess.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				if produceErr == nil {
					produceErr = err
				}
				mu.Unlock()
			}
		})
	}
	fetches.EachRecord(func(r *kgo.Record) {
		if fnErr != nil || ctx.Err() != nil {
			return
		}
		m := plainMessage(r)
		rec := txnRecord{r.Topic, r.Partition, r.Offset}
		if a, ok := s.attempts[rec]; ok {
			m.Attempt, m.FirstFailure = a.n+1, a.first
		}
		delivered = append(delivered, rec)
		if err := fn(ctx, m, emit); err != nil {
			fnErr = fmt.Errorf("%s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
		}
	})
	// Flush first so that a failed output aborts instead of committing.
	// Neither the flush nor End may be cut short by ctx (that could leave
	// the transaction open until the broker's transaction timeout), and
	// each gets a bound of its own: a flush that ran out of time (a broker
	// slow to confirm) must leave End the time to abort.
	ended = true
	flushCtx, cancelFlush := context.WithTimeout(context.WithoutCancel(ctx), s.endTimeout)
	ferr := s.sess.Client().Flush(flushCtx)
	cancelFlush()
	mu.Lock()
	perr := produceErr
	start := firstOut
	mu.Unlock()
	if perr == nil && ferr != nil {
		perr = fmt.Errorf("kafka: flush outputs: not all confirmed within %v: %w", s.endTimeout, ferr)
	}
	commit := fnErr == nil && perr == nil && ctx.Err() == nil
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.endTimeout)
	defer cancel()
	committed, err := s.sess.End(endCtx, kgo.TransactionEndTry(commit))
	if err == nil {
		s.countAttempts(fetches, delivered, committed)
	}
	switch {
	case err != nil:
		if errors.Is(err, context.DeadlineExceeded) && endCtx.Err() != nil {
			err = fmt.Errorf("not ended within %v: %w", s.endTimeout, err)
		}
		return false, s.timedOut(start, fmt.Errorf("kafka: end transaction: %w", err))
	case committed:
		return false, nil
	case fnErr != nil:
		s.log.Warn("kafka: transform failed; transaction aborted, the batch will be consumed again", ackwise.LogKeyError, fnErr)
		return true, nil
	case perr != nil:
		s.log.Warn("kafka: produce failed; transaction aborted, the batch will be consumed again", ackwise.LogKeyError, s.timedOut(start, perr))
		return true, nil
	case commit && s.overran(start):
		// franz-go recovered from the broker's abort (an epoch bump):
		// the same batch will likely run as long again.
		s.log.Warn("kafka: transaction aborted; the batch will be consumed again", ackwise.LogKeyError, s.timedOut(start, errors.New("kafka: commit refused")))
	default:
		s.log.Info("kafka: transaction aborted (rebalance or shutdown); the batch will be consumed again")
	}
	return false, nil
}

// overran reports whether the transaction that started at start (zero: in
// End) has run longer than the transaction timeout.
func (s *TransactSession) overran(start time.Time) bool {
	return !start.IsZero() && s.txnTimeout > 0 && time.Since(start) > s.txnTimeout
}

// timedOut returns err, the failure of the transaction that started at
// start, wrapped in a *txnTimeoutError if the transaction has run longer
// than the transaction timeout, the likely cause then.
func (s *TransactSession) timedOut(start time.Time, err error) error {
	if !s.overran(start) {
		return err
	}
	return &txnTimeoutError{ran: time.Since(start), timeout: s.txnTimeout, err: err}
}

// countAttempts notes the deliveries of a batch that was aborted, so that
// each record comes back with Attempt one higher (a Transform can then
// dead-letter a poison record), or forgets the records of a committed batch
// and any below them in its partitions (aborted here, committed since by
// another member). A record whose partition moved to another member starts
// again from 1 there. The records of partitions this member lost after an
// abort are never committed here: when the count holds more than
// maxTxnAttempts records, all but the batch's own are forgotten, so that it
// stays bounded.
func (s *TransactSession) countAttempts(fetches kgo.Fetches, delivered []txnRecord, committed bool) {
	if !committed {
		if len(s.attempts) > maxTxnAttempts {
			// Forget all but this batch's records.
			keep := make(map[txnRecord]txnAttempt, len(delivered))
			for _, r := range delivered {
				if a, ok := s.attempts[r]; ok {
					keep[r] = a
				}
			}
			s.attempts = keep
		}
		now := time.Now()
		for _, r := range delivered {
			a := s.attempts[r]
			if a.n == 0 {
				a.first = now
			}
			a.n++
			s.attempts[r] = a
		}
		return
	}
	if len(s.attempts) == 0 {
		return
	}
	type tp struct {
		topic     string
		partition int32
	}
	ends := map[tp]int64{}
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if n := len(p.Records); n > 0 {
			ends[tp{p.Topic, p.Partition}] = p.Records[n-1].Offset + 1
		}
	})
	for r := range s.attempts {
		if end, ok := ends[tp{r.topic, r.partition}]; ok && r.offset < end {
			delete(s.attempts, r)
		}
	}
}

// Close aborts nothing (End already ran for every batch), leaves the group
// and closes the client.
func (s *TransactSession) Close() error {
	s.closeOnce.Do(s.sess.Close)
	return nil
}

// plainMessage converts a record outside any source's tracking.
func plainMessage(r *kgo.Record) *ackwise.Message {
	m := &ackwise.Message{
		Key:         string(r.Key),
		Payload:     r.Value,
		Source:      r.Topic,
		Partition:   r.Partition,
		Offset:      r.Offset,
		Attempt:     1,
		PublishedAt: r.Timestamp,
		BrokerID:    r.Topic + "/" + strconv.FormatInt(int64(r.Partition), 10) + "@" + strconv.FormatInt(r.Offset, 10),
	}
	if len(r.Headers) > 0 {
		m.Headers = make(ackwise.Headers, 0, len(r.Headers))
		for _, h := range r.Headers {
			m.Headers = append(m.Headers, ackwise.Header{Key: h.Key, Value: string(h.Value)})
		}
		m.ID = m.Headers.Get(ackwise.HeaderEventID)
	}
	return m
}

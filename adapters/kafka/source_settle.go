package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// receiptOf returns msg's receipt, or an error when msg was not delivered by
// a Source.
func receiptOf(msg *ackwise.Message) (*receipt, error) {
	if msg == nil {
		return nil, errors.New("kafka: nil message")
	}
	rc, ok := msg.Handle.(*receipt)
	if !ok || rc.p == nil {
		return nil, fmt.Errorf("kafka: message %q was not delivered by a kafka source", msg.BrokerID)
	}
	if rc.seq == recycled {
		return nil, fmt.Errorf("kafka: message %q was recycled", msg.BrokerID)
	}
	return rc, nil
}

// settle moves msg to state st.
func (s *Source) settle(msg *ackwise.Message, st uint8) error {
	s.mu.Lock()
	kick, err := s.settleLocked(msg, st)
	s.mu.Unlock()
	if kick {
		s.kickCommitter()
	}
	return err
}

// AckBatch acks msgs under one lock: see adapters.BatchAcker.
func (s *Source) AckBatch(_ context.Context, msgs []*ackwise.Message, errs []error) {
	if len(errs) != len(msgs) {
		panic(fmt.Sprintf("kafka: AckBatch: %d errors for %d messages", len(errs), len(msgs)))
	}
	kick := false
	s.mu.Lock()
	for i, msg := range msgs {
		k, err := s.settleLocked(msg, stSettled)
		if err != nil || errs[i] != nil {
			errs[i] = err // only then: a write barrier each while the GC marks
		}
		kick = kick || k
	}
	s.mu.Unlock()
	if kick {
		s.kickCommitter()
	}
}

// settleLocked moves msg to state st and reports whether the committer has
// new settled offsets to commit. Called with s.mu held, for every ack: the
// checks of receiptOf are made in line, and its errors only looked for when
// one fails.
func (s *Source) settleLocked(msg *ackwise.Message, st uint8) (kick bool, err error) {
	var rc *receipt
	if msg != nil {
		rc, _ = msg.Handle.(*receipt)
	}
	if rc == nil || rc.p == nil || rc.seq == recycled {
		_, err := receiptOf(msg)
		return false, err
	}
	p := rc.p
	if p.own.Load() >= ownSealed || !p.settleGen(rc.seq, rc.gen, st) {
		return false, settleError(msg, p)
	}
	return st == stSettled && p.dirty(), nil
}

// settleError is settleLocked's error for msg, of partition p, which it
// could not settle. Called with s.mu held, under which p's ownership does
// not change.
func settleError(msg *ackwise.Message, p *partition) error {
	if p.own.Load() >= ownSealed {
		return fmt.Errorf("kafka: %s: partition revoked: %w", msg.BrokerID, adapters.ErrReceiptInvalid)
	}
	return fmt.Errorf("kafka: %s: already settled or released", msg.BrokerID)
}

// checkMovable is what a move (Nack, DeadLetter) checks before it
// produces: it fails with ErrReceiptInvalid when msg's partition is gone,
// and when msg was settled or released already (the copy would then be a
// second settle of the delivery, made before the settle itself fails).
func (s *Source) checkMovable(msg *ackwise.Message) error {
	rc, err := receiptOf(msg)
	if err != nil {
		return err
	}
	if rc.p.own.Load() >= ownSealed {
		return fmt.Errorf("kafka: %s: partition revoked: %w", msg.BrokerID, adapters.ErrReceiptInvalid)
	}
	s.mu.Lock()
	inflight := rc.p.inflightGen(rc.seq, rc.gen)
	s.mu.Unlock()
	if !inflight {
		return fmt.Errorf("kafka: %s: already settled or released", msg.BrokerID)
	}
	return nil
}

// Ack marks msg settled; its offset is committed once every record before it
// in its partition is settled too. It returns an error wrapping
// adapters.ErrReceiptInvalid when the partition was revoked.
func (s *Source) Ack(_ context.Context, msg *ackwise.Message) error {
	return s.settle(msg, stSettled)
}

// Release hands msg back unsettled: its offset is not committed until it is
// delivered again and settled. When this member still owns the partition, it
// rewinds the partition's fetch position to the first released record, so
// that record is delivered again (the records after it that were delivered
// before are fetched again but not redelivered); otherwise the partition's
// next owner delivers it. Until it comes again, the partition's records
// fetched but not yet delivered are held back (fetched again after it), so
// none overtakes it; a released record no longer in the log when the rewind
// fetches (compaction, retention) is given up with a warning, and the
// partition goes on.
func (s *Source) Release(_ context.Context, msg *ackwise.Message) error {
	if err := s.settle(msg, stReleased); err != nil {
		return err
	}
	s.rewind(msg.Handle.(*receipt).p)
	return nil
}

// rewind sets the fetch position of p, if this member still owns it and is
// open, to p's first released record. Rewinds are serialized, and each
// reads the first released record afresh, so that the last one applied
// never skips a lower released record.
func (s *Source) rewind(p *partition) {
	s.rewindMu.Lock()
	defer s.rewindMu.Unlock()
	if p.own.Load() != ownOwned || s.closed.Load() {
		return // the next owner, or this member's next assignment, redelivers it
	}
	s.mu.Lock()
	off, covered, from := p.firstReleased(), p.releases, s.pollsIn
	s.mu.Unlock()
	if off < 0 {
		return // redelivered meanwhile
	}
	if s.testRewindChecked != nil {
		s.testRewindChecked()
	}
	// Under rewindMu, which the group callbacks take before they change
	// p.own: p stays owned until SetOffsets returns. Without it, p could be
	// revoked and assigned to this member again in between, and the
	// SetOffsets, recorded against the new assignment's offset fetch,
	// would skip the records the revoke left unsettled below off (those of
	// handlers that outlived RevokeTimeout). Not under s.mu: SetOffsets
	// takes the client's consumer lock; franz-go calls no group callback
	// with that lock held, so this waits on nothing that waits on
	// rewindMu.
	s.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{p.topic: {p.id: {Epoch: -1, Offset: off}}})
	// A retry partition paused for records not yet due would fetch the
	// released record only once they all came due, a whole tier later:
	// resume it (deliverPending does not pause it again while a released
	// record waits). What is fetched again is skipped as seen, held
	// records included.
	s.mu.Lock()
	// Polls started from here on fetch from off (SetOffsets took the
	// client's consumer lock, as every poll does), below every record
	// released up to the count read with it.
	p.rewoundAt, p.rewoundFor, p.rewoundFrom = s.polls, covered, from
	if p.paused {
		p.paused = false
		resumeLocked(s.cl, map[string][]int32{p.topic: {p.id}})
	}
	s.mu.Unlock()
}

// ExtendLease does nothing: a partition owned by this member has no lease.
func (s *Source) ExtendLease(context.Context, *ackwise.Message, time.Duration) error { return nil }

// Valid reports whether msg's partition is still owned by this member and
// not being revoked. It does not lock.
func (s *Source) Valid(msg *ackwise.Message) bool {
	rc, ok := msg.Handle.(*receipt)
	return ok && rc.p != nil && rc.seq != recycled && rc.p.own.Load() == ownOwned && !s.closed.Load()
}

// Nack moves msg to the retry topic of the smallest tier at least as long as
// delay (the longest tier when none is), with ackwise-attempt incremented,
// and marks it settled once the broker confirmed the move. Without retry
// tiers it returns an error: the engine retries in place (blocking mode). A
// record whose copy is too large for the retry topic is dead-lettered
// instead (dlq.ReasonUnroutable), not moved.
func (s *Source) Nack(ctx context.Context, msg *ackwise.Message, delay time.Duration) error {
	if len(s.cfg.RetryTiers) == 0 {
		return fmt.Errorf("kafka: Nack without SourceConfig.RetryTiers: this source retries in place (Capabilities.Delay is false)")
	}
	if err := s.checkMovable(msg); err != nil {
		return err
	}
	tier := s.cfg.RetryTiers[len(s.cfg.RetryTiers)-1]
	for _, t := range s.cfg.RetryTiers {
		if t >= delay {
			tier = t
			break
		}
	}
	now := time.Now()
	rec := &kgo.Record{
		Topic: s.cfg.RetryTopic(s.cfg.Topic, tier),
		Value: msg.Payload,
	}
	if msg.Key != "" {
		rec.Key = []byte(msg.Key)
	}
	rec.Headers = make([]kgo.RecordHeader, 0, len(msg.Headers)+7)
	for _, kv := range msg.Headers {
		switch kv.Key {
		case ackwise.HeaderAttempt, ackwise.HeaderFirstFailure, HeaderRetryDue, HeaderOriginalTopic, HeaderOriginalPartition, HeaderOriginalOffset, HeaderRetryGroup:
			continue
		}
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: kv.Key, Value: []byte(kv.Value)})
	}
	first := msg.FirstFailure
	if first.IsZero() {
		first = now
	}
	rec.Headers = append(rec.Headers,
		kgo.RecordHeader{Key: ackwise.HeaderAttempt, Value: []byte(strconv.Itoa(nextAttempt(msg.Attempt)))},
		kgo.RecordHeader{Key: ackwise.HeaderFirstFailure, Value: []byte(first.UTC().Format(time.RFC3339Nano))},
		kgo.RecordHeader{Key: HeaderRetryDue, Value: []byte(strconv.FormatInt(now.Add(tier).UnixMilli(), 10))},
		kgo.RecordHeader{Key: HeaderOriginalTopic, Value: []byte(msg.Source)},
		kgo.RecordHeader{Key: HeaderOriginalPartition, Value: []byte(strconv.FormatInt(int64(msg.Partition), 10))},
		kgo.RecordHeader{Key: HeaderOriginalOffset, Value: []byte(strconv.FormatInt(msg.Offset, 10))},
		kgo.RecordHeader{Key: HeaderRetryGroup, Value: []byte(s.cfg.Group)},
	)
	if _, ok := msg.Headers.Lookup(ackwise.HeaderEventID); !ok && msg.ID != "" {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: ackwise.HeaderEventID, Value: []byte(msg.ID)})
	}
	if size, limit := recordBytes(rec), s.limits.limit(rec.Topic); size > limit {
		return s.deadLetterUnmovable(ctx, msg, fmt.Errorf("kafka: %s: retry copy of %d bytes does not fit retry topic %s (max.message.bytes %d)", msg.BrokerID, size, rec.Topic, limit))
	}
	if err := produceOne(ctx, s.cl, rec); err != nil {
		err = fmt.Errorf("kafka: %s: move to retry topic %s: %w", msg.BrokerID, rec.Topic, err)
		if errors.Is(err, kerr.MessageTooLarge) {
			// A limit lowered since it was read, or not readable.
			s.limits.reread(ctx, s.cl, rec.Topic)
			return s.deadLetterUnmovable(ctx, msg, err)
		}
		return err
	}
	return s.settle(msg, stSettled)
}

// deadLetterUnmovable dead-letters msg, whose move to a retry topic failed
// for good with cause (its copy is too large for the topic), with reason
// dlq.ReasonUnroutable, rather than fail the move again on every try. The
// envelope's consumer is the group: the engine's Config.Name is not known
// here.
func (s *Source) deadLetterUnmovable(ctx context.Context, msg *ackwise.Message, cause error) error {
	s.log.Warn("kafka: record cannot be moved to its retry topic; dead-lettered instead", ackwise.LogKeyGroup, s.cfg.Group, ackwise.LogKeyEventID, msg.ID, ackwise.LogKeyError, cause)
	env := dlq.New(msg, dlq.ReasonUnroutable, cause, ackwise.ClassPermanent, time.Now(), s.cfg.Group, "")
	return s.DeadLetter(ctx, msg, env)
}

// DeadLetter produces msg to the dead-letter topic (same key, byte-identical
// value, headers kept, envelope added as headers) with acks=all and marks it
// settled once the broker confirmed. A dead letter over the topic's
// max.message.bytes is written trimmed, marked with HeaderDLQTrimmed (see
// the package documentation).
func (s *Source) DeadLetter(ctx context.Context, msg *ackwise.Message, env dlq.Envelope) error {
	if err := s.checkMovable(msg); err != nil {
		return err
	}
	if err := produceDeadLetter(ctx, s.cl, s.limits, s.log, s.cfg.DeadLetterTopic, msg, env); err != nil {
		return fmt.Errorf("kafka: %s: dead-letter to %s: %w", msg.BrokerID, s.cfg.DeadLetterTopic, err)
	}
	return s.settle(msg, stSettled)
}

package kafka

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// receiveEnds reports whether a Receive into buf returns now, and its
// error: at once for an empty buf (nil), once the source is closed
// (adapters.ErrClosed) or ctx ended (ctx's error).
func receiveEnds(ctx context.Context, closed *atomic.Bool, buf []*ackwise.Message) (bool, error) {
	switch {
	case len(buf) == 0:
		return true, nil
	case closed.Load():
		return true, adapters.ErrClosed
	}
	err := ctx.Err()
	return err != nil, err
}

// Receive fills buf with up to len(buf) records: retry records that came due
// first, then records of the last poll, then, when it delivered nothing, it
// polls again (everything fetched, or at most SourceConfig.PollBatch
// records) and waits. Records of a partition revoked since they were polled
// are dropped, never delivered.
func (s *Source) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	for {
		if stop, err := receiveEnds(ctx, &s.closed, buf); stop {
			return 0, err
		}
		now := time.Now()
		n, next := s.takeDue(buf, now)
		k, held := s.deliverPending(buf[n:], now)
		n += k
		if n > 0 {
			return n, nil
		}
		if held {
			continue // records were just held: wait for the first one due
		}
		pctx, cancel := ctx, context.CancelFunc(nil)
		if !next.IsZero() {
			pctx, cancel = context.WithDeadline(ctx, next)
		}
		// About to wait: let go of the records built last, which keep
		// their fetch's memory alive.
		clear(s.build[:cap(s.build)])
		limit := -1 // everything fetched
		if s.cfg.PollBatch > 0 {
			limit = max(len(buf), s.cfg.PollBatch)
		}
		closed, perr := s.poll(pctx, limit)
		if cancel != nil {
			cancel()
		}
		if closed {
			return 0, adapters.ErrClosed
		}
		if perr != nil {
			// Records the poll also returned are delivered by the next
			// call; the caller (the engine) logs the error and backs off.
			return 0, perr
		}
	}
}

// poll takes up to limit records from the client (all it has when limit is
// negative), waiting until there are some or ctx is done, and stashes them.
// It reports whether the client is closed, and the first fetch error worth
// returning (reportFetch): franz-go keeps trying, and a Receive that only
// logged it (the default Logger discards) would wait for ever without a
// word.
func (s *Source) poll(ctx context.Context, limit int) (closed bool, fatal error) {
	s.mu.Lock()
	s.polls++
	n := s.polls
	s.mu.Unlock()
	fetches := s.cl.PollRecords(ctx, limit)
	// The client was made with BlockRebalanceOnPoll: no rebalance callback
	// runs between the poll and here, so the records are filed under the
	// assignment they were polled under. Otherwise a partition revoked and
	// assigned to this member again in between would get the records of
	// its previous assignment: the new assignment fetches from the
	// committed offset, below them, and the records in between would count
	// as seen and never be delivered.
	defer s.cl.AllowRebalance()
	if fetches.IsClientClosed() {
		return true, nil
	}
	fatal = fetchErrors(fetches, s.log, reportFetch)
	s.stash(fetches, n)
	return false, fatal
}

// pendingRun is a partition's records of a poll not yet delivered, in
// offset order, with the partition (assignment) they were polled under and
// the poll's number.
type pendingRun struct {
	p    *partition
	recs []*kgo.Record
	poll uint64
}

// stash keeps the records of poll number poll for delivery.
func (s *Source) stash(fetches kgo.Fetches, poll uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	added := 0
	if s.pendIdx > 0 {
		// Drop the delivered runs, keeping those still to deliver.
		k := copy(s.pending, s.pending[s.pendIdx:])
		clear(s.pending[k:])
		s.pending = s.pending[:k]
		s.pendIdx = 0
	}
	fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
		if len(fp.Records) == 0 {
			return
		}
		if p := s.parts[topicPartition{fp.Topic, fp.Partition}]; p != nil {
			s.pending = append(s.pending, pendingRun{p: p, recs: fp.Records, poll: poll})
			added += len(fp.Records)
		}
	})
	s.pollsIn = poll
	s.queued += added
	if added > 0 {
		s.last = added
	}
}

// takeDue delivers held retry records of owned partitions that are due and
// resumes partitions whose held records are all delivered. It returns how
// many it delivered and when the next held record is due (zero if none).
func (s *Source) takeDue(buf []*ackwise.Message, now time.Time) (n int, next time.Time) {
	s.mu.Lock()
	s.build = s.build[:0]
	var resume map[string][]int32
	for _, p := range s.parts {
		if len(p.held) == 0 || p.own.Load() != ownOwned {
			continue // a revoking partition's held records are dropped
		}
		i := 0
		for ; i < len(p.held) && n < len(buf); i++ {
			h := p.held[i]
			if h.due.After(now) {
				break
			}
			p.inflight++
			s.build = append(s.build, toBuild{p: p, r: h.rec, seq: h.seq})
			n++
		}
		p.held = p.held[i:]
		if len(p.held) == 0 {
			p.held = nil
			resume = p.unpauseLocked(resume)
			continue
		}
		if d := p.held[0].due; next.IsZero() || d.Before(next) {
			next = d
		}
	}
	resumeLocked(s.cl, resume)
	s.mu.Unlock()
	s.buildInto(buf)
	return n, next
}

// deliverPending tracks stashed records and delivers those that may be
// handled now, up to len(buf); retry records not yet due are held and their
// partition paused. held reports whether it held a record of a partition it
// had to pause.
func (s *Source) deliverPending(buf []*ackwise.Message, now time.Time) (n int, held bool) {
	s.mu.Lock()
	s.build = s.build[:0]
	var pause map[string][]int32
	var refetch []*partition // to rewind again: records dropped that nothing fetches again
	kick := false            // records settled here, unseen: the committer must know
	for s.pendIdx < len(s.pending) && n < len(buf) {
		run := &s.pending[s.pendIdx]
		p := run.p
		if len(run.recs) == 0 || p.own.Load() != ownOwned {
			// Done, or revoked since the poll: its records are dropped.
			s.queued -= len(run.recs)
			*run = pendingRun{}
			s.pendIdx++
			continue
		}
		// The run's records in one go: p's ownership changes only under
		// s.mu, held here. Not cleared behind: the run's records go with
		// the run, once it is delivered (a fetch at most).
		recs := run.recs
		i := 0
		for ; i < len(recs) && n < len(buf); i++ {
			r := recs[i]
			if p.next >= 0 && r.Offset < p.next {
				// Seen before: fetched again after a rewind to a released
				// record, which is delivered again; the others are skipped.
				if seq, gen, ok := p.redeliver(r.Offset); ok {
					s.build = append(s.build, toBuild{p: p, r: r, seq: seq, gen: gen})
					n++
				}
				continue
			}
			if p.released > 0 {
				// New, but a released record of p waits to be fetched again:
				// delivered now, this one would overtake it, and its key's
				// order would break.
				if hold, again := p.holdBack(run.poll); hold {
					if again && !slices.Contains(refetch, p) {
						refetch = append(refetch, p)
					}
					continue // untracked, as if never fetched
				}
				s.log.Warn("kafka: released records are no longer in the log (compacted or deleted); they are not delivered again",
					ackwise.LogKeyTopic, p.topic, ackwise.LogKeyPartition, p.id, "offsets", p.dropReleased())
				kick = true
			}
			if p.skip != nil {
				if _, ok := p.skip[r.Offset]; ok {
					p.trackSettled(r.Offset, r.LeaderEpoch)
					kick = true
					continue
				}
			}
			if p.retry {
				due, group, tagged := retryHeaders(r)
				if tagged && group != s.cfg.Group {
					// Moved here by another group sharing the retry topic.
					p.trackSettled(r.Offset, r.LeaderEpoch)
					kick = true
					continue
				}
				// A record is never due later than its tier from now: a
				// member whose clock ran ahead (or a corrupt header) must not
				// pause the partition for longer.
				if limit := now.Add(s.retries[p.topic]); due.After(limit) {
					due = limit
				}
				if len(p.held) > 0 || due.After(now) {
					seq := p.track(r.Offset, r.LeaderEpoch, false)
					p.held = append(p.held, heldRecord{rec: r, seq: seq, due: due})
					// Not while a released record waits to be fetched
					// again (see rewind): it would wait for the held
					// records to come due.
					if !p.paused && p.firstReleased() < 0 {
						p.paused = true
						if pause == nil {
							pause = make(map[string][]int32)
						}
						pause[p.topic] = append(pause[p.topic], p.id)
					}
					continue
				}
			}
			seq := p.track(r.Offset, r.LeaderEpoch, true)
			s.build = append(s.build, toBuild{p: p, r: r, seq: seq})
			n++
		}
		run.recs = recs[i:]
		s.queued -= i
	}
	pauseLocked(s.cl, pause)
	ahead := n > 0 && s.cfg.PollBatch == 0 && s.queued <= s.last
	s.mu.Unlock()
	if kick {
		s.kickCommitter()
	}
	s.buildInto(buf)
	for _, p := range refetch {
		s.rewind(p)
	}
	if ahead && s.cl.BufferedFetchRecords() > 0 {
		// Read ahead: take the next fetch as soon as the client has it,
		// while this one is still being delivered. The client fetches
		// again only once its buffered fetch is taken, so decoding the
		// fetch after next overlaps delivering this one. Records wait
		// here for at most one fetch beyond the one being delivered.
		// A short deadline rather than franz-go's nil-context poll, which
		// would hand user hooks (SourceConfig.Options) a nil context: the client
		// takes what it has buffered before it looks at the deadline, and
		// waits at most that long if a rebalance dropped it meanwhile.
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		_, _ = s.poll(ctx, -1) // an error shows again in the next blocking poll
		cancel()
	}
	return n, len(pause) > 0
}

// toBuild is a record picked for delivery whose message is not built yet.
type toBuild struct {
	p   *partition
	r   *kgo.Record
	seq int64
	gen uint16
}

// buildInto builds the messages of s.build into buf. It runs without s.mu:
// building is most of the cost of a delivery, and acks of other messages
// need s.mu meanwhile. A partition revoked in between is caught by Valid
// and by settle, as for any message delivered before a revoke.
func (s *Source) buildInto(buf []*ackwise.Message) {
	for i, b := range s.build {
		buf[i] = s.message(b.p, b.r, b.seq, b.gen)
	}
	// Not cleared here (while the garbage collector marks, that costs a
	// write barrier per pointer), but before Receive waits: see poll.
	s.build = s.build[:0]
}

// reportFetch reports whether Receive returns a fetch error to its caller
// (the engine logs it and backs off): any but a Kafka error marked
// retriable, and but the notices of trouble franz-go cures by itself, a lost
// group membership (it rejoins) and data loss (it reset the offset). A
// failure outside Kafka's codes (a TLS handshake refused after a
// certificate rotation, say) is returned: only logged, the default Logger
// would hide it.
func reportFetch(err error) bool {
	if _, dataLoss := errors.AsType[*kgo.ErrDataLoss](err); dataLoss || rejoinedGroup(err) {
		return false
	}
	return !kerr.IsRetriable(err)
}

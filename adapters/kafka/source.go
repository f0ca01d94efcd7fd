package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// Source consumes a topic (and its retry topics) as a member of a consumer
// group and commits settled offsets only. See the package documentation for
// its guarantees.
//
// Receive must be called from one goroutine at a time; Ack, Nack,
// DeadLetter, Release, ExtendLease and Valid may be called concurrently from
// many.
type Source struct {
	cfg     SourceConfig
	cl      *kgo.Client
	log     *slog.Logger
	retries map[string]time.Duration // retry topic -> tier
	caps    adapters.Capabilities
	limits  *batchLimits // of the retry and dead-letter topics

	mu      sync.Mutex
	parts   map[topicPartition]*partition
	pending []pendingRun // polled, not yet delivered, under mu
	pendIdx int
	queued  int    // records in pending[pendIdx:], under mu
	last    int    // records of the last poll that had some, under mu
	polls   uint64 // polls started, under mu (see partition.rewoundAt)
	pollsIn uint64 // polls whose records were stashed, under mu (see partition.rewoundFrom)

	// Message building, by the goroutine calling Receive and without mu:
	// records to deliver are picked under mu, their messages built after.
	build []toBuild
	strs  []byte           // append-only chunk the messages' strings are carved from
	slab  []delivery       // new deliveries are carved from it
	hslab []ackwise.Header // headers beyond a delivery's own room
	local []*delivery      // recycled deliveries taken from freed

	freeMu sync.Mutex
	freed  []*delivery // recycled deliveries, under freeMu

	closed  atomic.Bool
	closing chan struct{}

	commitMu sync.Mutex // serializes commits: periodic, on revoke, on close
	// rewindMu serializes rewinds of partitions to released records, and
	// the group callbacks' changes of a partition's ownership with them
	// (taken before mu): a rewind's SetOffsets lands while the partition it
	// checked is still owned, never on its next assignment.
	rewindMu sync.Mutex
	kick     chan struct{}
	stop     chan struct{}
	done     chan struct{}
	closeMu  sync.Mutex
	closeErr error

	// invalid tells the engine when records stop being Valid: a
	// revoke, a loss of partitions (adapters.Invalidator).
	invalid adapters.InvalidHook

	// Test hooks, nil outside tests: a rewind checked ownership and calls
	// SetOffsets next; onRevoked was entered; a commit read its offsets and
	// sends them next.
	testRewindChecked, testRevoking, testCommitting func()
}

type topicPartition struct {
	topic string
	id    int32
}

type heldRecord struct {
	rec *kgo.Record
	seq int64
	due time.Time
}

// receipt is a Message's Handle: where the record sits in its partition's
// tracking.
// Where the record first sat (it differs on retry topics) is the message's
// Source, Partition and Offset.
type receipt struct {
	p   *partition
	seq int64     // recycled once the message is recycled
	gen uint16    // delivery generation of the record (see partition.redeliver)
	d   *delivery // the delivery holding this receipt, for Recycle
}

// recycled is the seq of a recycled message's receipt.
const recycled = -1

// delivery puts a message, its receipt and room for its headers in one
// allocation. Deliveries are carved from slabs and reused once the engine
// recycles their message (see Recycle).
type delivery struct {
	msg      ackwise.Message
	rc       receipt
	hdrs     [4]ackwise.Header
	detached bool // msg.Payload is a copy (Detach)
}

var (
	_ adapters.Source      = (*Source)(nil)
	_ adapters.Recycler    = (*Source)(nil)
	_ adapters.BatchAcker  = (*Source)(nil)
	_ adapters.Detacher    = (*Source)(nil)
	_ adapters.Invalidator = (*Source)(nil)
	_ dlq.Backlogger       = (*Source)(nil)
)

// NewSource joins cfg.Group on cfg.Topic (and its retry topics, when
// cfg.RetryTiers are set) and returns once a broker answered. It fails when
// the config is invalid (the error names the field and value) or no broker
// can be reached before ctx is done.
func NewSource(ctx context.Context, cfg SourceConfig) (*Source, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := refuseCommitOptions(cfg.optionsName("SourceConfig"), cfg.Options, true); err != nil {
		return nil, err
	}
	s := &Source{
		cfg:     cfg,
		log:     cfg.Logger,
		retries: make(map[string]time.Duration, len(cfg.RetryTiers)),
		parts:   make(map[topicPartition]*partition),
		closing: make(chan struct{}),
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	topics := []string{cfg.Topic}
	for _, t := range cfg.RetryTiers {
		name := cfg.RetryTopic(cfg.Topic, t)
		s.retries[name] = t
		topics = append(topics, name)
	}
	s.caps = adapters.Capabilities{
		Log:        true,
		Ordered:    true,
		Delay:      len(cfg.RetryTiers) > 0,
		DelayTiers: append([]time.Duration(nil), cfg.RetryTiers...),
	}
	if n := len(cfg.RetryTiers); n > 0 {
		s.caps.MaxDelay = cfg.RetryTiers[n-1]
	}
	limits := new(batchLimits) // of the retry and dead-letter topics
	s.limits = limits
	opts := append(cfg.consume(nil).opts(),
		limits.opt(),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(topics...),
		kgo.DisableAutoCommit(),
		// Partitions with no commit start at the beginning, also with
		// StartOffset "latest": that applies to the main topic only (see
		// below). A retry partition with no commit yet holds retries this
		// group moved there, with the source offsets committed past them:
		// starting it at its end would lose them.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.OnPartitionsAssigned(s.onAssigned),
		kgo.OnPartitionsRevoked(s.onRevoked),
		kgo.OnPartitionsLost(s.onLost),
		kgo.BlockRebalanceOnPoll(), // see poll
	)
	opts = append(opts, cfg.groupOpts()...)
	if cfg.StartOffset == "latest" {
		main := cfg.Topic
		opts = append(opts, kgo.AdjustFetchOffsetsFn(func(_ context.Context, offs map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
			for p, o := range offs[main] {
				if o.EpochOffset().Offset < 0 { // no commit: the reset offset
					offs[main][p] = kgo.NewOffset().AtEnd()
				}
			}
			return offs, nil
		}))
	}
	if len(cfg.RetryTiers) > 0 {
		// A resumed retry partition joins the next fetch only after the
		// fetch in flight returns, which waits up to FetchMaxWait (5s by
		// default) when nothing is new: bound that wait by half the
		// shortest tier.
		opts = append(opts, kgo.FetchMaxWait(min(max(cfg.RetryTiers[0]/2, 100*time.Millisecond), 5*time.Second)))
	}
	opts = append(opts, cfg.Options...)
	opts = append(opts, cfg.testOptions...)
	// A revoke that waits for handlers as long as the rebalance timeout
	// (SourceConfig.Options may set it) gets the member evicted: its final
	// commit is refused and what was settled meanwhile is redelivered.
	revokeFits := func(cl *kgo.Client) error {
		if rt, ok := cl.OptValue(kgo.RebalanceTimeout).(time.Duration); ok && cfg.RevokeTimeout >= rt {
			return fmt.Errorf("kafka: SourceConfig.RevokeTimeout = %v (revoke_timeout in a URL): must be below the group's rebalance timeout %v (SourceConfig.RebalanceTimeout, rebalance_timeout in a URL, or kgo.RebalanceTimeout), or a slow handler gets the member evicted", cfg.RevokeTimeout, rt)
		}
		return nil
	}
	w := writes{group: cfg.Group, deadLetter: cfg.DeadLetterTopic, retries: cfg.retryTopics(), limits: limits}
	cl, err := w.newClient(ctx, "SourceConfig", cfg.ClientConfig, opts, revokeFits)
	if err != nil {
		return nil, err
	}
	s.cl = cl
	go s.committer()
	return s, nil
}

// Client returns the franz-go client behind the source, for metrics and
// admin calls. Polling or committing with it breaks the source's guarantees.
func (s *Source) Client() *kgo.Client { return s.cl }

// Backlog returns how many records of the source's topic (and its retry
// topics) its group has yet to read, over all partitions: the end offset a
// read_committed consumer sees (the last stable offset) less the group's
// committed offset (the partition's start offset without one, its end on
// the topic with StartOffset "latest") and less the records above it the
// commit metadata names as settled, which are not delivered again
// (dlq.Backlogger: dlq.Redrive receives no more new records than that, so
// the dead letters that a consumer which still fails sends back while the
// run reads wait for the next run). Offsets that hold no record a consumer
// sees (transaction markers, aborted records) are counted: on a topic
// written in transactions the run may end idle rather than at the count.
// On a topic of several partitions, records written after the count may
// be received from one partition before the last counted ones of another,
// which the run then leaves for the next run. It asks the brokers (three
// requests) and fails for a topic that does not exist.
func (s *Source) Backlog(ctx context.Context) (int, error) {
	topics := append([]string{s.cfg.Topic}, s.cfg.retryTopics()...)
	adm := kadm.NewClient(s.cl)
	ends, err := adm.ListCommittedOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("kafka: backlog of %v: list end offsets: %w", topics, err)
	}
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("kafka: backlog of %v: list start offsets: %w", topics, err)
	}
	offs, err := adm.FetchOffsetsForTopics(ctx, s.cfg.Group, topics...)
	if err == nil {
		err = offs.Error()
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		// A group that has not joined yet has committed nothing (a broker
		// may say so before the group's first join is recorded).
		offs, err = nil, nil
	}
	if err != nil {
		return 0, fmt.Errorf("kafka: backlog of %v: fetch the offsets of group %q: %w", topics, s.cfg.Group, err)
	}
	var n int64
	ends.Each(func(e kadm.ListedOffset) {
		from := int64(0)
		if st, ok := starts.Lookup(e.Topic, e.Partition); ok {
			from = st.Offset
		}
		if o, ok := offs.Lookup(e.Topic, e.Partition); ok && o.At >= 0 {
			from = max(from, o.At)
			for off := range decodeSettled(o.At, o.Metadata) {
				if off >= from && off < e.Offset {
					n--
				}
			}
		} else if e.Topic == s.cfg.Topic && s.cfg.StartOffset == "latest" {
			from = e.Offset
		}
		n += max(e.Offset-from, 0)
	})
	return int(min(max(n, 0), math.MaxInt)), nil
}

// Capabilities reports Log and Ordered; Delay, DelayTiers and MaxDelay (the
// longest tier) when retry tiers are configured.
func (s *Source) Capabilities() adapters.Capabilities { return s.caps }

// Extensions declares all four: the source recycles its deliveries, acks
// batches under one lock, detaches a payload from its fetch, and tells of
// revokes and lost partitions.
func (s *Source) Extensions() adapters.Extensions {
	return adapters.Extensions{Recycler: s, BatchAcker: s, Detacher: s, Invalidator: s}
}

func (s *Source) onAssigned(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) {
	// The settled offsets above each committed offset, left in the commit
	// metadata by the previous owner: they are not delivered again.
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	adm := kadm.NewClient(cl)
	offs, err := adm.FetchOffsets(fctx, s.cfg.Group)
	var ends kadm.ListedOffsets
	if err == nil && hasSettledSets(offs, assigned) {
		// A set may name only records that exist: offsets at or past a
		// partition's end are a forgery, or what a truncation (an
		// unclean leader election) took back, and the records written
		// there next were never settled.
		var topics []string
		for t := range assigned {
			topics = append(topics, t)
		}
		if ends, err = adm.ListEndOffsets(fctx, topics...); err != nil {
			offs = nil
		}
	}
	cancel()
	if err != nil {
		s.log.Warn("kafka: cannot read commit metadata; settled records above the committed offsets will be redelivered", ackwise.LogKeyGroup, s.cfg.Group, ackwise.LogKeyError, err)
	}
	s.rewindMu.Lock()
	defer s.rewindMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	var unpause map[string][]int32
	for t, ids := range assigned {
		_, retry := s.retries[t]
		for _, id := range ids {
			k := topicPartition{t, id}
			if old := s.parts[k]; old != nil {
				s.dropLocked(cl, []*partition{old})
			}
			p := newPartition(t, id, retry)
			if retry {
				// A new assignment starts unpaused; make sure the client
				// agrees (pauses outlive assignments in franz-go).
				if unpause == nil {
					unpause = make(map[string][]int32)
				}
				unpause[t] = append(unpause[t], id)
			}
			if o, ok := offs.Lookup(t, id); ok && o.Err == nil && o.At >= 0 {
				p.skip = decodeSettled(o.At, o.Metadata)
				if len(p.skip) > 0 {
					if e, ok := ends.Lookup(t, id); !ok || e.Err != nil || !below(p.skip, e.Offset) {
						s.log.Warn("kafka: commit metadata names records past the partition's end; ignored, the records above the committed offset will be redelivered",
							ackwise.LogKeyGroup, s.cfg.Group, ackwise.LogKeyTopic, t, ackwise.LogKeyPartition, id)
						p.skip = nil
					}
				}
				if len(p.skip) == 0 {
					p.skip = nil
				}
			}
			s.parts[k] = p
		}
	}
	resumeLocked(cl, unpause)
	s.log.Debug("kafka: partitions assigned", ackwise.LogKeyGroup, s.cfg.Group, "partitions", assigned)
}

// hasSettledSets reports whether offs holds ackwise's commit metadata for
// a partition of assigned.
func hasSettledSets(offs kadm.OffsetResponses, assigned map[string][]int32) bool {
	for t, ids := range assigned {
		for _, id := range ids {
			if o, ok := offs.Lookup(t, id); ok && o.Err == nil && strings.HasPrefix(o.Metadata, metaPrefix) {
				return true
			}
		}
	}
	return false
}

// below reports whether every offset of set is below end.
func below(set map[int64]struct{}, end int64) bool {
	for o := range set {
		if o >= end {
			return false
		}
	}
	return true
}

// onRevoked runs before revoked partitions are released: new deliveries
// stop at once, running handlers get RevokeTimeout to settle, then what is
// settled is committed synchronously.
func (s *Source) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	if s.testRevoking != nil {
		s.testRevoking()
	}
	s.rewindMu.Lock()
	s.mu.Lock()
	var ps []*partition
	var waits []chan struct{}
	for t, ids := range revoked {
		for _, id := range ids {
			p := s.parts[topicPartition{t, id}]
			if p == nil {
				continue
			}
			p.own.Store(ownRevoking)
			ps = append(ps, p)
			if p.inflight > 0 {
				if p.drained == nil {
					p.drained = make(chan struct{})
				}
				waits = append(waits, p.drained)
			}
		}
	}
	s.mu.Unlock()
	s.rewindMu.Unlock()
	if len(ps) == 0 {
		return
	}
	if len(waits) > 0 {
		// Records waiting in the engine (a retry in place, a failed move)
		// are handed back now, not when their waits end.
		s.invalid.Invalidated()
	}
	if len(waits) > 0 && s.cfg.RevokeTimeout > 0 {
		timer := time.NewTimer(s.cfg.RevokeTimeout)
	wait:
		for _, w := range waits {
			select {
			case <-w:
			case <-timer.C:
				s.log.Warn("kafka: revoke timeout: handlers still running on revoked partitions; their records will be redelivered", ackwise.LogKeyGroup, s.cfg.Group, ackwise.LogKeyTimeout, s.cfg.RevokeTimeout)
				break wait
			case <-s.closing:
				break wait
			case <-ctx.Done():
				break wait
			}
		}
		timer.Stop()
	}
	// From here a settle fails: the commit below is the last for these
	// partitions, and a settle it does not carry would be reported done
	// while the next owner delivers the record again.
	s.mu.Lock()
	for _, p := range ps {
		p.own.Store(ownSealed)
	}
	s.mu.Unlock()
	s.commitMu.Lock()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	err := s.commitLocked(cctx, cl, ps)
	cancel()
	s.mu.Lock()
	s.dropLocked(cl, ps)
	s.mu.Unlock()
	s.commitMu.Unlock()
	if err != nil {
		s.log.Warn("kafka: commit on revoke failed; settled records may be redelivered", ackwise.LogKeyGroup, s.cfg.Group, ackwise.LogKeyError, err)
	}
	s.log.Debug("kafka: partitions revoked", ackwise.LogKeyGroup, s.cfg.Group, "partitions", revoked)
}

// onLost marks partitions gone without committing: the group already gave
// them to someone else. It waits for a commit in flight (at most its 10s):
// one whose offsets were read before the loss but sent after franz-go
// rejoined the group, under the new generation, would be accepted and set
// the offsets of partitions another member owns by now back to older ones.
func (s *Source) onLost(_ context.Context, cl *kgo.Client, lost map[string][]int32) {
	s.commitMu.Lock()
	s.rewindMu.Lock()
	s.mu.Lock()
	var ps []*partition
	for t, ids := range lost {
		for _, id := range ids {
			if p := s.parts[topicPartition{t, id}]; p != nil {
				ps = append(ps, p)
			}
		}
	}
	s.dropLocked(cl, ps)
	s.mu.Unlock()
	s.rewindMu.Unlock()
	s.commitMu.Unlock()
	if len(ps) > 0 {
		// Without the source's locks, as adapters.Invalidator says.
		s.invalid.Invalidated()
	}
	s.log.Warn("kafka: partitions lost", ackwise.LogKeyGroup, s.cfg.Group, "partitions", lost)
}

// dropLocked forgets partitions and resumes those that were paused, so that
// a later assignment of them fetches.
func (s *Source) dropLocked(cl *kgo.Client, ps []*partition) {
	var resume map[string][]int32
	for _, p := range ps {
		p.own.Store(ownGone)
		k := topicPartition{p.topic, p.id}
		if s.parts[k] == p {
			delete(s.parts, k)
		}
		p.held = nil
		if p.drained != nil {
			close(p.drained)
			p.drained = nil
		}
		resume = p.unpauseLocked(resume)
	}
	resumeLocked(cl, resume)
}

// unpauseLocked marks p not paused and, if it was, adds it to resume (made
// when nil), the partitions to resume fetching; it returns resume.
func (p *partition) unpauseLocked(resume map[string][]int32) map[string][]int32 {
	if !p.paused {
		return resume
	}
	p.paused = false
	if resume == nil {
		resume = make(map[string][]int32)
	}
	resume[p.topic] = append(resume[p.topic], p.id)
	return resume
}

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

// pauseLocked and resumeLocked change the client's paused partitions. They
// run under s.mu, like every change of partition.paused, so that the client
// and the tracking cannot disagree: a pause decided for a partition that is
// dropped meanwhile would otherwise land after the drop's resume and leave
// the partition paused for its next assignment. The group callbacks pass
// their client (s.cl may not be set yet when the first assignment runs).
func pauseLocked(cl *kgo.Client, tps map[string][]int32) {
	if len(tps) > 0 {
		cl.PauseFetchPartitions(tps)
	}
}

func resumeLocked(cl *kgo.Client, tps map[string][]int32) {
	if len(tps) > 0 {
		cl.ResumeFetchPartitions(tps)
	}
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
		if len(run.recs) == 0 || run.p.own.Load() != ownOwned {
			// Done, or revoked since the poll: its records are dropped.
			s.queued -= len(run.recs)
			*run = pendingRun{}
			s.pendIdx++
			continue
		}
		// Not cleared behind: the run's records go with the run, once it is
		// delivered (a fetch at most).
		r, p := run.recs[0], run.p
		run.recs = run.recs[1:]
		s.queued--
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

// retryHeaders reads, in one pass, what a retry topic's record says of its
// hop: when it is due (zero when unset or unreadable), and the group that
// moved it (tagged false for a record moved by an ackwise before it set
// HeaderRetryGroup: it counts as the reader's own).
func retryHeaders(r *kgo.Record) (due time.Time, group string, tagged bool) {
	for _, h := range r.Headers {
		switch h.Key {
		case HeaderRetryDue:
			if ms, ok := parseCount(string(h.Value)); ok {
				due = time.UnixMilli(ms)
			}
		case HeaderRetryGroup:
			group, tagged = string(h.Value), true
		}
	}
	return due, group, tagged
}

// maxAttempt caps the attempt number read from a retry topic's
// ackwise-attempt and written to the next hop (ackwise.MaxAttempt).
const maxAttempt = ackwise.MaxAttempt

// parseCount reads a non-negative decimal number written by this package
// (an attempt, a partition, an offset, Unix milliseconds): ASCII digits
// only, no sign, no spaces, at most 19 of them, within int64.
func parseCount(v string) (int64, bool) {
	if len(v) == 0 || len(v) > 19 {
		return 0, false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

// parseAttempt reads ackwise-attempt: a count of at least 1, capped at
// maxAttempt.
func parseAttempt(v string) (int, bool) {
	n, ok := parseCount(v)
	if !ok || n < 1 {
		return 0, false
	}
	return int(min(n, maxAttempt)), true
}

// nextAttempt is the ackwise-attempt of the next hop of a message at
// attempt: one more, from at least 1, saturating at maxAttempt.
func nextAttempt(attempt int) int {
	return min(max(attempt, 1), maxAttempt-1) + 1
}

// message builds the Message of a record. Called by the goroutine calling
// Receive (it uses s.strs, the slabs and the recycled deliveries). The key,
// the header values and the broker ID are strings carved from a shared,
// append-only chunk (see strChunk); the Message, its receipt and its headers
// are carved from slabs or recycled.
func (s *Source) message(p *partition, r *kgo.Record, seq int64, gen uint16) *ackwise.Message {
	if len(s.local) == 0 {
		s.freeMu.Lock()
		s.local, s.freed = s.freed, s.local
		s.freeMu.Unlock()
	}
	var d *delivery
	if n := len(s.local); n > 0 {
		d = s.local[n-1]
		s.local[n-1] = nil
		s.local = s.local[:n-1]
	} else {
		// One allocation per 64 records instead of one per record. A
		// slab lives as long as any delivery in it is referenced.
		if len(s.slab) == 0 {
			s.slab = make([]delivery, 64)
		}
		d = &s.slab[0]
		s.slab = s.slab[1:]
	}

	blob := s.strings(p, r)
	i := 0
	take := func(n int) string {
		v := blob[i : i+n]
		i += n
		return v
	}
	var key, id string
	if len(r.Key) > 0 {
		key = take(len(r.Key))
	}
	src, part, off, attempt := r.Topic, r.Partition, r.Offset, 1
	var firstFailure time.Time
	var h ackwise.Headers
	if n := len(r.Headers); n > 0 {
		// Full slice expressions: an append by the handler reallocates
		// instead of writing over another message's headers.
		if n <= len(d.hdrs) {
			h = d.hdrs[:0:n]
		} else {
			if len(s.hslab) < n {
				s.hslab = make([]ackwise.Header, max(256, n))
			}
			h = s.hslab[:0:n]
			s.hslab = s.hslab[n:]
		}
		for _, kv := range r.Headers {
			k := kv.Key // franz-go already made it a string
			v := take(len(kv.Value))
			switch k {
			case HeaderRetryDue, HeaderRetryGroup:
				continue
			case HeaderOriginalTopic:
				if p.retry {
					src = v
					continue
				}
			case HeaderOriginalPartition:
				if p.retry {
					if n, ok := parseCount(v); ok && n <= math.MaxInt32 {
						part = int32(n)
					}
					continue
				}
			case HeaderOriginalOffset:
				if p.retry {
					if n, ok := parseCount(v); ok {
						off = n
					}
					continue
				}
			case ackwise.HeaderEventID:
				id = v // the last one wins, as with Headers.Get
			case ackwise.HeaderAttempt:
				// Only a retry topic's: on the main topic the header
				// is a producer's (a handler that forwarded the
				// headers of a retry it handled, or a forgery), not
				// this chain's.
				if n, ok := parseAttempt(v); ok && p.retry {
					attempt = n
				}
			case ackwise.HeaderFirstFailure:
				if t, err := time.Parse(time.RFC3339Nano, v); err == nil && p.retry {
					firstFailure = t
				}
			}
			h = append(h, ackwise.Header{Key: k, Value: v})
		}
		h = h[:len(h):len(h)]
	}
	// Every field is set: a recycled delivery holds the last message's.
	// Field by field, and pointers only where they changed: while the
	// garbage collector marks, each pointer written costs a write barrier
	// (a whole-struct assignment pays one for every pointer slot).
	d.rc.seq, d.rc.gen = seq, gen
	d.detached = false
	if d.rc.p != p {
		d.rc.p = p
	}
	if d.rc.d != d {
		d.rc.d = d
	}
	m := &d.msg
	m.ID = id
	m.Key = key
	m.Payload = r.Value
	m.Headers = h
	if m.Source != src {
		m.Source = src
	}
	m.Partition = part
	m.Offset = off
	m.BrokerID = blob[i:]
	m.Attempt = attempt
	m.PublishedAt = r.Timestamp
	if m.FirstFailure != firstFailure {
		m.FirstFailure = firstFailure
	}
	if rc, ok := m.Handle.(*receipt); !ok || rc != &d.rc {
		m.Handle = &d.rc
	}
	return m
}

// strChunk is the size of the chunks the strings of messages are carved
// from: one allocation serves about 40 records of a typical size, instead
// of one each. A string kept after its message is recycled keeps its
// chunk alive (at most strChunk bytes), as a kept Payload keeps its fetch.
const strChunk = 2048

// strings returns r's key, header values (in order) and broker ID,
// concatenated, as one string carved from s.strs. The bytes of s.strs below
// its length are never written again, which is what makes the unsafe.String
// over them immutable.
func (s *Source) strings(p *partition, r *kgo.Record) string {
	n := len(r.Key) + len(p.idPrefix) + 20 // 20: the digits of any int64
	for _, kv := range r.Headers {
		n += len(kv.Value)
	}
	if cap(s.strs)-len(s.strs) < n {
		s.strs = make([]byte, 0, max(strChunk, n))
	}
	start := len(s.strs)
	b := append(s.strs, r.Key...)
	for _, kv := range r.Headers {
		b = append(b, kv.Value...)
	}
	b = append(b, p.idPrefix...)
	b = p.appendOffset(b, r.Offset)
	s.strs = b
	return unsafe.String(&b[start], len(b)-start)
}

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
// new settled offsets to commit. Called with s.mu held.
func (s *Source) settleLocked(msg *ackwise.Message, st uint8) (kick bool, err error) {
	rc, err := receiptOf(msg)
	if err != nil {
		return false, err
	}
	p := rc.p
	if p.own.Load() >= ownSealed {
		return false, fmt.Errorf("kafka: %s: partition revoked: %w", msg.BrokerID, adapters.ErrReceiptInvalid)
	}
	if !p.settleGen(rc.seq, rc.gen, st) {
		return false, fmt.Errorf("kafka: %s: already settled or released", msg.BrokerID)
	}
	return st == stSettled && p.dirty(), nil
}

// kickCommitter tells the committer there is something to commit.
func (s *Source) kickCommitter() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
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

// Recycle takes back the memory of messages for reuse by later deliveries.
// The engine calls it when it is done with messages (settled or released,
// observed); nothing may use them after. Messages of another source, and a
// second Recycle of the same message, are ignored. The deliveries kept for
// reuse are bounded by the most messages ever in flight at once.
func (s *Source) Recycle(msgs ...*ackwise.Message) {
	s.freeMu.Lock()
	defer s.freeMu.Unlock()
	for _, msg := range msgs {
		if msg == nil {
			continue
		}
		rc, ok := msg.Handle.(*receipt)
		if !ok || rc.d == nil || &rc.d.msg != msg || rc.p == nil || rc.seq == recycled {
			continue
		}
		// message overwrites every field on reuse. The recycled mark makes
		// a settle of the recycled message fail; the other pointers are
		// kept (message writes them only when they change: a write barrier
		// each while the garbage collector marks).
		d := rc.d
		d.rc.seq = recycled
		d.msg.Payload = nil // do not hold a fetch's memory while unused
		s.freed = append(s.freed, d)
	}
}

// Detach copies msg's Payload out of the fetch it points into
// (adapters.Detacher), once per delivery: a message waiting in place then
// keeps only its own bytes alive, not its whole fetch (or decompressed
// record batch). Its key, header values and broker ID are in small shared
// chunks already (see strChunk).
func (s *Source) Detach(msg *ackwise.Message) {
	rc, ok := msg.Handle.(*receipt)
	if !ok || rc.d == nil || &rc.d.msg != msg || rc.seq == recycled || rc.d.detached {
		return
	}
	rc.d.detached = true
	msg.Payload = bytes.Clone(msg.Payload)
}

// ExtendLease does nothing: a partition owned by this member has no lease.
func (s *Source) ExtendLease(context.Context, *ackwise.Message, time.Duration) error { return nil }

// OnInvalid sets f, called when a revoke or a loss of partitions makes
// records in flight no longer Valid (adapters.Invalidator).
func (s *Source) OnInvalid(f func()) { s.invalid.OnInvalid(f) }

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

// committer commits settled offsets at most once per CommitInterval, and only
// when something was settled.
func (s *Source) committer() {
	defer close(s.done)
	t := time.NewTimer(0)
	<-t.C
	for {
		select {
		case <-s.kick:
		case <-s.stop:
			return
		}
		s.commitMu.Lock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := s.commitLocked(ctx, s.cl, nil)
		cancel()
		s.commitMu.Unlock()
		if err != nil && !s.closed.Load() {
			s.log.Warn("kafka: commit failed; will retry", ackwise.LogKeyGroup, s.cfg.Group, ackwise.LogKeyError, err)
			select {
			case s.kick <- struct{}{}:
			default:
			}
		}
		t.Reset(s.cfg.CommitInterval)
		select {
		case <-t.C:
		case <-s.stop:
			return
		}
	}
}

// commitLocked commits the settled offsets of ps (of every owned partition
// when ps is nil) synchronously. The caller holds commitMu.
func (s *Source) commitLocked(ctx context.Context, cl *kgo.Client, ps []*partition) error {
	s.mu.Lock()
	if ps == nil {
		for _, p := range s.parts {
			ps = append(ps, p)
		}
	}
	offs := make(map[string]map[int32]kgo.EpochOffset)
	metas := make(map[string]map[int32]string)
	type pend struct {
		p    *partition
		off  int64
		meta bool
	}
	var todo []pend
	for _, p := range ps {
		if !p.dirty() || p.own.Load() == ownGone {
			continue
		}
		m := offs[p.topic]
		if m == nil {
			m = make(map[int32]kgo.EpochOffset)
			offs[p.topic] = m
		}
		m[p.id] = kgo.EpochOffset{Epoch: p.commitEp, Offset: p.commitOff}
		if meta := encodeSettled(p.commitOff, p.settledAbove()); meta != "" {
			mm := metas[p.topic]
			if mm == nil {
				mm = make(map[int32]string)
				metas[p.topic] = mm
			}
			mm[p.id] = meta
		}
		todo = append(todo, pend{p, p.commitOff, p.metaDirty})
		p.metaDirty = false
	}
	s.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	if s.testCommitting != nil {
		s.testCommitting()
	}
	if len(metas) > 0 {
		ctx = kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
			for i := range req.Topics {
				t := &req.Topics[i]
				for j := range t.Partitions {
					if meta, ok := metas[t.Topic][t.Partitions[j].Partition]; ok {
						t.Partitions[j].Metadata = &meta
					}
				}
			}
			return nil
		})
	}
	var cerr error
	failed := map[topicPartition]bool{}
	cl.CommitOffsetsSync(ctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			cerr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					failed[topicPartition{t.Topic, p.Partition}] = true
					cerr = fmt.Errorf("%s/%d: %w", t.Topic, p.Partition, err)
				}
			}
		}
	})
	s.mu.Lock()
	for _, t := range todo {
		if (cerr != nil && len(failed) == 0) || failed[topicPartition{t.p.topic, t.p.id}] {
			t.p.metaDirty = t.p.metaDirty || t.meta
			continue
		}
		if t.off > t.p.committed {
			t.p.committed = t.off
		}
	}
	s.mu.Unlock()
	return cerr
}

// Close commits what is settled, leaves the group (revoking, and so
// committing, every partition) and closes the client. Deliveries not settled
// are left for the next owner. Close is idempotent.
func (s *Source) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed.Swap(true) {
		return s.closeErr
	}
	close(s.closing)
	close(s.stop)
	<-s.done
	s.commitMu.Lock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := s.commitLocked(ctx, s.cl, nil)
	cancel()
	s.commitMu.Unlock()
	s.cl.Close()
	if err != nil {
		s.closeErr = fmt.Errorf("kafka: final commit: %w", err)
	}
	return s.closeErr
}

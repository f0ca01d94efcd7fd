package memory

import (
	"context"
	"fmt"
	"math"
	"sort"
	"sync/atomic"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// QueueConfig configures a queue. The zero value is valid and means the
// documented defaults.
type QueueConfig struct {
	// Lease is the visibility timeout: how long a delivered message stays
	// invisible to other consumers before it is delivered again. Zero means
	// DefaultLease (30s).
	Lease time.Duration
	// MaxReceives, when positive, moves a message to the dead-letter queue
	// instead of delivering it a MaxReceives+1-th time, as an SQS redrive
	// policy's maxReceiveCount does. The dead letter keeps its headers as
	// they were (no envelope: the broker, not ackwise, gave up). Zero means
	// no broker-side limit.
	MaxReceives int
	// DeadLetter is the dead-letter destination, created as a queue with the
	// broker's defaults when it does not exist. Empty means the queue's name
	// + DeadLetterSuffix (".dlq").
	DeadLetter string
	// FIFO makes the queue a FIFO queue: messages with the same Key (the
	// message group) are delivered in publish order, at most one in flight
	// per key; a message that failed holds back its key until it is settled
	// or dead-lettered, as in an SQS FIFO queue. Capabilities.Ordered is
	// true.
	FIFO bool
}

func (c QueueConfig) validate(prefix string) error {
	if c.Lease < 0 {
		return fmt.Errorf("memory: %sLease = %v: must not be negative (0 means %v)", prefix, c.Lease, DefaultLease)
	}
	if c.MaxReceives < 0 {
		return fmt.Errorf("memory: %sMaxReceives = %d: must not be negative (0 means no limit)", prefix, c.MaxReceives)
	}
	return nil
}

func (c QueueConfig) withDefaults(name string) QueueConfig {
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	c.DeadLetter = deadLetterName(name, c.DeadLetter)
	return c
}

type recState uint8

const (
	stReady recState = iota
	stDelayed
	stInFlight
	stMoving // on its way to the dead-letter queue
	stDeleted
)

// record is a message stored in a queue. Its first delivery is embedded,
// and the stored message is that delivery's Message: the common case (one
// delivery) costs no copy and no allocation. Redeliveries copy the
// immutable fields (see tmpl) into deliveries of their own.
type record struct {
	first     delivery
	seq       uint64
	receives  int
	state     recState
	heapIdx   int
	visibleAt int64 // unix nanos, while stDelayed
	group     *fifoGroup
	// firstFailure is when the message was first nacked: the broker knows
	// it, so later deliveries carry it as Message.FirstFailure.
	firstFailure time.Time
	// gen changes whenever the current delivery stops being settleable;
	// leaseUntil is the current delivery's deadline. Both are atomics so that
	// Valid needs no lock.
	gen        atomic.Uint64
	leaseUntil atomic.Int64
	// twin is the source holding a duplicate (FaultDuplicate) of the
	// current delivery: settling either voids the other, which it is told.
	twin *QueueSource
}

type fifoGroup struct {
	key    string
	msgs   ring[*record]
	busy   bool // head in flight, delayed or moving
	queued bool // in readyGroups
}

// queue is an SQS-like queue.
type queue struct {
	dest
	cfg  QueueConfig
	caps adapters.Capabilities

	ready       ring[*record] // standard queue
	groups      map[string]*fifoGroup
	readyGroups ring[*fifoGroup]
	freeGroups  []*fifoGroup
	delayed     recHeap
	inflight    recHeap
	redrive     []*record

	recs slab[record]
	dels slab[delivery]
	seq  uint64

	waiters []*source
	sources map[*QueueSource]struct{}

	timer    ackwise.Timer
	timerAt  int64
	timerGen uint64

	// seenNow is the clock as the last Receive read it (unix nanos), for
	// Valid on the system clock.
	seenNow atomic.Int64

	total, published, acked, deadLettered int64
}

func newQueue(b *Broker, name string, cfg QueueConfig) *queue {
	q := &queue{cfg: cfg, sources: map[*QueueSource]struct{}{}}
	q.b, q.name = b, name
	q.inflight.byLease = true
	if cfg.FIFO {
		q.groups = map[string]*fifoGroup{}
	}
	q.caps = adapters.Capabilities{
		Delay:         true,
		Lease:         cfg.Lease,
		ExtendLease:   true,
		DeliveryCount: true,
		Ordered:       cfg.FIFO,
	}
	return q
}

func (q *queue) kind() string { return "queue" }

// storeLocked stores a copy of m. Caller holds q.mu.
func (q *queue) storeLocked(m *ackwise.Message, now time.Time) {
	rec := q.recs.alloc()
	q.seq++
	rec.first.rec = rec
	rec.first.Message = q.stored(m, -1, -1, q.arena.id(q.name, '/', int64(q.seq), 0, -1), now)
	rec.seq = q.seq
	rec.heapIdx = -1
	rec.firstFailure = time.Time{}
	rec.state = stReady
	q.total++
	q.published++
	if q.groups != nil {
		g := q.groups[m.Key]
		if g == nil {
			if n := len(q.freeGroups); n > 0 {
				g = q.freeGroups[n-1]
				q.freeGroups = q.freeGroups[:n-1]
			} else {
				g = &fifoGroup{}
			}
			g.key = rec.first.Key
			q.groups[g.key] = g
		}
		rec.group = g
		g.msgs.push(rec)
		if !g.busy && !g.queued {
			g.queued = true
			q.readyGroups.push(g)
		}
	} else {
		q.ready.push(rec)
	}
	if q.b.history {
		q.record(Event{Kind: EventPublished, ID: rec.first.ID, Key: m.Key, BrokerID: rec.first.BrokerID, Partition: -1, Offset: -1}, now)
	}
}

// wakeLocked wakes every blocked receiver. Caller holds q.mu.
func (q *queue) wakeLocked() { wakeWaiters(&q.waiters) }

// takeLocked returns the next visible record, or nil.
func (q *queue) takeLocked() *record {
	if q.groups == nil {
		if q.ready.len() == 0 {
			return nil
		}
		return q.ready.pop()
	}
	if q.readyGroups.len() == 0 {
		return nil
	}
	g := q.readyGroups.pop()
	g.queued = false
	g.busy = true
	return g.msgs.front()
}

// makeVisibleLocked returns rec (in flight or delayed, already out of its
// heap) to the visible messages, or marks it for the dead-letter queue when
// it has used its receives.
func (q *queue) makeVisibleLocked(rec *record) {
	if q.cfg.MaxReceives > 0 && rec.receives >= q.cfg.MaxReceives {
		rec.state = stMoving
		q.redrive = append(q.redrive, rec)
		return
	}
	rec.state = stReady
	if g := rec.group; g != nil {
		g.busy = false
		if !g.queued {
			g.queued = true
			q.readyGroups.push(g)
		}
		return
	}
	q.ready.push(rec)
}

// advanceLocked applies delays and leases that ran out by now.
func (q *queue) advanceLocked(now int64) {
	for q.delayed.len() > 0 && q.delayed.top().visibleAt <= now {
		q.makeVisibleLocked(q.delayed.pop())
	}
	for q.inflight.len() > 0 && q.inflight.top().leaseUntil.Load() <= now {
		rec := q.inflight.pop()
		rec.gen.Add(1)
		rec.twin = nil // a lease that ran out is not an event sources tell
		if q.b.history {
			// The lease ran out at its deadline, not when the broker
			// noticed (the next Receive or Stats, maybe much later).
			q.record(Event{Kind: EventExpired, ID: rec.first.ID, Key: rec.first.Key, BrokerID: rec.first.BrokerID, Partition: -1, Offset: -1, Attempt: rec.receives}, time.Unix(0, rec.leaseUntil.Load()))
		}
		q.makeVisibleLocked(rec)
	}
}

// settleLocked deletes rec (in flight or moving).
func (q *queue) settleLocked(rec *record) {
	if rec.heapIdx >= 0 {
		if rec.state == stDelayed {
			q.delayed.remove(rec)
		} else {
			q.inflight.remove(rec)
		}
	}
	rec.state = stDeleted
	q.voidGenLocked(rec)
	q.total--
	if g := rec.group; g != nil {
		g.msgs.pop()
		g.busy = false
		if g.msgs.len() > 0 {
			if !g.queued {
				g.queued = true
				q.readyGroups.push(g)
			}
		} else {
			delete(q.groups, g.key)
			g.key = ""
			if len(q.freeGroups) < 1024 {
				q.freeGroups = append(q.freeGroups, g)
			}
		}
		rec.group = nil
	}
}

// putBackLocked takes d's record, in flight, off its lease, ends its
// current delivery, records the event of kind (Nack, Release) and makes
// the record visible again after delay (at once for a delay of zero or
// less). It releases q.mu.
func (q *queue) putBackLocked(d *delivery, kind EventKind, delay time.Duration, now time.Time) {
	rec := d.rec
	q.inflight.remove(rec)
	q.voidGenLocked(rec)
	if q.b.history {
		ev := d.event(kind)
		ev.Delay = max(delay, 0)
		q.record(ev, now)
	}
	if delay > 0 {
		rec.state = stDelayed
		rec.visibleAt = deadline(now.UnixNano(), delay)
		q.delayed.push(rec)
	} else {
		q.makeVisibleLocked(rec)
	}
	q.wakeUnlockRedrive()
}

// voidGenLocked ends rec's current delivery, settled by one of its
// holders: a duplicate of it (FaultDuplicate) is no longer Valid either,
// and its source is told when q.mu is released (unlock).
func (q *queue) voidGenLocked(rec *record) {
	rec.gen.Add(1)
	if rec.twin != nil {
		q.voidLocked(&rec.twin.source)
		rec.twin = nil
	}
}

// armLocked makes sure a timer wakes the receivers at the earliest pending
// deadline. There is at most one timer per queue.
func (q *queue) armLocked(now time.Time) {
	var at int64
	if q.delayed.len() > 0 {
		at = q.delayed.top().visibleAt
	}
	if q.inflight.len() > 0 {
		if l := q.inflight.top().leaseUntil.Load(); at == 0 || l < at {
			at = l
		}
	}
	if at == 0 || (q.timer != nil && q.timerAt <= at) {
		return
	}
	if q.timer != nil {
		q.timer.Stop()
	}
	q.timerGen++
	gen := q.timerGen
	q.timerAt = at
	q.timer = afterAt(q.b.clock, now, time.Unix(0, at), func() {
		q.mu.Lock()
		if q.timerGen == gen {
			q.timer = nil
		}
		q.wakeLocked()
		q.mu.Unlock()
	})
}

// deadline returns now+d in unix nanos, saturated at the largest time a
// unix-nano int64 holds rather than overflowing into the past (a huge Lease
// or delay must not make a message visible at once).
func deadline(now int64, d time.Duration) int64 {
	if d > 0 && now > math.MaxInt64-int64(d) {
		return math.MaxInt64
	}
	return now + int64(d)
}

// wakeUnlockRedrive wakes the blocked receivers, unlocks q.mu and moves
// the records that used up MaxReceives to the dead-letter queue. Caller
// holds q.mu.
func (q *queue) wakeUnlockRedrive() {
	q.wakeLocked()
	rd := q.takeRedriveLocked()
	q.unlock()
	if rd != nil {
		q.redriveOut(rd)
	}
}

// takeRedriveLocked hands the records marked for the dead-letter queue to
// the caller, who must call redriveOut after unlocking.
func (q *queue) takeRedriveLocked() []*record {
	if len(q.redrive) == 0 {
		return nil
	}
	r := q.redrive
	q.redrive = nil
	return r
}

// deadLetterDest returns the destination called name (a queue or topic),
// creating a queue with the broker's defaults when it does not exist.
func (b *Broker) deadLetterDest(name string) (destination, error) {
	if d := b.lookup(name); d != nil {
		return d, nil
	}
	return b.queue(name, nil)
}

// redriveOut moves records that used up MaxReceives to the dead-letter
// queue, then deletes them (move before delete). It is the broker's own
// move, as SQS's redrive is: publish faults and outages of the dead-letter
// queue do not apply. Called without q.mu.
func (q *queue) redriveOut(recs []*record) {
	for _, rec := range recs {
		now := q.b.clock.Now()
		var m ackwise.Message
		rec.tmpl(&m)
		if dl, err := q.b.deadLetterDest(q.cfg.DeadLetter); err == nil {
			base := dl.base()
			base.mu.Lock()
			dl.storeLocked(&m, now)
			dl.wakeLocked()
			base.mu.Unlock()
		} else {
			// The name is taken by something that cannot hold messages:
			// drop the dead letter rather than loop, and say so.
			q.b.log.Warn("memory: redrive failed, dead letter dropped", ackwise.LogKeyQueue, q.name, "to", q.cfg.DeadLetter, ackwise.LogKeyError, err)
		}
		q.mu.Lock()
		ev := Event{Kind: EventDeadLettered, ID: rec.first.ID, Key: rec.first.Key, BrokerID: rec.first.BrokerID, Partition: -1, Offset: -1, Attempt: rec.receives, Reason: dlq.ReasonMaxAttempts, To: q.cfg.DeadLetter}
		q.settleLocked(rec)
		q.deadLettered++
		q.record(ev, now)
		q.wakeLocked()
		q.unlock() // as every settle does, though a redriven record has no twin left to void
	}
}

func (q *queue) stats() Stats {
	now := q.b.clock.Now()
	q.mu.Lock()
	q.advanceLocked(now.UnixNano())
	rd := q.takeRedriveLocked()
	q.mu.Unlock()
	if rd != nil {
		q.redriveOut(rd)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return Stats{
		Published:    q.published,
		Ready:        int(q.total) - q.inflight.len() - q.delayed.len() - len(q.redrive),
		Delayed:      q.delayed.len(),
		InFlight:     q.inflight.len(),
		Acked:        q.acked,
		DeadLettered: q.deadLettered,
	}
}

func (q *queue) messages() []*ackwise.Message {
	q.mu.Lock()
	defer q.mu.Unlock()
	var recs []*record
	if q.groups != nil {
		for _, g := range q.groups {
			for i := 0; i < g.msgs.len(); i++ {
				recs = append(recs, g.msgs.at(i))
			}
		}
	} else {
		for i := 0; i < q.ready.len(); i++ {
			recs = append(recs, q.ready.at(i))
		}
		recs = append(recs, q.delayed.items...)
		recs = append(recs, q.inflight.items...)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].seq < recs[j].seq })
	out := make([]*ackwise.Message, 0, len(recs))
	for _, r := range recs {
		if r.state == stDeleted {
			continue
		}
		var m ackwise.Message
		r.tmpl(&m)
		m.Headers = m.Headers.Clone()
		m.Attempt = r.receives
		out = append(out, &m)
	}
	return out
}

func (q *queue) closeAll() {
	q.mu.Lock()
	srcs := make([]*QueueSource, 0, len(q.sources))
	for s := range q.sources {
		srcs = append(srcs, s)
	}
	q.mu.Unlock()
	for _, s := range srcs {
		s.Close()
	}
}

// tmpl copies the stored message's immutable fields into m. It never reads
// the delivery facts (Attempt, FirstFailure, Handle), which belong to
// whoever handles the first delivery.
func (r *record) tmpl(m *ackwise.Message) {
	f := &r.first.Message
	m.ID, m.Key, m.Payload, m.Headers = f.ID, f.Key, f.Payload, f.Headers
	m.Source, m.Partition, m.Offset, m.BrokerID, m.PublishedAt = f.Source, f.Partition, f.Offset, f.BrokerID, f.PublishedAt
}

// delivery is one delivery of a queue record; its Message is what the
// engine sees, and Message.Handle points back at it.
type delivery struct {
	ackwise.Message
	rec *record
	gen uint64
	src *QueueSource
	// attempt is the receive count of this delivery. Message.Attempt is
	// the engine's once delivered (an in-place retry increments it, from a
	// timer, while the heartbeat may be extending the lease), so the
	// source never reads it back.
	attempt int
}

// QueueSource consumes a queue. Several QueueSources on one queue are
// competing consumers: each message is delivered to one of them at a time.
//
// Receive may be called from one goroutine and the settle methods from many,
// concurrently. Capabilities: Delay (Nack redelivers after its delay),
// Lease (the queue's visibility timeout), ExtendLease, DeliveryCount
// (Attempt is the broker's receive count) and, on a FIFO queue, Ordered.
type QueueSource struct {
	source
	q *queue

	// Guarded by q.mu.
	dups []*delivery
}

var (
	_ adapters.Source      = (*QueueSource)(nil)
	_ adapters.Invalidator = (*QueueSource)(nil)
	_ dlq.Backlogger       = (*QueueSource)(nil)
)

// QueueSource opens a consumer on the queue name, creating the queue with
// the broker's default configuration when it does not exist.
func (b *Broker) QueueSource(name string) (*QueueSource, error) {
	q, err := b.queue(name, nil)
	if err != nil {
		return nil, err
	}
	s := &QueueSource{q: q}
	s.init(b.newSourceID(name), &q.dest, "", func(time.Time) {
		q.voidLocked(&s.source)
		s.signal()
	})
	q.mu.Lock()
	q.sources[s] = struct{}{}
	q.mu.Unlock()
	return s, nil
}

// ID names the source in the history ("orders#3").
func (s *QueueSource) ID() string { return s.id }

// Backlog returns the number of messages the queue holds: ready, delayed
// and in flight (dlq.Backlogger; dlq.Redrive receives no more than that).
func (s *QueueSource) Backlog(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	st := s.q.stats()
	return st.Ready + st.Delayed + st.InFlight, nil
}

// InjectFault puts a settle or receive fault in force on this source only.
func (s *QueueSource) InjectFault(f Fault) (*InjectedFault, error) { return s.inject(f) }

// Crash makes the source fail as a consumer killed with SIGKILL would: every
// later call returns ErrCrashed, and its unsettled messages come back when
// their leases run out.
func (s *QueueSource) Crash() { s.crash() }

// Receive blocks until at least one message is visible, then fills buf with
// up to len(buf) of them, each leased for the queue's Lease. It returns
// adapters.ErrClosed once the source is closed, ErrCrashed once it crashed,
// ErrUnavailable during an outage, and ctx's error when ctx is done. It
// waits on a wake-up (a publish, a settle, a timer at the next lease or delay
// deadline), never by polling.
func (s *QueueSource) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	q := s.q
	for {
		nowT, ok, err := s.lockReceive(ctx, len(buf) == 0)
		if !ok {
			return 0, err
		}
		now := nowT.UnixNano()
		q.seenNow.Store(now)
		q.advanceLocked(now)
		n := s.heldDuplicates(buf)
		faults := len(q.faults) > 0 || len(s.faults) > 0
		for n < len(buf) {
			rec := q.takeLocked()
			if rec == nil {
				break
			}
			d := q.deliverLocked(rec, s, now)
			buf[n] = &d.Message
			n++
			if faults {
				n = s.duplicateLocked(d, buf, n, nowT)
			}
		}
		if faults {
			s.reorderLocked(buf[:n], nowT)
		}
		rd := q.takeRedriveLocked()
		if n > 0 {
			q.mu.Unlock()
			if rd != nil {
				q.redriveOut(rd)
			}
			return n, nil
		}
		if rd != nil {
			q.mu.Unlock()
			q.redriveOut(rd)
			continue
		}
		q.armLocked(nowT)
		if err := s.waitUnlock(ctx, &q.waiters); err != nil {
			return 0, err
		}
	}
}

func (s *QueueSource) unwaitLocked() { s.unwait(&s.q.waiters) }

// heldDuplicates puts the duplicates FaultDuplicate made that did not fit
// in an earlier batch at the start of buf, as many as fit, and returns how
// many (they are handed out even if the fault was removed since). Caller
// holds q.mu.
func (s *QueueSource) heldDuplicates(buf []*ackwise.Message) int {
	n := 0
	for n < len(buf) && len(s.dups) > 0 {
		buf[n] = &s.dups[0].Message
		s.dups = s.dups[1:]
		n++
	}
	return n
}

// duplicateLocked applies a duplicate fault (FaultDuplicate) to d, just
// delivered into buf[n-1]: when one fires, a second delivery of the same
// attempt goes into buf[n], or is held for the next Receive when buf is
// full. It returns the new n. Caller holds q.mu.
func (s *QueueSource) duplicateLocked(d *delivery, buf []*ackwise.Message, n int, now time.Time) int {
	q := s.q
	x := fire(&d.Message, [2][]*InjectedFault{s.faults, q.faults}, FaultDuplicate)
	if x == nil {
		return n
	}
	d2 := q.dels.alloc()
	*d2 = *d
	d2.Handle = d2
	d.rec.twin = s
	s.recordFault(x, &d.Message, now)
	q.recordDelivery(d2, s, now)
	if n < len(buf) {
		buf[n] = &d2.Message
		return n + 1
	}
	s.dups = append(s.dups, d2)
	return n
}

func (q *queue) deliverLocked(rec *record, s *QueueSource, now int64) *delivery {
	rec.receives++
	rec.state = stInFlight
	gen := rec.gen.Add(1)
	if rec.twin != nil {
		rec.twin = nil // a duplicate of an earlier delivery was voided with it
	}
	rec.leaseUntil.Store(deadline(now, q.cfg.Lease))
	q.inflight.push(rec)
	var d *delivery
	if rec.receives == 1 {
		d = &rec.first
	} else {
		d = q.dels.alloc()
		rec.tmpl(&d.Message)
	}
	d.Attempt = rec.receives
	d.attempt = rec.receives
	d.FirstFailure = rec.firstFailure
	d.Handle = d
	d.rec = rec
	d.gen = gen
	d.src = s
	if q.b.history {
		q.recordDelivery(d, s, time.Unix(0, now))
	}
	return d
}

func (q *queue) recordDelivery(d *delivery, s *QueueSource, now time.Time) {
	q.record(d.event(EventDelivered), now)
}

// handle returns msg's delivery if this source delivered it.
func (s *QueueSource) handle(msg *ackwise.Message) (*delivery, error) {
	if d, ok := s.receipt(msg).(*delivery); ok && d.src == s {
		return d, nil
	}
	return nil, s.notMine(msg)
}

// begin does what every settle call starts with: it checks that msg is
// this source's delivery, ctx is live, the source is neither closed nor
// crashed and the broker available, applies the settle faults of kinds,
// and checks that msg is still its message's live delivery. When the call
// goes on it returns d with q.mu held; a nil d means the call is over, with
// err as its result (nil for a lost ack).
func (s *QueueSource) begin(ctx context.Context, msg *ackwise.Message, kinds ...FaultKind) (d *delivery, now time.Time, err error) {
	return s.beginAt(ctx, msg, false, kinds...)
}

// beginAt is begin; with seen, on the system clock, without history and
// outages, it takes the time from the last Receive's reading instead of
// reading the clock (Ack's fast path; see Ack).
func (s *QueueSource) beginAt(ctx context.Context, msg *ackwise.Message, seen bool, kinds ...FaultKind) (d *delivery, now time.Time, err error) {
	if d, err = s.handle(msg); err != nil {
		return nil, now, err
	}
	if err = s.live(ctx); err != nil {
		return nil, now, err
	}
	q := s.q
	if seen && q.b.sysClock && !q.b.history && q.outageUntil.Load() == 0 && q.b.outageUntil.Load() == 0 {
		now = time.Unix(0, q.seenNow.Load())
	} else {
		now = q.b.clock.Now()
		if err = q.unavailable(now); err != nil {
			return nil, now, err
		}
	}
	if done, err := s.lockSettle(msg, now, kinds...); done {
		return nil, now, err
	}
	if !d.currentLocked(now) {
		s.q.mu.Unlock()
		return nil, now, s.invalid(d)
	}
	return d, now, nil
}

// event returns the history event of kind k about d, naming its source.
func (d *delivery) event(k EventKind) Event {
	f := &d.rec.first
	return Event{Kind: k, Consumer: d.src.id, ID: f.ID, Key: f.Key, BrokerID: f.BrokerID, Partition: -1, Offset: -1, Attempt: d.Attempt}
}

// currentLocked reports whether d is the live delivery of its record.
func (d *delivery) currentLocked(now time.Time) bool {
	r := d.rec
	return r.state == stInFlight && d.gen == r.gen.Load() && now.UnixNano() < r.leaseUntil.Load()
}

func (s *QueueSource) invalid(d *delivery) error {
	return fmt.Errorf("memory: %s (attempt %d) on %s: lease ran out or message settled: %w", d.BrokerID, d.attempt, s.id, adapters.ErrReceiptInvalid)
}

// Ack deletes msg from the queue. It fails with adapters.ErrReceiptInvalid
// when msg's lease ran out or it was already settled (it will be, or was,
// delivered again).
//
// On ackwise.SystemClock with history off and no outage ever set (a
// benchmark or a production-like run), Ack does not read the clock: it
// judges the lease by the last Receive's reading. A lease that ran out
// since can then still be acked, as SQS deletes a message whose visibility
// timeout ran out if nobody received it again; a message that was received
// again is never acked through its old delivery. Everywhere else Ack is
// exact.
func (s *QueueSource) Ack(ctx context.Context, msg *ackwise.Message) error {
	d, now, err := s.beginAt(ctx, msg, true, FaultCrashBeforeAck, FaultCrashBeforeSettle, FaultLoseAck, FaultFailAck)
	if d == nil {
		return err
	}
	q := s.q
	rec := d.rec
	if q.b.history {
		q.record(d.event(EventAcked), now)
	}
	q.settleLocked(rec)
	q.acked++
	if q.groups != nil && len(q.waiters) > 0 {
		q.wakeLocked() // the key's next message is visible now
	}
	q.unlock()
	return nil
}

// Nack makes msg visible again after delay (at once for a delay of zero or
// less); it is then delivered as attempt msg.Attempt+1, or dead-lettered by
// the broker when MaxReceives is used up. Nothing is copied: the message
// stays where it is, invisible, as with SQS ChangeMessageVisibility.
func (s *QueueSource) Nack(ctx context.Context, msg *ackwise.Message, delay time.Duration) error {
	d, now, err := s.begin(ctx, msg, FaultCrashBeforeSettle)
	if d == nil {
		return err
	}
	if rec := d.rec; rec.firstFailure.IsZero() {
		rec.firstFailure = now
	}
	s.q.putBackLocked(d, EventNacked, delay, now)
	return nil
}

// DeadLetter publishes msg to the queue's dead-letter destination with the
// envelope added to its headers (payload and headers otherwise unchanged),
// then deletes it (move before ack). When the dead-letter publish fails the
// message is not deleted and the error is returned. When msg's lease runs
// out (or msg is settled through a duplicate delivery) while the dead
// letter is being written, the dead letter stays, the message is not
// deleted and DeadLetter fails with adapters.ErrReceiptInvalid: the message
// is delivered again, as on SQS when the visibility timeout runs out between
// the send to the dead-letter queue and the delete. The queue's history then
// shows no dead-lettering (the dead-letter destination's shows the publish).
func (s *QueueSource) DeadLetter(ctx context.Context, msg *ackwise.Message, env dlq.Envelope) error {
	d, now, err := s.begin(ctx, msg, FaultCrashBeforeSettle)
	if d == nil {
		return err
	}
	q := s.q
	q.mu.Unlock()

	if err := q.b.deadLetterTo(ctx, q.cfg.DeadLetter, msg, env); err != nil {
		return err
	}

	now = q.b.clock.Now()
	q.mu.Lock()
	if !d.currentLocked(now) {
		q.mu.Unlock()
		return s.invalid(d)
	}
	rec := d.rec
	if q.b.history {
		q.record(deadLettered(d.event(EventDeadLettered), env, q.cfg.DeadLetter), now)
	}
	q.settleLocked(rec)
	q.deadLettered++
	q.wakeLocked()
	q.unlock()
	return nil
}

// deadLetterTo publishes msg with env applied to the destination name.
func (b *Broker) deadLetterTo(ctx context.Context, name string, msg *ackwise.Message, env dlq.Envelope) error {
	dl, err := b.deadLetterDest(name)
	if err != nil {
		return err
	}
	m := ackwise.Message{ID: msg.ID, Key: msg.Key, Payload: msg.Payload, Headers: env.Apply(msg.Headers)}
	if _, err := b.publishInto(ctx, dl, []*ackwise.Message{&m}); err != nil {
		return fmt.Errorf("memory: dead-lettering %s into %q: %w", msg.BrokerID, name, err)
	}
	return nil
}

// Release makes msg visible again at once, without waiting for its lease.
// Its receive count stays as it is: with MaxReceives used up, the broker
// dead-letters it instead of delivering it again, as SQS does after a
// visibility timeout of zero.
func (s *QueueSource) Release(ctx context.Context, msg *ackwise.Message) error {
	d, now, err := s.begin(ctx, msg)
	if d == nil {
		return err
	}
	s.q.putBackLocked(d, EventReleased, 0, now)
	return nil
}

// ExtendLease sets msg's lease to end dur from now (a dur of zero or less
// makes it run out at once). It fails with adapters.ErrReceiptInvalid when
// the lease already ran out or msg was settled.
func (s *QueueSource) ExtendLease(ctx context.Context, msg *ackwise.Message, dur time.Duration) error {
	d, now, err := s.begin(ctx, msg)
	if d == nil {
		return err
	}
	q := s.q
	d.rec.leaseUntil.Store(deadline(now.UnixNano(), dur))
	q.inflight.fix(d.rec)
	if len(q.waiters) > 0 {
		// A shortened lease may now be the earliest deadline: the blocked
		// receivers' timer must not stay set for a later one.
		q.armLocked(now)
	}
	q.mu.Unlock()
	return nil
}

// Valid reports whether msg is this source's live delivery: its lease has
// not run out, it is not settled, and the source is neither closed nor
// crashed. It takes no lock.
//
// On ackwise.SystemClock it does not read the clock (a time.Now costs
// 100ns and more on some virtual machines): it compares the lease with the
// broker's last reading, taken by each Receive, so a lease that ran out
// since then can still look valid; Ack reads the clock and refuses it. On
// any other clock (a VirtualClock) Valid is exact.
func (s *QueueSource) Valid(msg *ackwise.Message) bool {
	d, ok := msg.Handle.(*delivery)
	if !ok || d.src != s || s.crashed.Load() || s.closed.Load() {
		return false
	}
	if d.gen != d.rec.gen.Load() {
		return false
	}
	var now int64
	if s.q.b.sysClock {
		now = s.q.seenNow.Load()
	} else {
		now = s.q.b.clock.Now().UnixNano()
	}
	return now < d.rec.leaseUntil.Load()
}

// OnInvalid sets f (adapters.Invalidator), called, without the broker's
// locks held, after deliveries of the source stopped being Valid on an
// event: it closed or crashed (Close, Crash, an injected crash fault,
// Broker.Delete of the queue), or a duplicate delivery (FaultDuplicate) was
// settled through its twin. A lease that runs out is not an event: f is
// not called for it (the engine's heartbeat keeps leases from running out).
func (s *QueueSource) OnInvalid(f func()) { s.hook.OnInvalid(f) }

// Capabilities: Delay, Lease, ExtendLease, DeliveryCount; Ordered on a FIFO
// queue.
func (s *QueueSource) Capabilities() adapters.Capabilities { return s.q.caps }

// Extensions declares Invalidator (see OnInvalid).
func (s *QueueSource) Extensions() adapters.Extensions {
	return adapters.Extensions{Invalidator: s}
}

// Close stops the source: a blocked Receive returns adapters.ErrClosed, and
// so do later calls. Unsettled deliveries come back when their leases run
// out, as they would on SQS. Closing twice is harmless.
func (s *QueueSource) Close() error {
	q := s.q
	q.mu.Lock()
	s.closed.Store(true)
	s.unwaitLocked()
	delete(q.sources, s)
	q.voidLocked(&s.source)
	q.unlock()
	s.signal()
	return nil
}

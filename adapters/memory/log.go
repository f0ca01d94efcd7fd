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

// Special offsets for [Broker.SeekGroup], as in Kafka.
const (
	// OffsetLatest seeks to the end of the partition: only records published
	// from now on are delivered.
	OffsetLatest int64 = -1
	// OffsetEarliest seeks to the first retained record.
	OffsetEarliest int64 = -2
)

// TopicConfig configures a topic (a partitioned log). The zero value is
// valid and means the documented defaults.
type TopicConfig struct {
	// Partitions is the number of partitions; a record goes to partition
	// murmur2(Key) mod Partitions, as Kafka's default partitioner does, and
	// records with an empty key go round-robin. Zero means 1.
	Partitions int
	// Retention is how many records each partition keeps; older ones are
	// dropped (a consumer group behind them skips to the oldest kept one, as
	// Kafka's auto.offset.reset=earliest does). Zero keeps everything, which
	// long benchmarks should not rely on.
	Retention int
	// DeadLetter is where DeadLetter on a consumer of the topic writes,
	// created as a queue with the broker's defaults when it does not exist.
	// Empty means the topic's name + DeadLetterSuffix (".dlq").
	DeadLetter string
}

func (c TopicConfig) validate(prefix string) error {
	if c.Partitions < 0 || c.Partitions > 1<<16 {
		return fmt.Errorf("memory: %sPartitions = %d: must be in [1, 65536] (0 means 1)", prefix, c.Partitions)
	}
	if c.Retention < 0 {
		return fmt.Errorf("memory: %sRetention = %d: must not be negative (0 keeps everything)", prefix, c.Retention)
	}
	return nil
}

func (c TopicConfig) withDefaults(name string) TopicConfig {
	if c.Partitions == 0 {
		c.Partitions = 1
	}
	c.DeadLetter = deadLetterName(name, c.DeadLetter)
	return c
}

const segSize = 1024

// slot is one record of a partition. The record is the Message of an
// embedded delivery, which the first group to read the record hands out
// without a copy; other deliveries copy its immutable fields (tmpl).
type slot struct {
	first   logDelivery
	claimed bool
}

func (sl *slot) tmpl(m *ackwise.Message) {
	f := &sl.first.Message
	m.ID, m.Key, m.Payload, m.Headers = f.ID, f.Key, f.Payload, f.Headers
	m.Source, m.Partition, m.Offset, m.BrokerID, m.PublishedAt = f.Source, f.Partition, f.Offset, f.BrokerID, f.PublishedAt
}

// partition is one append-only log, stored in fixed-size segments so that
// appending never copies and retention drops whole segments.
type partition struct {
	id    int32
	segs  [][]slot
	base  int64 // offset of segs[0][0]
	start int64 // first retained offset
	end   int64 // next offset
}

func (p *partition) at(off int64) *slot {
	i := off - p.base
	return &p.segs[i/segSize][i%segSize]
}

func (p *partition) appendSlot(retention int) *slot {
	if (p.end-p.base)%segSize == 0 && p.end-p.base == int64(len(p.segs))*segSize {
		p.segs = append(p.segs, make([]slot, segSize))
	}
	m := p.at(p.end)
	p.end++
	if retention > 0 && p.end-p.start > int64(retention) {
		p.start = p.end - int64(retention)
		for len(p.segs) > 1 && p.base+segSize <= p.start {
			p.segs[0] = nil
			p.segs = p.segs[1:]
			p.base += segSize
		}
	}
	return m
}

// topic is a Kafka-like partitioned log with consumer groups.
type topic struct {
	dest
	cfg    TopicConfig
	parts  []*partition
	groups map[string]*group
	rr     uint64

	waiters []*source

	published, acked, deadLettered int64
}

func newTopic(b *Broker, name string, cfg TopicConfig) *topic {
	t := &topic{cfg: cfg, groups: map[string]*group{}}
	t.b, t.name = b, name
	for i := 0; i < cfg.Partitions; i++ {
		t.parts = append(t.parts, &partition{id: int32(i)})
	}
	return t
}

func (t *topic) kind() string { return "topic" }

// partitionFor picks the partition of key as Kafka's default partitioner
// does (murmur2, positive, modulo), round-robin for an empty key.
func (t *topic) partitionFor(key string) *partition {
	n := uint32(len(t.parts))
	if n == 1 {
		return t.parts[0]
	}
	if key == "" {
		t.rr++
		return t.parts[t.rr%uint64(n)]
	}
	return t.parts[(murmur2(key)&0x7fffffff)%n]
}

// PartitionOf returns the partition a record with key goes to in a topic of
// n partitions (keys other than "" only), as Kafka's default partitioner.
func PartitionOf(key string, n int) int32 {
	if n <= 1 {
		return 0
	}
	return int32((murmur2(key) & 0x7fffffff) % uint32(n))
}

func (t *topic) storeLocked(m *ackwise.Message, now time.Time) {
	p := t.partitionFor(m.Key)
	off := p.end
	sl := p.appendSlot(t.cfg.Retention)
	sl.first.Message = t.stored(m, p.id, off, t.arena.id(t.name, '/', int64(p.id), '@', off), now)
	t.published++
	if t.b.history {
		t.record(Event{Kind: EventPublished, ID: sl.first.ID, Key: m.Key, BrokerID: sl.first.BrokerID, Partition: p.id, Offset: off}, now)
	}
}

func (t *topic) wakeLocked() { wakeWaiters(&t.waiters) }

func (t *topic) messages() []*ackwise.Message {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*ackwise.Message
	for _, p := range t.parts {
		for off := p.start; off < p.end; off++ {
			var m ackwise.Message
			p.at(off).tmpl(&m)
			m.Headers = m.Headers.Clone()
			out = append(out, &m)
		}
	}
	return out
}

func (t *topic) stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := Stats{Published: t.published, Acked: t.acked, DeadLettered: t.deadLettered}
	for _, p := range t.parts {
		st.EndOffsets = append(st.EndOffsets, p.end)
	}
	return st
}

func (t *topic) closeAll() {
	t.mu.Lock()
	var srcs []*GroupSource
	for _, g := range t.groups {
		srcs = append(srcs, g.members...)
	}
	t.mu.Unlock()
	for _, s := range srcs {
		s.Close()
	}
}

// group is a consumer group of a topic.
type group struct {
	name    string
	members []*GroupSource // in join order
	parts   []*groupPart
}

// groupPart is a group's state of one partition.
type groupPart struct {
	p         *partition
	committed int64
	owner     *GroupSource
	// epoch changes whenever the partition changes hands or is reset; a
	// delivery of an older epoch is no longer valid.
	epoch     atomic.Uint64
	cursor    int64
	settled   ring[bool] // offsets [committed, cursor)
	redeliver []int64    // released offsets to deliver again, sorted
	// dups are duplicate deliveries (FaultDuplicate) that did not fit in
	// their batch, sorted by offset: they are handed out merged with
	// redeliver, so that none overtakes a released record below it.
	dups         []*logDelivery
	hwm          int64 // one past the highest offset delivered
	redeliveries map[int64]int
}

func (t *topic) groupLocked(name string) *group {
	g := t.groups[name]
	if g == nil {
		g = &group{name: name}
		for _, p := range t.parts {
			gp := &groupPart{p: p, committed: p.start, cursor: p.start}
			g.parts = append(g.parts, gp)
		}
		t.groups[name] = g
	}
	return g
}

// resetLocked makes gp start over from its committed offset under a new
// epoch: deliveries made before are invalid, and held duplicates are
// dropped, as a Kafka client drops the records it fetched of a partition
// revoked or reset.
func (gp *groupPart) resetLocked() {
	gp.epoch.Add(1)
	gp.cursor = gp.committed
	gp.settled.clear()
	gp.redeliver = gp.redeliver[:0]
	clear(gp.dups)
	gp.dups = gp.dups[:0]
}

// rebalanceLocked assigns g's partitions to its members by range assignment
// (members in join order, contiguous ranges, the first ones one more). A
// partition that keeps its owner keeps its state; one that changes hands
// voids its former owner's deliveries, which is told when the caller
// unlocks (t.unlock).
func (t *topic) rebalanceLocked(g *group, now time.Time) {
	n, m := len(g.parts), len(g.members)
	owners := make([]*GroupSource, n)
	if m > 0 {
		per, extra := n/m, n%m
		p := 0
		for i, s := range g.members {
			c := per
			if i < extra {
				c++
			}
			for k := 0; k < c; k++ {
				owners[p] = s
				p++
			}
		}
	}
	for _, s := range g.members {
		s.owned = s.owned[:0]
	}
	for i, gp := range g.parts {
		if gp.owner != owners[i] {
			if o := gp.owner; o != nil {
				t.voidLocked(&o.source)
			}
			gp.owner = owners[i]
			gp.resetLocked()
		}
		if o := owners[i]; o != nil {
			o.owned = append(o.owned, gp)
		}
	}
	t.record(Event{Kind: EventRebalanced, Group: g.name, Partition: -1, Offset: -1}, now)
	t.b.log.Debug("memory: group rebalanced", ackwise.LogKeyTopic, t.name, ackwise.LogKeyGroup, g.name, "members", m)
	t.wakeLocked()
}

// advanceCommitLocked moves gp's committed offset over the settled prefix
// (invariant 2).
func (t *topic) advanceCommitLocked(g *group, gp *groupPart, now time.Time) {
	old := gp.committed
	for gp.settled.len() > 0 && gp.settled.front() {
		gp.settled.pop()
		gp.committed++
	}
	t.commitMovedLocked(g, gp, old, now)
}

// commitMovedLocked forgets the redelivery counts below gp's committed
// offset, which moved up from old, and records the commit.
func (t *topic) commitMovedLocked(g *group, gp *groupPart, old int64, now time.Time) {
	if gp.committed == old {
		return
	}
	if len(gp.redeliveries) > 0 {
		if gp.committed-old > int64(len(gp.redeliveries)) {
			for off := range gp.redeliveries {
				if off < gp.committed {
					delete(gp.redeliveries, off)
				}
			}
		} else {
			for off := old; off < gp.committed; off++ {
				delete(gp.redeliveries, off)
			}
		}
	}
	if t.b.history {
		t.record(Event{Kind: EventCommitted, Group: g.name, Partition: gp.p.id, Offset: gp.committed}, now)
	}
}

// logDelivery is one delivery of a log record.
type logDelivery struct {
	ackwise.Message
	gp    *groupPart
	epoch uint64
	src   *GroupSource
	// done is set, under the topic's lock, by the settle that acks,
	// dead-letters or releases the delivery: a second one fails.
	done bool
}

// GroupSource is one member of a consumer group on a topic. Members of a
// group share the topic's partitions (range assignment, redone whenever a
// member joins, closes or crashes); a member delivers the records of the
// partitions it owns in offset order, and the group's committed offset of a
// partition advances only over records that are settled (acked or
// dead-lettered), never past one in progress.
//
// Receive may be called from one goroutine and the settle methods from many,
// concurrently. Capabilities: Log and Ordered. Nack is not supported (the
// engine retries in place); ExtendLease does nothing.
type GroupSource struct {
	source
	t *topic
	g *group

	// Guarded by t.mu.
	owned []*groupPart
	next  int
	left  bool
	dels  slab[logDelivery]
}

var (
	_ adapters.Source      = (*GroupSource)(nil)
	_ adapters.Invalidator = (*GroupSource)(nil)
	_ dlq.Backlogger       = (*GroupSource)(nil)
)

var logCaps = adapters.Capabilities{Log: true, Ordered: true}

// JoinGroup adds a member to the consumer group groupName of the topic,
// creating the topic with the broker's default configuration and the group
// (at the earliest offsets) when missing. Joining rebalances the group.
func (b *Broker) JoinGroup(topicName, groupName string) (*GroupSource, error) {
	if groupName == "" {
		return nil, fmt.Errorf("memory: group = %q: a consumer group needs a name", groupName)
	}
	t, err := b.topic(topicName, nil)
	if err != nil {
		return nil, err
	}
	now := b.clock.Now()
	t.mu.Lock()
	defer t.unlock()
	if t.deleted {
		return nil, fmt.Errorf("%w: %q was deleted", ErrNotFound, topicName)
	}
	g := t.groupLocked(groupName)
	s := &GroupSource{t: t, g: g}
	s.init(b.newSourceID(topicName+"/"+groupName), &t.dest, g.name, s.leaveLocked)
	g.members = append(g.members, s)
	t.rebalanceLocked(g, now)
	return s, nil
}

// Backlog returns the number of records of the topic the source's group
// has not committed, over all partitions (dlq.Backlogger; dlq.Redrive
// receives no more than that).
func (s *GroupSource) Backlog(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	var n int64
	for _, gp := range s.g.parts {
		n += gp.p.end - max(gp.committed, gp.p.start)
	}
	return int(min(n, math.MaxInt)), nil
}

// Committed returns the committed offset of each partition of group on
// topic: the next offset the group will read after a restart.
func (b *Broker) Committed(topicName, groupName string) ([]int64, error) {
	t, err := b.existingTopic(topicName)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.groups[groupName]
	if g == nil {
		return nil, fmt.Errorf("%w: group %q on topic %q", ErrNotFound, groupName, topicName)
	}
	out := make([]int64, len(g.parts))
	for i, gp := range g.parts {
		out[i] = gp.committed
	}
	return out, nil
}

// SeekGroup sets group's committed offset of partition to offset (or
// OffsetEarliest, OffsetLatest) to replay or skip records, creating the
// group when missing. The partition's owner, if any, starts over from there:
// its deliveries made before become invalid and their acks fail with
// adapters.ErrReceiptInvalid.
func (b *Broker) SeekGroup(topicName, groupName string, partition int32, offset int64) error {
	t, err := b.existingTopic(topicName)
	if err != nil {
		return err
	}
	if groupName == "" {
		return fmt.Errorf("memory: group = %q: a consumer group needs a name", groupName)
	}
	now := b.clock.Now()
	t.mu.Lock()
	defer t.unlock()
	if partition < 0 || int(partition) >= len(t.parts) {
		return fmt.Errorf("memory: partition = %d: topic %q has partitions 0..%d", partition, topicName, len(t.parts)-1)
	}
	p := t.parts[partition]
	switch {
	case offset == OffsetEarliest:
		offset = p.start
	case offset == OffsetLatest:
		offset = p.end
	case offset < p.start || offset > p.end:
		return fmt.Errorf("memory: offset = %d: partition %d of %q holds offsets %d..%d", offset, partition, topicName, p.start, p.end)
	}
	g := t.groupLocked(groupName)
	gp := g.parts[partition]
	gp.committed = offset
	gp.resetLocked()
	if gp.owner != nil {
		t.voidLocked(&gp.owner.source)
	}
	if t.b.history {
		t.record(Event{Kind: EventCommitted, Group: g.name, Partition: partition, Offset: offset}, now)
	}
	t.wakeLocked()
	return nil
}

func (b *Broker) existingTopic(name string) (*topic, error) {
	d, err := b.get(name)
	if err != nil {
		return nil, err
	}
	t, ok := d.(*topic)
	if !ok {
		return nil, fmt.Errorf("%w: %q is a %s, not a topic", ErrConflict, name, d.kind())
	}
	return t, nil
}

// ID names the member in the history ("events/billing#4").
func (s *GroupSource) ID() string { return s.id }

// Assigned returns the partitions the member owns now, ascending.
func (s *GroupSource) Assigned() []int32 {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	out := make([]int32, 0, len(s.owned))
	for _, gp := range s.owned {
		out = append(out, gp.p.id)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// InjectFault puts a settle or receive fault in force on this member only.
func (s *GroupSource) InjectFault(f Fault) (*InjectedFault, error) { return s.inject(f) }

// Crash makes the member fail as a consumer killed with SIGKILL would: every
// later call returns ErrCrashed, it leaves its group, and the records it had
// not settled are re-read from the committed offset by the members that get
// its partitions.
func (s *GroupSource) Crash() { s.crash() }

func (s *GroupSource) leaveLocked(now time.Time) {
	if s.left {
		return
	}
	s.left = true
	s.unwaitLocked()
	g := s.g
	for i, m := range g.members {
		if m == s {
			g.members = append(g.members[:i:i], g.members[i+1:]...)
			break
		}
	}
	s.owned = nil
	s.t.rebalanceLocked(g, now)
	s.signal()
}

func (s *GroupSource) unwaitLocked() { s.unwait(&s.t.waiters) }

// Receive blocks until a partition the member owns has a record it has not
// delivered (or one it released), then fills buf with up to len(buf)
// records, each partition's in offset order. Errors as QueueSource.Receive.
func (s *GroupSource) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	t := s.t
	for {
		nowT, ok, err := s.lockReceive(ctx, len(buf) == 0)
		if !ok {
			return 0, err
		}
		n := 0
		faults := len(t.faults) > 0 || len(s.faults) > 0
		k := len(s.owned)
		for i := 0; i < k && n < len(buf); i++ {
			gp := s.owned[(s.next+i)%k]
			n = s.fetchLocked(gp, buf, n, faults, nowT)
		}
		s.next++
		if faults {
			s.reorderLocked(buf[:n], nowT)
		}
		if n > 0 {
			t.mu.Unlock()
			return n, nil
		}
		if err := s.waitUnlock(ctx, &t.waiters); err != nil {
			return 0, err
		}
	}
}

// fetchLocked delivers records of gp into buf from index n: held
// duplicates and released records first, merged in offset order, then new
// ones.
func (s *GroupSource) fetchLocked(gp *groupPart, buf []*ackwise.Message, n int, faults bool, now time.Time) int {
	p := gp.p
	for n < len(buf) && len(gp.redeliver)+len(gp.dups) > 0 {
		if len(gp.dups) > 0 && (len(gp.redeliver) == 0 || gp.dups[0].Offset <= gp.redeliver[0]) {
			d := gp.dups[0]
			gp.dups[0] = nil
			gp.dups = gp.dups[1:]
			buf[n] = &d.Message
			n++
			s.recordDelivery(d, now)
			continue
		}
		off := gp.redeliver[0]
		gp.redeliver = gp.redeliver[1:]
		if off < gp.committed || gp.settled.at(int(off-gp.committed)) {
			continue
		}
		if off < p.start {
			// Retention dropped it while it was released: nothing is left
			// to deliver, so it no longer holds back the commit.
			gp.settled.set(int(off-gp.committed), true)
			s.t.advanceCommitLocked(s.g, gp, now)
			continue
		}
		n = s.deliverLocked(gp, off, buf, n, faults, now)
	}
	if gp.cursor < p.start {
		// Retention dropped records the group had not read: skip them.
		if gp.settled.len() == 0 {
			old := gp.committed
			gp.committed, gp.cursor = p.start, p.start
			s.t.commitMovedLocked(s.g, gp, old, now)
		}
		for gp.cursor < p.start {
			gp.settled.push(true)
			gp.cursor++
		}
		s.t.advanceCommitLocked(s.g, gp, now)
	}
	for n < len(buf) && gp.cursor < p.end {
		off := gp.cursor
		gp.cursor++
		gp.settled.push(false)
		n = s.deliverLocked(gp, off, buf, n, faults, now)
	}
	return n
}

func (s *GroupSource) deliverLocked(gp *groupPart, off int64, buf []*ackwise.Message, n int, faults bool, now time.Time) int {
	attempt := 1
	if off < gp.hwm {
		if gp.redeliveries == nil {
			gp.redeliveries = map[int64]int{}
		}
		c := gp.redeliveries[off] + 1
		gp.redeliveries[off] = c
		attempt = c + 1
	} else {
		gp.hwm = off + 1
	}
	var d *logDelivery
	if sl := gp.p.at(off); !sl.claimed {
		sl.claimed = true
		d = &sl.first
	} else {
		d = s.dels.alloc()
		sl.tmpl(&d.Message)
	}
	d.Attempt = attempt
	d.Handle = d
	d.gp = gp
	d.epoch = gp.epoch.Load()
	d.src = s
	d.done = false
	buf[n] = &d.Message
	n++
	if s.t.b.history {
		s.recordDelivery(d, now)
	}
	if faults {
		if x := fire(&d.Message, [2][]*InjectedFault{s.faults, s.t.faults}, FaultDuplicate); x != nil {
			d2 := s.dels.alloc()
			*d2 = *d
			d2.Handle = d2
			s.recordFault(x, &d.Message, now)
			if n < len(buf) {
				buf[n] = &d2.Message
				n++
				s.recordDelivery(d2, now)
			} else {
				// Held for a later Receive (recorded when handed out),
				// in offset order among the partition's released
				// records.
				i := sort.Search(len(gp.dups), func(i int) bool { return gp.dups[i].Offset > off })
				gp.dups = append(gp.dups, nil)
				copy(gp.dups[i+1:], gp.dups[i:])
				gp.dups[i] = d2
			}
		}
	}
	return n
}

func (s *GroupSource) recordDelivery(d *logDelivery, now time.Time) {
	s.t.record(d.event(EventDelivered), now)
}

func (s *GroupSource) handle(msg *ackwise.Message) (*logDelivery, error) {
	if d, ok := s.receipt(msg).(*logDelivery); ok && d.src == s {
		return d, nil
	}
	return nil, s.notMine(msg)
}

// begin does what every settle call starts with, as QueueSource.begin
// does: the delivery, ctx, the source's state, an outage, the settle faults
// of kinds, and the partition still being the member's under the same
// epoch. When the call goes on it returns d with t.mu held; a nil d means
// the call is over, with err as its result (nil for a lost ack).
func (s *GroupSource) begin(ctx context.Context, msg *ackwise.Message, kinds ...FaultKind) (d *logDelivery, now time.Time, err error) {
	if d, err = s.handle(msg); err != nil {
		return nil, now, err
	}
	if err = s.live(ctx); err != nil {
		return nil, now, err
	}
	// A log has no leases: the clock is only needed for outages and the
	// history's times.
	if t := s.t; t.b.history || t.outageUntil.Load() != 0 || t.b.outageUntil.Load() != 0 {
		now = t.b.clock.Now()
		if err = t.unavailable(now); err != nil {
			return nil, now, err
		}
	}
	if done, err := s.lockSettle(msg, now, kinds...); done {
		return nil, now, err
	}
	if !d.currentLocked() {
		s.t.mu.Unlock()
		return nil, now, s.invalid(d)
	}
	return d, now, nil
}

// event returns the history event of kind k about d, naming its member.
func (d *logDelivery) event(k EventKind) Event {
	return Event{Kind: k, Consumer: d.src.id, Group: d.src.group, ID: d.ID, Key: d.Key, BrokerID: d.BrokerID, Partition: d.Partition, Offset: d.Offset, Attempt: d.Attempt}
}

func (d *logDelivery) currentLocked() bool {
	return !d.src.left && d.epoch == d.gp.epoch.Load()
}

// settleOnceLocked marks d done, or fails when a settle already did.
func (s *GroupSource) settleOnceLocked(d *logDelivery) error {
	if d.done {
		return s.settledTwice(d)
	}
	d.done = true
	return nil
}

func (s *GroupSource) settledTwice(d *logDelivery) error {
	return fmt.Errorf("memory: %s on %s: already settled or released", d.BrokerID, s.id)
}

func (s *GroupSource) invalid(d *logDelivery) error {
	return fmt.Errorf("memory: %s on %s: partition revoked or reset: %w", d.BrokerID, s.id, adapters.ErrReceiptInvalid)
}

// settleLocked marks d's record settled and commits the settled prefix. It
// reports false when the record was already settled (a duplicate).
func (s *GroupSource) settleLocked(d *logDelivery, now time.Time) bool {
	gp := d.gp
	idx := d.Offset - gp.committed
	if idx < 0 || idx >= int64(gp.settled.len()) || gp.settled.at(int(idx)) {
		return false
	}
	gp.settled.set(int(idx), true)
	s.t.advanceCommitLocked(s.g, gp, now)
	return true
}

// Ack marks msg's record settled; the group's committed offset advances
// once every record below it is settled. Acking a record through a second
// delivery of it (a duplicate) is a no-op; a second settle of the same
// delivery fails. It fails with adapters.ErrReceiptInvalid when the
// partition was revoked or reset since the delivery.
func (s *GroupSource) Ack(ctx context.Context, msg *ackwise.Message) error {
	d, now, err := s.begin(ctx, msg, FaultCrashBeforeAck, FaultCrashBeforeSettle, FaultLoseAck, FaultFailAck)
	if d == nil {
		return err
	}
	t := s.t
	if err := s.settleOnceLocked(d); err != nil {
		t.mu.Unlock()
		return err
	}
	if t.b.history {
		t.record(d.event(EventAcked), now)
	}
	if s.settleLocked(d, now) {
		t.acked++
	}
	t.mu.Unlock()
	return nil
}

// Nack is not supported on a log: it returns ErrNackUnsupported and
// changes nothing (Capabilities.Delay is false).
func (s *GroupSource) Nack(ctx context.Context, msg *ackwise.Message, delay time.Duration) error {
	if _, err := s.handle(msg); err != nil {
		return err
	}
	return fmt.Errorf("memory: Nack of %s: %w", msg.BrokerID, ErrNackUnsupported)
}

// DeadLetter publishes msg with the envelope added to its headers to the
// topic's dead-letter destination (payload and headers otherwise
// unchanged), then marks the record settled (move before ack). When the
// dead-letter publish fails the record stays unsettled and the error is
// returned. When the partition is revoked or reset (a rebalance,
// SeekGroup, Close) while the dead letter is being written, the dead letter
// stays, the record is not marked settled and DeadLetter fails with
// adapters.ErrReceiptInvalid: the partition's owner reads it again from the
// committed offset, as a Kafka consumer whose partition was revoked before
// its commit would.
func (s *GroupSource) DeadLetter(ctx context.Context, msg *ackwise.Message, env dlq.Envelope) error {
	d, now, err := s.begin(ctx, msg, FaultCrashBeforeSettle)
	if d == nil {
		return err
	}
	t := s.t
	done := d.done
	t.mu.Unlock()
	if done {
		return s.settledTwice(d)
	}

	if err := t.b.deadLetterTo(ctx, t.cfg.DeadLetter, msg, env); err != nil {
		return err
	}

	now = t.b.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if !d.currentLocked() {
		return s.invalid(d)
	}
	if err := s.settleOnceLocked(d); err != nil {
		return err
	}
	if t.b.history {
		t.record(deadLettered(d.event(EventDeadLettered), env, t.cfg.DeadLetter), now)
	}
	if s.settleLocked(d, now) {
		t.deadLettered++
	}
	return nil
}

// Release leaves msg's record unsettled (its offset is not committed) and
// delivers it again from this member, before newer records of its
// partition.
func (s *GroupSource) Release(ctx context.Context, msg *ackwise.Message) error {
	d, now, err := s.begin(ctx, msg)
	if d == nil {
		return err
	}
	t := s.t
	defer t.mu.Unlock()
	if err := s.settleOnceLocked(d); err != nil {
		return err
	}
	gp := d.gp
	idx := d.Offset - gp.committed
	if idx < 0 || gp.settled.at(int(idx)) {
		return nil // settled through another delivery of the record
	}
	i := sort.Search(len(gp.redeliver), func(i int) bool { return gp.redeliver[i] >= d.Offset })
	if i == len(gp.redeliver) || gp.redeliver[i] != d.Offset {
		gp.redeliver = append(gp.redeliver, 0)
		copy(gp.redeliver[i+1:], gp.redeliver[i:])
		gp.redeliver[i] = d.Offset
	}
	if t.b.history {
		t.record(d.event(EventReleased), now)
	}
	t.wakeLocked()
	return nil
}

// ExtendLease does nothing: a log record has no lease while its partition
// is owned.
func (s *GroupSource) ExtendLease(ctx context.Context, msg *ackwise.Message, d time.Duration) error {
	return nil
}

// Valid reports whether msg's partition is still this member's under the
// same epoch and the member is neither closed nor crashed. It takes no lock.
// Each of these ends is an event the member tells (see OnInvalid).
func (s *GroupSource) Valid(msg *ackwise.Message) bool {
	d, ok := msg.Handle.(*logDelivery)
	if !ok || d.src != s || s.crashed.Load() || s.closed.Load() {
		return false
	}
	return d.epoch == d.gp.epoch.Load()
}

// OnInvalid sets f (adapters.Invalidator), called, without the broker's
// locks held, after the member's deliveries stopped being Valid: it lost a
// partition (another member joined, it or another member closed or
// crashed), SeekGroup reset one of its partitions, or it closed or crashed
// (Crash, an injected crash fault, Broker.Delete of the topic).
func (s *GroupSource) OnInvalid(f func()) { s.hook.OnInvalid(f) }

// Capabilities: Log and Ordered.
func (s *GroupSource) Capabilities() adapters.Capabilities { return logCaps }

// Extensions declares Invalidator (see OnInvalid).
func (s *GroupSource) Extensions() adapters.Extensions {
	return adapters.Extensions{Invalidator: s}
}

// Close leaves the group (its partitions go to the other members, which
// re-read unsettled records from the committed offset). Offsets are
// committed as records are settled, so nothing is left to commit. A blocked
// Receive returns adapters.ErrClosed, and so do later calls. Closing twice is
// harmless.
func (s *GroupSource) Close() error {
	now := s.t.b.clock.Now()
	s.t.mu.Lock()
	s.closed.Store(true)
	s.leaveLocked(now)
	s.t.unlock()
	return nil
}

package memorytest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/retry"
)

// coreConfig is the part of a Simulation the event loop reads, defaulted.
type coreConfig struct {
	mode          SimMode
	workers       int
	keyOrdered    bool
	partitions    int
	lease         time.Duration
	rates         [numFaultKinds]float64
	retry         retry.Policy
	classifiers   []ackwise.Classifier
	restartDelay  time.Duration
	maxOutage     time.Duration
	maxDeliveries int
}

// faultLabel identifies a fault's place in a run, independently of the
// run's other faults: the message, its delivery, the call in it.
type faultLabel struct {
	kind     SimFaultKind
	idx      int
	delivery int
	call     int
}

type msgState int

const (
	msgPending msgState = iota
	msgAcked
	msgDiscarded
	msgDeadLettered
)

// smsg is a stored message and the broker's state of it.
type smsg struct {
	idx        int
	m          *ackwise.Message
	state      msgState
	deliveries int // deliveries so far, duplicates included (fault labels count them)
	handled    int // handler calls that returned nil
	// queue
	receives    int           // the broker's receive count: Message.Attempt
	receipt     int           // the current lease; a settle with another is refused
	availableAt time.Duration // when it may be delivered (again)
	seq         int           // its place in its key's line
	// log
	part   int
	offset int64
}

// twin is a duplicate delivery waiting to be made (queue).
type twin struct {
	s           *smsg
	receipt     int
	seq         int
	availableAt time.Duration
}

// partition is a log partition and the consumer's position in it.
type partition struct {
	id        int
	records   []*smsg
	pos       int           // next record to deliver
	committed int           // the group's committed offset
	attempt   int           // the engine's attempt count of records[pos], in memory
	blocked   time.Duration // a retry in place waits until then
	dups      []*smsg
	busy      bool
}

// delivery is one handler call.
type delivery struct {
	s       *smsg
	n       int // the message's delivery number
	attempt int
	receipt int
	twin    bool
	part    *partition
	msg     *ackwise.Message
	start   time.Duration
	end     time.Duration
	calls   int // SimEnv.Call and Publish calls made so far
	err     error
	panic   bool
	crashed bool // the process died inside the handler
}

type simTimer struct {
	at      time.Duration
	seq     int
	proc    int
	f       func()
	stopped bool
}

// core is one seed's run: the broker, the consumer process and the faults.
type core struct {
	cfg    coreConfig
	seed   uint64
	forced map[faultLabel]SimFault
	swarm  [numFaultKinds]bool
	rs     *rand.Rand // scheduling choices; faults come from hashes
	env    *SimEnv
	setup  func() ackwise.Handler

	// mu guards what handlers reach through SimEnv while several run.
	mu        sync.Mutex
	now       time.Duration
	proc      int
	down      bool
	upAt      time.Duration
	handler   ackwise.Handler
	msgs      []*smsg
	twins     []*twin
	parts     []*partition
	nextSeq   int
	timers    []*simTimer
	timerSeq  int
	outages   [][2]time.Duration
	faults    []SimFault
	events    []SimEvent
	handled   int
	published []*ackwise.Message
	cands     []int         // pickQueue's buffer
	lastWork  time.Duration // when the last batch ended
}

func newCore(cfg coreConfig, seed uint64, forced map[faultLabel]SimFault) *core {
	c := &core{cfg: cfg, seed: seed, forced: forced, rs: rand.New(rand.NewPCG(seed, 0x5c4ed))}
	for k := 1; k < numFaultKinds; k++ {
		c.swarm[k] = unit(mix(seed, uint64(k), 0x5a4a4, 0, 0)) < 0.5
	}
	if cfg.mode != SimLog {
		c.swarm[SimRebalance] = false
	} else {
		c.swarm[SimReorder] = false
	}
	if !slices.ContainsFunc(c.swarm[:], func(on bool) bool { return on }) {
		c.swarm = [numFaultKinds]bool{} // the seed drew none: it gets them all
		for k := 1; k < numFaultKinds; k++ {
			c.swarm[k] = cfg.mode == SimLog && SimFaultKind(k) != SimReorder || cfg.mode != SimLog && SimFaultKind(k) != SimRebalance
		}
	}
	return c
}

// mix hashes a fault's place with the seed (splitmix64 steps), so that
// whether it fires depends on nothing else: not on the order of draws,
// which several workers make nondeterministic.
func mix(seed, a, b, d, e uint64) uint64 {
	h := seed
	for _, v := range [...]uint64{a, b, d, e} {
		h ^= v + 0x9e3779b97f4a7c15 + (h << 6) + (h >> 2)
		h += 0x9e3779b97f4a7c15
		h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9
		h = (h ^ (h >> 27)) * 0x94d049bb133111eb
		h ^= h >> 31
	}
	return h
}

// unit maps a hash to [0, 1).
func unit(h uint64) float64 { return float64(h>>11) / (1 << 53) }

// fault reports whether a fault of kind fires at the place given, and
// records it. Caller holds c.mu.
func (c *core) fault(kind SimFaultKind, s *smsg, deliveryN, call int) (SimFault, bool) {
	l := faultLabel{kind: kind, idx: s.idx, delivery: deliveryN, call: call}
	var f SimFault
	if c.forced != nil {
		var ok bool
		if f, ok = c.forced[l]; !ok {
			return SimFault{}, false
		}
	} else {
		if !c.swarm[kind] || c.cfg.rates[kind] <= 0 {
			return SimFault{}, false
		}
		h := mix(c.seed, uint64(kind), uint64(s.idx), uint64(deliveryN), uint64(call))
		if unit(h) >= c.cfg.rates[kind] {
			return SimFault{}, false
		}
		h2 := mix(h, 1, 2, 3, 4)
		f = SimFault{Kind: kind, Index: s.idx, Delivery: deliveryN, Call: call}
		switch kind {
		case SimOutage:
			f.Outage = time.Second + time.Duration(unit(h2)*float64(max(c.cfg.maxOutage-time.Second, 0)))
			f.Outage = f.Outage.Round(time.Millisecond)
		case SimPublishFailure:
			f.Stored = h2&1 == 1
		}
	}
	f.Msg, f.Key, f.At = s.m.ID, s.m.Key, c.now
	c.faults = append(c.faults, f)
	return f, true
}

func (c *core) event(s *smsg, d *delivery, what, detail string) {
	e := SimEvent{At: c.now, Process: c.proc, What: what, Detail: detail}
	if s != nil {
		e.Msg, e.Key = s.m.ID, s.m.Key
	}
	if d != nil {
		e.Delivery, e.Attempt = d.n, d.attempt
	}
	c.events = append(c.events, e)
}

func (c *core) load(workload []*ackwise.Message) {
	c.msgs = make([]*smsg, len(workload))
	c.events = make([]SimEvent, 0, 8*len(workload)+16)
	if c.cfg.mode == SimLog {
		c.parts = make([]*partition, c.cfg.partitions)
		for i := range c.parts {
			c.parts[i] = &partition{id: i, attempt: 1}
		}
	}
	for i, m := range workload {
		s := &smsg{idx: i, m: m, seq: i}
		if c.cfg.mode == SimLog {
			p := i % c.cfg.partitions
			if m.Key != "" {
				p = int(memory.PartitionOf(m.Key, c.cfg.partitions))
			}
			s.part, s.offset = p, int64(len(c.parts[p].records))
			c.parts[p].records = append(c.parts[p].records, s)
		}
		c.msgs[i] = s
	}
	c.nextSeq = len(workload)
}

// loop runs the seed until nothing is left to do. It returns an error when
// the seed does not finish within its deliveries.
func (c *core) loop() error {
	limit := c.cfg.maxDeliveries
	if limit <= 0 {
		limit = 50*len(c.msgs) + 1000
	}
	c.proc = 1
	c.event(nil, nil, "start", fmt.Sprintf("%d messages, %s mode", len(c.msgs), c.cfg.mode))
	if c.handler = c.setup(); c.handler == nil {
		return errNilHandler
	}
	for {
		if c.down && c.now >= c.upAt {
			c.down = false
			c.proc++
			c.event(nil, nil, "restart", "Setup builds a new handler from the durable state")
			if c.handler = c.setup(); c.handler == nil {
				return errNilHandler
			}
		}
		if c.fireTimers() {
			continue
		}
		if !c.down {
			if batch := c.pick(); len(batch) > 0 {
				if c.handled >= limit {
					return fmt.Errorf("memorytest: the seed did not finish within %d deliveries (a message retried forever? see Simulation.MaxDeliveries)", limit)
				}
				c.runBatch(batch)
				c.lastWork = c.now
				continue
			}
		}
		next, ok := c.nextTime()
		if !ok {
			c.event(nil, nil, "quiet", "every message settled")
			return nil
		}
		c.now = next
	}
}

// fireTimers runs the process timers that are due, oldest first, and
// reports whether it ran one.
func (c *core) fireTimers() bool {
	ran := false
	for {
		i := -1
		for j, tm := range c.timers {
			if tm.at <= c.now && (i < 0 || tm.at < c.timers[i].at || (tm.at == c.timers[i].at && tm.seq < c.timers[i].seq)) {
				i = j
			}
		}
		if i < 0 {
			return ran
		}
		tm := c.timers[i]
		c.timers = slices.Delete(c.timers, i, i+1)
		if tm.stopped || tm.proc != c.proc || c.down {
			continue
		}
		c.event(nil, nil, "timer fired", "")
		tm.f()
		ran = true
	}
}

// nextTime is the time of the next thing that can happen.
func (c *core) nextTime() (time.Duration, bool) {
	next, ok := time.Duration(math.MaxInt64), false
	at := func(t time.Duration) {
		if t > c.now && t < next {
			next, ok = t, true
		}
	}
	if c.down {
		at(c.upAt)
	}
	timers := next
	for _, tm := range c.timers {
		if !tm.stopped && tm.proc == c.proc {
			timers = min(timers, tm.at)
		}
	}
	for _, s := range c.msgs {
		if s.state == msgPending && c.cfg.mode == SimQueue {
			at(s.availableAt)
		}
	}
	for _, tw := range c.twins {
		at(tw.availableAt)
	}
	for _, p := range c.parts {
		if p.pos < len(p.records) || len(p.dups) > 0 {
			at(p.blocked)
		}
	}
	// Timers run while messages wait; once none does, for timerHorizon
	// more (a timer that re-arms itself forever would never let the seed
	// end).
	if ok || timers <= c.lastWork+timerHorizon {
		at(timers)
	}
	return next, ok
}

// timerHorizon is how long after the last handler call the process's
// timers still run once no message is waiting.
const timerHorizon = time.Minute

var errNilHandler = errors.New("memorytest: Simulation.Setup returned a nil handler")

// pick chooses the deliveries of the next batch: up to Workers messages
// the broker may hand out now.
func (c *core) pick() []*delivery {
	var batch []*delivery
	for len(batch) < c.cfg.workers {
		var d *delivery
		if c.cfg.mode == SimLog {
			d = c.pickLog()
		} else {
			d = c.pickQueue()
		}
		if d == nil {
			break
		}
		batch = append(batch, d)
	}
	for _, p := range c.parts {
		p.busy = false
	}
	return batch
}

// pickQueue delivers one message: the oldest available with even odds,
// else any available one; with KeyOrdered only the first of its key's line.
func (c *core) pickQueue() *delivery {
	var head map[string]int // key → lowest seq among pending messages and twins
	if c.cfg.keyOrdered {
		head = map[string]int{}
		note := func(k string, seq int) {
			if k == "" {
				return
			}
			if h, ok := head[k]; !ok || seq < h {
				head[k] = seq
			}
		}
		for _, s := range c.msgs {
			if s.state == msgPending {
				note(s.m.Key, s.seq)
			}
		}
		for _, tw := range c.twins {
			note(tw.s.m.Key, tw.seq)
		}
	}
	ready := func(key string, seq int, at time.Duration) bool {
		if at > c.now {
			return false
		}
		if head != nil && key != "" && head[key] != seq {
			return false
		}
		return true
	}
	cands := c.cands[:0] // msgs index, or -(twins index)-1
	oldest, oldestSeq := 0, math.MaxInt
	for i, s := range c.msgs {
		if s.state == msgPending && ready(s.m.Key, s.seq, s.availableAt) {
			cands = append(cands, i)
			if s.seq < oldestSeq {
				oldest, oldestSeq = len(cands)-1, s.seq
			}
		}
	}
	for i, tw := range c.twins {
		if ready(tw.s.m.Key, tw.seq, tw.availableAt) {
			cands = append(cands, -i-1)
		}
	}
	c.cands = cands
	if len(cands) == 0 {
		return nil
	}
	choice := oldest
	if c.rs.IntN(2) == 0 {
		choice = c.rs.IntN(len(cands))
	}
	if ci := cands[choice]; ci < 0 {
		tw := c.twins[-ci-1]
		c.twins = slices.Delete(c.twins, -ci-1, -ci)
		s := tw.s
		s.deliveries++
		d := &delivery{s: s, n: s.deliveries, attempt: max(s.receives, 1), receipt: tw.receipt, twin: true}
		// The twin holds the key's line no more than the message did.
		return c.deliver(d)
	} else {
		s := c.msgs[ci]
		s.deliveries++
		s.receives++
		s.receipt++
		s.availableAt = c.now + c.cfg.lease
		d := &delivery{s: s, n: s.deliveries, attempt: s.receives, receipt: s.receipt}
		if _, ok := c.fault(SimDuplicate, s, d.n, 0); ok {
			c.twins = append(c.twins, &twin{s: s, receipt: s.receipt, seq: s.seq, availableAt: c.now})
			c.event(s, d, "fault: duplicate", "the broker will deliver it once more")
		}
		return c.deliver(d)
	}
}

// pickLog delivers the next record of a partition that is free: its
// duplicate first, if any.
func (c *core) pickLog() *delivery {
	var cands []*partition
	for _, p := range c.parts {
		if !p.busy && p.blocked <= c.now && (len(p.dups) > 0 || p.pos < len(p.records)) {
			cands = append(cands, p)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	p := cands[c.rs.IntN(len(cands))]
	p.busy = true
	if len(p.dups) > 0 {
		s := p.dups[0]
		p.dups = p.dups[1:]
		s.deliveries++
		return c.deliver(&delivery{s: s, n: s.deliveries, attempt: 1, twin: true, part: p})
	}
	s := p.records[p.pos]
	s.deliveries++
	d := &delivery{s: s, n: s.deliveries, attempt: p.attempt, part: p}
	if _, ok := c.fault(SimDuplicate, s, d.n, 0); ok {
		p.dups = append(p.dups, s)
		c.event(s, d, "fault: duplicate", "the record will be read once more")
	}
	return c.deliver(d)
}

// deliver makes the handler's copy of the message and logs the delivery.
func (c *core) deliver(d *delivery) *delivery {
	src := d.s.m
	m := &ackwise.Message{
		ID: src.ID, Key: src.Key, Payload: src.Payload, Headers: src.Headers.Clone(),
		Source: "sim", Partition: -1, Offset: -1, Attempt: d.attempt,
		BrokerID: "sim-" + strconv.Itoa(d.s.idx),
	}
	if c.cfg.mode == SimLog {
		m.Partition, m.Offset = int32(d.s.part), d.s.offset
		m.BrokerID = fmt.Sprintf("sim/%d@%d", d.s.part, d.s.offset)
	}
	d.msg = m
	d.start = c.now
	d.end = c.now + time.Duration(1+c.rs.IntN(20))*time.Millisecond
	what := "delivered"
	if d.twin {
		what = "delivered (duplicate)"
	}
	c.event(d.s, d, what, "")
	if f, ok := c.fault(SimOutage, d.s, d.n, 0); ok {
		c.outages = append(c.outages, [2]time.Duration{c.now, c.now + f.Outage})
		c.event(d.s, d, "fault: outage", fmt.Sprintf("SimEnv.Call fails until %s", fmtAt(c.now+f.Outage)))
	}
	return d
}

type deliveryKey struct{}

// runBatch runs the batch's handlers, concurrently when there are several,
// then settles each at its end time, in end order.
func (c *core) runBatch(batch []*delivery) {
	c.handled += len(batch)
	if len(batch) == 1 {
		c.invoke(batch[0])
	} else {
		var wg sync.WaitGroup
		for _, d := range batch {
			wg.Go(func() { c.invoke(d) })
		}
		wg.Wait()
	}
	slices.SortStableFunc(batch, func(a, b *delivery) int { return int(a.end - b.end) })
	for _, d := range batch {
		c.now = d.end
		c.fireTimers() // those due while the handler ran: they run alongside it
		if c.down {
			c.event(d.s, d, "lost", "the process died while the handler ran: nothing settled")
			continue
		}
		c.settle(d)
	}
}

func (c *core) invoke(d *delivery) {
	defer func() {
		if p := recover(); p != nil {
			if _, ok := p.(simCrash); ok {
				return // d.crashed is set
			}
			d.err, d.panic = fmt.Errorf("memorytest: handler panicked: %v", p), true
		}
	}()
	ctx := context.WithValue(context.Background(), deliveryKey{}, d)
	d.err = c.handler.Handle(ctx, d.msg)
}

type settleKind int

const (
	settleAck settleKind = iota
	settleDiscard
	settleRetry
	settleDeadLetter
)

// settle decides what the engine does with a finished delivery and does
// it, with the faults that fire there.
func (c *core) settle(d *delivery) {
	s := d.s
	if d.crashed {
		c.event(s, d, "died", "the process died inside the handler: nothing settled")
		c.returned(d)
		c.crash()
		return
	}
	kind, detail, delay := settleAck, "ok", time.Duration(0)
	if d.err == nil {
		s.handled++
	} else {
		cl := ackwise.Classify(d.err, c.cfg.classifiers...)
		if d.panic {
			cl = ackwise.Classification{Class: ackwise.ClassPermanent}
		}
		detail = fmt.Sprintf("%v [%s]", d.err, cl.Class)
		switch {
		case cl.Class == ackwise.ClassDiscard:
			kind = settleDiscard
		case cl.Class == ackwise.ClassPermanent:
			kind = settleDeadLetter
		case c.cfg.retry.Exhausted(d.attempt):
			kind, detail = settleDeadLetter, detail+", attempts used up"
		default:
			kind, delay = settleRetry, cl.After
			if delay <= 0 {
				delay = c.retryDelay(d.attempt)
			}
		}
	}
	c.event(s, d, "handled", detail)
	if _, ok := c.fault(SimCrashBeforeAck, s, d.n, 0); ok {
		c.event(s, d, "fault: crash-before-ack", "the process dies before its settle reaches the broker")
		c.returned(d)
		c.crash()
		return
	}
	if kind == settleAck || kind == settleDiscard {
		if _, ok := c.fault(SimLoseAck, s, d.n, 0); ok {
			c.loseAck(d)
			return
		}
	}
	if c.cfg.mode == SimLog {
		c.settleLog(d, kind, delay)
	} else {
		c.settleQueue(d, kind, delay)
	}
	if _, ok := c.fault(SimCrashAfterAck, s, d.n, 0); ok {
		c.event(s, d, "fault: crash-after-ack", "the process dies after the settle")
		c.crash()
		return
	}
	if c.cfg.mode == SimLog && !d.twin {
		if _, ok := c.fault(SimRebalance, s, d.n, 0); ok {
			p := d.part
			c.event(s, d, "fault: rebalance", fmt.Sprintf("partition %d revoked and assigned again: re-read from offset %d", p.id, p.committed))
			c.rewind(p)
		}
	}
}

// retryDelay is the retry policy's delay after failed attempt, its jitter
// drawn from the seed.
func (c *core) retryDelay(attempt int) time.Duration {
	p := c.cfg.retry.WithDefaults()
	jitter := p.Jitter
	p.Jitter = retry.NoJitter
	d := p.Delay(attempt)
	if jitter == retry.NoJitter || len(p.Tiers) > 0 {
		return d
	}
	f := float64(d) * (1 + jitter*(2*c.rs.Float64()-1))
	if m := float64(p.MaxInterval); f > m {
		f = 2*m - f
	}
	return time.Duration(max(f, 0)).Round(time.Millisecond)
}

func (c *core) settleQueue(d *delivery, kind settleKind, delay time.Duration) {
	s := d.s
	if s.state != msgPending || d.receipt != s.receipt {
		c.event(s, d, "settle refused", "receipt invalid: settled through another delivery, or leased again")
		return
	}
	if kind != settleRetry {
		c.settled(d, kind)
		return
	}
	s.receipt++
	s.availableAt = c.now + delay
	c.event(s, d, "nacked", "redelivered in "+delay.String())
	c.reorder(d)
}

// settled records the end of d's message: acked, discarded or
// dead-lettered.
func (c *core) settled(d *delivery, kind settleKind) {
	switch kind {
	case settleAck:
		d.s.state = msgAcked
		c.event(d.s, d, "acked", "")
	case settleDiscard:
		d.s.state = msgDiscarded
		c.event(d.s, d, "discarded", "acked and dropped")
	case settleDeadLetter:
		d.s.state = msgDeadLettered
		c.event(d.s, d, "dead-lettered", "")
	}
}

func (c *core) settleLog(d *delivery, kind settleKind, delay time.Duration) {
	s, p := d.s, d.part
	if d.twin {
		c.event(s, d, "duplicate settled", "the offset is the original read's")
		return
	}
	if kind == settleRetry {
		p.attempt++
		p.blocked = c.now + delay
		c.event(s, d, "retry in place", fmt.Sprintf("partition %d waits %v", p.id, delay))
		return
	}
	c.settled(d, kind)
	p.pos++
	p.attempt = 1
	p.committed = p.pos
	c.event(s, d, "committed", fmt.Sprintf("partition %d offset %d", p.id, p.committed))
}

// loseAck: the ack does not reach the broker.
func (c *core) loseAck(d *delivery) {
	s := d.s
	if c.cfg.mode == SimLog {
		if d.twin {
			c.event(s, d, "fault: lose-ack", "a duplicate's ack: nothing to lose")
			return
		}
		p := d.part
		if s.state == msgPending {
			s.state = msgAcked
		}
		p.pos++
		p.attempt = 1
		c.event(s, d, "fault: lose-ack", fmt.Sprintf("settled, but the commit of partition %d offset %d is lost (still %d)", p.id, p.pos, p.committed))
		return
	}
	c.event(s, d, "fault: lose-ack", "the broker redelivers it when its lease runs out")
	c.returned(d)
}

// returned notes that a queue delivery went unsettled: the message comes
// back when its lease runs out, maybe behind newer messages of its key.
func (c *core) returned(d *delivery) {
	if c.cfg.mode == SimQueue && d.s.state == msgPending && d.receipt == d.s.receipt {
		c.reorder(d)
	}
}

func (c *core) reorder(d *delivery) {
	if _, ok := c.fault(SimReorder, d.s, d.n, 0); ok {
		d.s.seq = c.nextSeq
		c.nextSeq++
		c.event(d.s, d, "fault: reorder", "its redelivery goes behind the newer messages of its key")
	}
}

// crash kills the process: its timers and handler memory are gone; a log
// consumer's partitions are re-read from their committed offsets.
func (c *core) crash() {
	c.down = true
	c.upAt = c.now + c.cfg.restartDelay
	c.handler = nil
	c.timers = c.timers[:0]
	c.event(nil, nil, "crash", "in-memory state and timers lost; restart in "+c.cfg.restartDelay.String())
	for _, p := range c.parts {
		c.rewind(p)
	}
}

func (c *core) rewind(p *partition) {
	for _, s := range p.records[p.committed:p.pos] {
		s.state = msgPending
	}
	if p.pos < len(p.records) {
		p.records[p.pos].state = msgPending
	}
	p.pos, p.attempt, p.blocked, p.dups = p.committed, 1, 0, nil
}

func (c *core) trace(violation error) SimTrace {
	if violation != nil {
		c.event(nil, nil, "check", "fails: "+violation.Error())
	} else {
		c.event(nil, nil, "check", "holds")
	}
	return SimTrace{Seed: c.seed, Faults: c.faults, Events: c.events, Violation: violation, Deliveries: c.handled}
}

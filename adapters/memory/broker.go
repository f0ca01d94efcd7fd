package memory

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ackwise/ackwise"
)

// Defaults.
const (
	// DefaultLease is a queue's visibility timeout when QueueConfig.Lease is
	// zero (SQS's default).
	DefaultLease = 30 * time.Second
	// DeadLetterSuffix names a destination's default dead-letter queue:
	// "orders" dead-letters into "orders.dlq".
	DeadLetterSuffix = ".dlq"
)

// Config configures a [Broker]. The zero value is valid and means the
// documented defaults.
type Config struct {
	// Clock is the broker's time source for leases, delays, outages and
	// history times. nil means ackwise.SystemClock; tests pass a
	// [VirtualClock].
	Clock ackwise.Clock
	// Logger receives debug logs of faults and rebalances. nil discards.
	Logger *slog.Logger
	// DisableHistory turns off the event history (Broker.History,
	// Broker.WaitHistory and the memorytest helpers then fail). Benchmarks
	// turn it off: history grows by about three events per message.
	DisableHistory bool
	// Queue is the configuration of queues created implicitly (by Sink,
	// QueueSource, a dead-lettering or a "mem://" URL without parameters).
	// When its DeadLetter names a queue, that queue itself, created
	// implicitly, dead-letters into its name + DeadLetterSuffix, and so on
	// down the chain: never into itself or back up the chain.
	Queue QueueConfig
	// Topic is the configuration of topics created implicitly (by JoinGroup
	// on a topic that does not exist).
	Topic TopicConfig
}

// Broker is an in-process message broker with real semantics: queues with
// leases, receive counts, delays, FIFO groups and broker-side dead-lettering
// (like SQS), and partitioned logs with consumer groups and committed offsets
// (like Kafka). It records a history of what happened to each message and can
// inject faults deterministically.
//
// A Broker is safe for concurrent use. Each queue and topic has its own lock;
// nothing runs in the background except timers that wake blocked receivers
// (at most one pending timer per queue).
type Broker struct {
	clock    ackwise.Clock
	sysClock bool // clock is ackwise.SystemClock: Valid avoids reading it
	log      *slog.Logger
	history  bool
	qdef     QueueConfig
	tdef     TopicConfig

	mu      sync.RWMutex
	dests   map[string]destination
	created chan struct{} // closed and replaced when a destination is created

	seq         atomic.Uint64 // history order
	srcSeq      atomic.Int64  // source IDs
	outageUntil atomic.Int64  // unix nanos; broker-wide outage
}

// New returns a broker. It fails, naming the field and its value, when cfg
// is invalid.
func New(cfg Config) (*Broker, error) {
	if err := cfg.Queue.validate("Config.Queue."); err != nil {
		return nil, err
	}
	if err := cfg.Topic.validate("Config.Topic."); err != nil {
		return nil, err
	}
	b := &Broker{
		clock:   cfg.Clock,
		log:     cfg.Logger,
		history: !cfg.DisableHistory,
		qdef:    cfg.Queue,
		tdef:    cfg.Topic,
		dests:   map[string]destination{},
		created: make(chan struct{}),
	}
	if b.clock == nil {
		b.clock = ackwise.SystemClock
	}
	b.sysClock = b.clock == ackwise.SystemClock
	if b.log == nil {
		b.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return b, nil
}

var (
	defaultMu     sync.Mutex
	defaultBroker *Broker
)

// Default returns the package-level broker that "mem://" URLs open: unless
// SetDefault replaced it, a broker with the zero Config (system clock,
// history on). Tests that share it use unique queue and topic names.
func Default() *Broker {
	defaultMu.Lock()
	defer defaultMu.Unlock()
	if defaultBroker == nil {
		defaultBroker, _ = New(Config{})
	}
	return defaultBroker
}

// SetDefault makes b the broker that Default returns and "mem://" URLs open
// from now on (a program that wants a virtual clock or no history behind its
// URLs). Sources and sinks already opened keep their broker. A nil b goes
// back to a fresh default broker on the next Default call.
func SetDefault(b *Broker) {
	defaultMu.Lock()
	defaultBroker = b
	defaultMu.Unlock()
}

// Clock returns the broker's clock.
func (b *Broker) Clock() ackwise.Clock { return b.clock }

// destination is a queue or a topic.
type destination interface {
	base() *dest
	// store appends one message (already copied) under d.mu and returns it
	// as stored, for the history. wake is called after unlocking.
	storeLocked(m *ackwise.Message, now time.Time)
	wakeLocked()
	kind() string
}

// dest is what queues and topics share: a lock, the history, faults and
// the outage window.
type dest struct {
	b    *Broker
	name string
	mu   sync.Mutex

	history     []Event
	histWaiters []chan struct{}

	faults      []*InjectedFault
	outageUntil atomic.Int64
	deleted     bool
	// voided are the sources whose deliveries stopped being Valid under
	// mu, told when it is released (see unlock).
	voided []*source
	// observers report the faults and crashes of sources opened by URL
	// with options, by source ID (see observe).
	observers map[string]*observer

	arena arena
}

func (d *dest) base() *dest { return d }

// record appends ev to the history. Caller holds d.mu.
func (d *dest) record(ev Event, now time.Time) {
	if len(d.observers) > 0 && ev.Consumer != "" {
		ev.Time, ev.Dest = now, d.name
		d.notify(ev)
	}
	if !d.b.history {
		return
	}
	ev.Seq = d.b.seq.Add(1)
	ev.Time = now
	ev.Dest = d.name
	d.history = append(d.history, ev)
	if len(d.histWaiters) > 0 {
		for _, ch := range d.histWaiters {
			close(ch)
		}
		d.histWaiters = d.histWaiters[:0]
	}
}

// unavailable returns ErrUnavailable (wrapped) during an outage of d or of
// the whole broker.
func (d *dest) unavailable(now time.Time) error {
	n := now.UnixNano()
	if u := d.outageUntil.Load(); u != 0 && n < u {
		return fmt.Errorf("%w: %s until %s", ErrUnavailable, d.name, time.Unix(0, u).UTC().Format(time.RFC3339Nano))
	}
	if u := d.b.outageUntil.Load(); u != 0 && n < u {
		return fmt.Errorf("%w until %s", ErrUnavailable, time.Unix(0, u).UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// lookup returns the destination called name, or nil.
func (b *Broker) lookup(name string) destination {
	b.mu.RLock()
	d := b.dests[name]
	b.mu.RUnlock()
	return d
}

func (b *Broker) get(name string) (destination, error) {
	if d := b.lookup(name); d != nil {
		return d, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrNotFound, name)
}

func validName(name string) error {
	if name == "" {
		return errors.New("memory: name = \"\": a queue or topic needs a name")
	}
	return nil
}

// CreateQueue creates the queue name with cfg. Creating a queue that exists
// with the same configuration is a no-op; with another configuration, or as a
// topic, it fails with ErrConflict.
func (b *Broker) CreateQueue(name string, cfg QueueConfig) error {
	_, err := b.queue(name, &cfg)
	return err
}

// CreateTopic creates the topic name with cfg. Creating a topic that exists
// with the same configuration is a no-op; with another configuration, or as a
// queue, it fails with ErrConflict.
func (b *Broker) CreateTopic(name string, cfg TopicConfig) error {
	_, err := b.topic(name, &cfg)
	return err
}

// queue returns the queue name, creating it with cfg (nil: the broker's
// default) when missing. An existing queue must match a non-nil cfg.
func (b *Broker) queue(name string, cfg *QueueConfig) (*queue, error) {
	want, err := wanted(name, cfg, "QueueConfig", "a queue cannot be its own dead-letter queue", func(c QueueConfig) string { return c.DeadLetter })
	if err != nil {
		return nil, err
	}
	return lookupOrCreate(b, name, "queue", cfg != nil, want,
		func(q *queue) QueueConfig { return q.cfg },
		func() QueueConfig {
			c := b.qdef.withDefaults(name)
			if d := b.qdef.DeadLetter; d != "" && inChainOf(name, d) {
				// The shared dead-letter queue of Config.Queue, and the
				// dead-letter queues below it, dead-letter into their own
				// name + DeadLetterSuffix: never into themselves or back
				// up the chain (a message at MaxReceives would go round).
				c.DeadLetter = deadLetterName(name, "")
			}
			return c
		},
		func(c QueueConfig) *queue { return newQueue(b, name, c) })
}

func (b *Broker) topic(name string, cfg *TopicConfig) (*topic, error) {
	want, err := wanted(name, cfg, "TopicConfig", "a topic cannot be its own dead-letter destination", func(c TopicConfig) string { return c.DeadLetter })
	if err != nil {
		return nil, err
	}
	return lookupOrCreate(b, name, "topic", cfg != nil, want,
		func(t *topic) TopicConfig { return t.cfg },
		func() TopicConfig { return b.tdef.withDefaults(name) },
		func(c TopicConfig) *topic { return newTopic(b, name, c) })
}

// wanted checks name and, when cfg is not nil (a configuration asked for),
// validates it (typ names it in errors) and returns it with its defaults;
// a destination whose dead-letter destination (dlqOf) is itself is
// refused with the reason self. For a nil cfg it returns the zero C.
func wanted[C interface {
	validate(prefix string) error
	withDefaults(name string) C
}](name string, cfg *C, typ, self string, dlqOf func(C) string) (C, error) {
	var want C
	if err := validName(name); err != nil {
		return want, err
	}
	if cfg == nil {
		return want, nil
	}
	if err := (*cfg).validate(typ + "."); err != nil {
		return want, err
	}
	want = (*cfg).withDefaults(name)
	if dlqOf(want) == name {
		return want, fmt.Errorf("memory: %s.DeadLetter = %q: %s", typ, name, self)
	}
	return want, nil
}

// lookupOrCreate returns the destination name, which must be a D (kind
// names it in errors). When it exists and check is set, its configuration
// (cfgOf) must be want. When it does not exist it is created by create,
// with want when check is set and with def() otherwise.
func lookupOrCreate[D destination, C comparable](b *Broker, name, kind string, check bool, want C, cfgOf func(D) C, def func() C, create func(C) D) (D, error) {
	var none D
	b.mu.Lock()
	defer b.mu.Unlock()
	if d, ok := b.dests[name]; ok {
		x, ok := d.(D)
		if !ok {
			return none, fmt.Errorf("%w: %q is a %s, not a %s", ErrConflict, name, d.kind(), kind)
		}
		if check && cfgOf(x) != want {
			return none, fmt.Errorf("%w: %s %q has %+v, asked for %+v", ErrConflict, kind, name, cfgOf(x), want)
		}
		return x, nil
	}
	if !check {
		want = def()
	}
	x := create(want)
	b.dests[name] = x
	b.notifyCreatedLocked()
	return x, nil
}

func (b *Broker) notifyCreatedLocked() {
	close(b.created)
	b.created = make(chan struct{})
}

// Delete removes a queue or topic and everything in it. Its sources are
// closed; its sinks fail with ErrNotFound from then on. Deleting a name that
// does not exist is a no-op.
func (b *Broker) Delete(name string) {
	b.mu.Lock()
	d := b.dests[name]
	delete(b.dests, name)
	b.mu.Unlock()
	if d != nil {
		base := d.base()
		base.mu.Lock()
		base.deleted = true
		d.wakeLocked()
		// WaitHistory callers waiting on this destination look the name up
		// again: a destination created under it later gets the events.
		for _, ch := range base.histWaiters {
			close(ch)
		}
		base.histWaiters = nil
		base.mu.Unlock()
		if c, ok := d.(interface{ closeAll() }); ok {
			c.closeAll()
		}
	}
}

// Names lists the queues and topics, sorted.
func (b *Broker) Names() []string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	out := make([]string, 0, len(b.dests))
	for n := range b.dests {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Outage makes the named queues and topics (all of them when names is empty)
// unavailable for d of clock time from now: every Publish, Receive and settle
// call fails with ErrUnavailable until then, and blocked receivers return it
// at once. A d of zero or less ends the outage. Names that do not exist are
// ignored. The broker's own moves (redrive after MaxReceives) are not
// affected.
func (b *Broker) Outage(d time.Duration, names ...string) {
	var until int64
	if d > 0 {
		until = b.clock.Now().Add(d).UnixNano()
	}
	if len(names) == 0 {
		b.outageUntil.Store(until)
		b.mu.RLock()
		all := make([]destination, 0, len(b.dests))
		for _, x := range b.dests {
			all = append(all, x)
		}
		b.mu.RUnlock()
		for _, x := range all {
			x.base().mu.Lock()
			x.wakeLocked()
			x.base().mu.Unlock()
		}
		return
	}
	for _, n := range names {
		if x := b.lookup(n); x != nil {
			x.base().outageUntil.Store(until)
			x.base().mu.Lock()
			x.wakeLocked()
			x.base().mu.Unlock()
		}
	}
}

// InjectFault puts f in force on the queue or topic name: it applies to
// every source of it, and publish faults to every publish into it. It fails
// for a name that does not exist or an invalid f (naming the field and
// value).
func (b *Broker) InjectFault(name string, f Fault) (*InjectedFault, error) {
	if err := f.validate(false); err != nil {
		return nil, err
	}
	d, err := b.get(name)
	if err != nil {
		return nil, err
	}
	base := d.base()
	return inject(f, false, &base.mu, &base.faults)
}

// History returns a copy of the events recorded on the queue or topic name,
// oldest first. It fails when history is disabled or name does not exist.
func (b *Broker) History(name string) ([]Event, error) {
	if !b.history {
		return nil, errors.New("memory: history is disabled (Config.DisableHistory)")
	}
	d, err := b.get(name)
	if err != nil {
		return nil, err
	}
	base := d.base()
	base.mu.Lock()
	defer base.mu.Unlock()
	return append([]Event(nil), base.history...), nil
}

// WaitHistory blocks until cond, called with the history of the queue or
// topic name, returns true, or ctx is done. cond runs with the destination's
// lock held, after each new event: it must be quick, must not keep the slice
// and must not call the broker. WaitHistory is woken by each new event, it
// does not poll. The destination need not exist yet when WaitHistory is
// called; when it is deleted, WaitHistory goes on with the history of the
// destination created under the name next (cond then sees that new, shorter
// history).
func (b *Broker) WaitHistory(ctx context.Context, name string, cond func(events []Event) bool) error {
	if !b.history {
		return errors.New("memory: history is disabled (Config.DisableHistory)")
	}
	for {
		b.mu.RLock()
		d, created := b.dests[name], b.created
		b.mu.RUnlock()
		if d == nil {
			// Wait for it to be created.
			select {
			case <-created:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		base := d.base()
		base.mu.Lock()
		if base.deleted {
			// Deleted since the lookup: look the name up again.
			base.mu.Unlock()
			continue
		}
		if cond(base.history) {
			base.mu.Unlock()
			return nil
		}
		ch := make(chan struct{})
		base.histWaiters = append(base.histWaiters, ch)
		base.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Messages returns copies of the messages the queue or topic name holds, in
// the order the broker holds them: on a queue every message not yet deleted
// (visible, delayed or in flight) in publish order; on a topic every retained
// record, partition by partition in offset order. The copies share payloads
// with the broker, which must not be changed.
func (b *Broker) Messages(name string) ([]*ackwise.Message, error) {
	d, err := b.get(name)
	if err != nil {
		return nil, err
	}
	switch x := d.(type) {
	case *queue:
		return x.messages(), nil
	case *topic:
		return x.messages(), nil
	}
	return nil, nil
}

// Stats are counts of one queue or topic.
type Stats struct {
	// Published counts messages stored, dead letters included.
	Published int64
	// Queue counts: Ready is neither in flight nor delayed (on a FIFO queue
	// it includes messages waiting behind their key), Delayed waits for a
	// Nack's delay, InFlight is leased to a consumer.
	Ready, Delayed, InFlight int
	// Acked counts settled messages (deleted from a queue; marked settled on
	// a log), DeadLettered those moved to the dead-letter destination.
	Acked, DeadLettered int64
	// EndOffsets are a topic's next offset per partition.
	EndOffsets []int64
}

// Stats returns the counts of the queue or topic name. On a queue it first
// applies leases and delays that ran out.
func (b *Broker) Stats(name string) (Stats, error) {
	d, err := b.get(name)
	if err != nil {
		return Stats{}, err
	}
	switch x := d.(type) {
	case *queue:
		return x.stats(), nil
	case *topic:
		return x.stats(), nil
	}
	return Stats{}, nil
}

// Sink returns a sink publishing into the queue or topic name, creating a
// queue with the broker's default configuration when name does not exist.
func (b *Broker) Sink(name string) (*Sink, error) {
	if d := b.lookup(name); d != nil {
		return &Sink{b: b, d: d}, nil
	}
	q, err := b.queue(name, nil)
	if err != nil {
		return nil, err
	}
	return &Sink{b: b, d: q}, nil
}

// Publish stores msgs into the queue or topic name, as Sink(name).Publish
// would. It is a convenience for tests.
func (b *Broker) Publish(ctx context.Context, name string, msgs ...*ackwise.Message) error {
	s, err := b.Sink(name)
	if err != nil {
		return err
	}
	return s.Publish(ctx, msgs...)
}

// publishInto stores msgs into d, applying outage and publish faults. It is
// the one write path of sinks and dead-lettering. On error, at is the index
// of the message it failed (an injected publish fault; the messages before
// it are stored, and it too with AfterStore), or -1 when it failed before
// storing any (ctx done, an outage, a deleted destination).
func (b *Broker) publishInto(ctx context.Context, d destination, msgs []*ackwise.Message) (at int, err error) {
	if err := ctx.Err(); err != nil {
		return -1, err
	}
	base := d.base()
	now := b.clock.Now()
	if err := base.unavailable(now); err != nil {
		return -1, err
	}
	base.mu.Lock()
	if base.deleted {
		base.mu.Unlock()
		return -1, fmt.Errorf("%w: %q was deleted", ErrNotFound, base.name)
	}
	for i, m := range msgs {
		if len(base.faults) > 0 {
			if x := fire(m, [2][]*InjectedFault{base.faults}, FaultFailPublish, FaultHangPublish); x != nil {
				if x.f.AfterStore {
					d.storeLocked(m, now)
				}
				base.record(Event{Kind: EventFault, Fault: x.f.Kind, ID: m.EventID(), Key: m.Key, Partition: -1, Offset: -1}, now)
				d.wakeLocked()
				base.mu.Unlock()
				if x.f.Kind == FaultHangPublish {
					<-ctx.Done()
					return i, fmt.Errorf("memory: publish to %q hung (injected): %w", base.name, ctx.Err())
				}
				return i, fmt.Errorf("memory: publish to %q: %w", base.name, x.err())
			}
		}
		d.storeLocked(m, now)
	}
	d.wakeLocked()
	base.mu.Unlock()
	return -1, nil
}

// stored returns the copy of m that d stores, at partition and offset
// (-1 where d has none) under brokerID: its event ID, key, payload and
// headers (the event ID header set to the ID), the payload copied into d's
// arena. Caller holds d.mu.
func (d *dest) stored(m *ackwise.Message, partition int32, offset int64, brokerID string, now time.Time) ackwise.Message {
	id := m.EventID()
	return ackwise.Message{
		ID:          id,
		Key:         m.Key,
		Payload:     d.arena.copyBytes(m.Payload),
		Headers:     copyHeaders(m.Headers, id),
		Source:      d.name,
		Partition:   partition,
		Offset:      offset,
		BrokerID:    brokerID,
		PublishedAt: now,
	}
}

// copyHeaders returns a copy of h with the event ID header set to id when id
// is not empty. It returns nil for no headers and no ID.
func copyHeaders(h ackwise.Headers, id string) ackwise.Headers {
	if len(h) == 0 && id == "" {
		return nil
	}
	n := len(h)
	if id != "" {
		n++
	}
	c := make(ackwise.Headers, len(h), n)
	copy(c, h)
	if id != "" {
		c.Set(ackwise.HeaderEventID, id)
	}
	// Deliveries share these headers: an Add by one receiver must not
	// write into spare capacity the others see.
	return c[:len(c):len(c)]
}

func (b *Broker) newSourceID(prefix string) string {
	return prefix + "#" + fmt.Sprint(b.srcSeq.Add(1))
}

// inChainOf reports whether name is dlq or a dead-letter queue down its
// chain: dlq + DeadLetterSuffix, repeated.
func inChainOf(name, dlq string) bool {
	for {
		if name == dlq {
			return true
		}
		n, ok := strings.CutSuffix(name, DeadLetterSuffix)
		if !ok {
			return false
		}
		name = n
	}
}

func deadLetterName(name, dlq string) string {
	if dlq != "" {
		return dlq
	}
	return name + DeadLetterSuffix
}

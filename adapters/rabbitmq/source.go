package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// Source consumes one RabbitMQ queue with manual acknowledgements. It
// implements [adapters.Source]; see the package doc for its topology, how it
// counts attempts and how it recovers.
//
// Receive must be called from one goroutine at a time; the settle methods
// and Valid may be called concurrently from many.
type Source struct {
	v    validated
	log  *slog.Logger
	pub  *publisher // moves to wait queues and the dead-letter queue
	caps adapters.Capabilities

	mu      sync.Mutex
	cur     *session
	changed chan struct{} // closed and replaced when cur changes
	gen     uint64

	// Moves (Nack, DeadLetter) in flight, which Close lets finish before it
	// closes their channel; closing refuses new ones.
	moving    int
	closing   bool
	movesIdle chan struct{} // closed when moving drops to 0, if Close waits

	closed    chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
	ctx       context.Context
	cancel    context.CancelFunc

	timeoutWarnings metric.Int64Counter
	tracer          trace.Tracer // spans of moves (Config.TracerProvider)

	// invalid tells the engine when deliveries stop being Valid: a
	// channel died, deliveries in flight were held past
	// ConsumerTimeoutWarn (adapters.Invalidator).
	invalid adapters.InvalidHook
}

var (
	_ adapters.Source      = (*Source)(nil)
	_ adapters.Invalidator = (*Source)(nil)
	_ dlq.Backlogger       = (*Source)(nil)
)

// NewSource connects to the broker, declares (Config.DeclareTopology) or
// verifies the topology, and starts consuming cfg.Queue. It fails, naming
// the field and value, on bad configuration; it fails when the broker cannot
// be reached or the topology is missing or declared with other arguments.
// After that, lost connections are re-established in the background until
// Close.
func NewSource(ctx context.Context, cfg Config) (*Source, error) {
	v, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	s := &Source{
		v:       v,
		log:     v.Logger,
		tracer:  tracerOf(v.TracerProvider),
		changed: make(chan struct{}),
		closed:  make(chan struct{}),
		caps:    adapters.Capabilities{DeliveryCount: v.QueueType == Quorum},
	}
	if n := len(v.DelayTiers); n > 0 {
		s.caps.Delay = true
		s.caps.DelayTiers = slices.Clone(v.DelayTiers)
		s.caps.MaxDelay = v.DelayTiers[n-1]
	}
	mp := v.MeterProvider
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	s.timeoutWarnings, err = mp.Meter(InstrumentationName).Int64Counter(
		"ackwise.rabbitmq.consumer_timeout.warnings",
		metric.WithDescription("Deliveries held for longer than ConsumerTimeoutWarn, approaching the broker's consumer_timeout."),
	)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: create metric: %w", err)
	}
	s.ctx, s.cancel = contextFor(s.closed)
	first, err := s.open(ctx)
	if err != nil {
		s.cancel()
		return nil, err
	}
	pubConn := v.conn
	pubConn.name += "-moves"
	s.pub, err = newPublisher(ctx, pubConn, "source "+v.Queue)
	if err != nil {
		first.conn.Close()
		s.cancel()
		return nil, err
	}
	s.set(first)
	s.wg.Add(1)
	go s.run(first)
	if v.ConsumerTimeout > 0 {
		s.wg.Add(1)
		go s.watchTimeouts()
	}
	return s, nil
}

// session is one consuming channel: a generation. Receipts of a session are
// void once it died; they are never used on another channel.
type session struct {
	src        *Source
	gen        uint64
	conn       *amqp.Connection
	ch         *amqp.Channel
	deliveries <-chan arrival // from stamp, in delivery order
	dead       chan struct{}
	isDead     atomic.Bool
	err        error // why it died; written before dead is closed
	killOnce   sync.Once
	// ready is the queue's message count when this channel began to
	// consume (see Backlog); received is set once Receive returned one of
	// its deliveries.
	ready    int
	received atomic.Bool

	// mu guards the in-flight receipts, oldest (lowest tag) first, the
	// deliveries that arrived and wait for Receive, and the acks recorded
	// but not yet written (see acks.go).
	mu          sync.Mutex
	head, tail  *receipt
	waiting     []waiting // arrived, not yet received, in delivery order
	acks, spare []uint64
	ackSignal   chan struct{}
	flushMu     sync.Mutex // serializes flushes
}

// receipt is Message.Handle: the delivery (its tag, headers and properties)
// and the session (channel generation) that delivered it.
type receipt struct {
	s  *session
	d  amqp.Delivery
	at time.Time // when the delivery reached this client
	// returned is set when the delivery came back from one of the
	// source's wait queues (see returned): only then do its copies carry
	// its x-death history on.
	returned bool
	// done is set by the settle that acks or hands back the delivery: a
	// second one fails without touching the channel (a second ack or nack
	// of a delivery tag makes the broker close the channel, and every
	// other delivery on it is redelivered).
	done atomic.Bool

	// guarded by s.mu
	prev, next *receipt
	listed     bool
	warned     bool
}

func (s *Source) open(ctx context.Context) (*session, error) {
	ac, err := s.v.conn.dial(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.v.setupTopology(ac, s.v.DeclareTopology); err != nil {
		ac.Close()
		return nil, err
	}
	ch, err := ac.Channel()
	if err != nil {
		ac.Close()
		return nil, fmt.Errorf("rabbitmq: open channel on %s: %w", s.v.conn.redacted, err)
	}
	if err := ch.Qos(s.v.Prefetch, 0, false); err != nil {
		ac.Close()
		return nil, fmt.Errorf("rabbitmq: basic.qos prefetch %d: %w", s.v.Prefetch, err)
	}
	// What the queue holds before this channel takes anything (Backlog).
	q, err := ch.QueueDeclarePassive(s.v.Queue, true, false, false, false, nil)
	if err != nil {
		ac.Close()
		return nil, fmt.Errorf("rabbitmq: check queue %q: %w", s.v.Queue, err)
	}
	deliveries, err := ch.Consume(s.v.Queue, "", false, false, false, false, nil)
	if err != nil {
		ac.Close()
		return nil, fmt.Errorf("rabbitmq: consume %q: %w", s.v.Queue, err)
	}
	s.mu.Lock()
	s.gen++
	gen := s.gen
	s.mu.Unlock()
	stamped := make(chan arrival, 16)
	ss := &session{src: s, gen: gen, conn: ac, ch: ch, deliveries: stamped, dead: make(chan struct{}), ackSignal: make(chan struct{}, 1), ready: q.Messages}
	go ss.stamp(deliveries, stamped)
	go ss.flusher()
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		e, ok := <-closes
		var err error = amqp.ErrClosed
		if ok && e != nil {
			err = e
		}
		ss.kill(err)
	}()
	return ss, nil
}

// arrival is a delivery and when it reached this client.
type arrival struct {
	d  amqp.Delivery
	at time.Time
}

// waiting is a delivery that reached this client and waits in the prefetch
// buffer for Receive. The broker's consumer_timeout runs for it already, so
// the timeout warning watches it too.
type waiting struct {
	tag    uint64
	id     string
	at     time.Time
	warned bool
}

// stamp passes deliveries on in order, each with the time it arrived: the
// broker's consumer_timeout runs from then, also while a delivery waits in
// the prefetch buffer for Receive, so the timeout warning counts from then.
// The queue it keeps is bounded by the prefetch count (the broker delivers
// no more unacknowledged). out is closed once in is closed and everything
// was passed on, or when the session dies.
func (ss *session) stamp(in <-chan amqp.Delivery, out chan<- arrival) {
	defer close(out)
	var q []arrival
	for in != nil || len(q) > 0 {
		var send chan<- arrival
		var next arrival
		if len(q) > 0 {
			send, next = out, q[0]
		}
		select {
		case d, ok := <-in:
			if !ok {
				in = nil
				continue
			}
			a := arrival{d: d, at: time.Now()}
			ss.mu.Lock()
			if ss.src.v.ConsumerTimeout > 0 && !ss.isDead.Load() {
				ss.waiting = append(ss.waiting, waiting{tag: d.DeliveryTag, id: d.MessageId, at: a.at})
			}
			ss.mu.Unlock()
			q = append(q, a)
		case send <- next:
			q[0] = arrival{}
			q = q[1:]
		case <-ss.dead:
			return
		}
	}
}

// kill marks the session dead and closes its connection; the broker
// requeues its unacknowledged deliveries.
func (ss *session) kill(err error) {
	ss.killOnce.Do(func() {
		ss.err = err
		ss.isDead.Store(true)
		ss.mu.Lock()
		ss.head, ss.tail = nil, nil
		ss.waiting = nil
		ss.mu.Unlock()
		close(ss.dead)
		go ss.conn.Close()
		// Its deliveries waiting in the engine (a failed move, a retry in
		// place) are handed back now, before the broker redelivers them
		// to the next channel behind them.
		ss.src.invalid.Invalidated()
	})
}

func (s *Source) set(ss *session) {
	s.mu.Lock()
	s.cur = ss
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// run replaces the session whenever it dies, until Close.
func (s *Source) run(ss *session) {
	defer s.wg.Done()
	rd := s.v.conn.redial()
	rd.connected()
	for {
		select {
		case <-ss.dead:
		case <-s.closed:
			ss.kill(adapters.ErrClosed)
			return
		}
		wait := rd.wait()
		s.log.Warn("rabbitmq: consumer channel lost; reconnecting", ackwise.LogKeyQueue, s.v.Queue, "generation", ss.gen, ackwise.LogKeyError, errText(ss.err), "hint", deathHint(ss.err), ackwise.LogKeyRetryIn, wait)
		s.set(nil)
		for {
			if !sleep(wait, s.closed) {
				return
			}
			ns, err := s.open(s.ctx)
			if err != nil {
				wait = rd.wait()
				s.log.Warn("rabbitmq: consumer reconnect failed", ackwise.LogKeyQueue, s.v.Queue, ackwise.LogKeyError, err.Error(), ackwise.LogKeyRetryIn, wait)
				continue
			}
			rd.connected()
			ss = ns
			s.set(ns)
			s.log.Info("rabbitmq: consumer reconnected", ackwise.LogKeyQueue, s.v.Queue, "generation", ns.gen)
			break
		}
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// deathHint explains a channel closed by the broker's consumer timeout
// (406 "delivery acknowledgement on channel N timed out"), and a connection
// amqp091-go closed because it could not read what the broker sent (a 501
// of its own making).
func deathHint(err error) string {
	var ae *amqp.Error
	switch {
	case !errors.As(err, &ae):
	case ae.Code == amqp.PreconditionFailed && strings.Contains(ae.Reason, "timed out"):
		return "a delivery was held longer than the broker's consumer_timeout; its handler was too slow (see ConsumerTimeout)"
	case ae.Code == amqp.FrameError && !ae.Server:
		return "the client could not read a frame the broker sent, probably a delivery whose content amqp091-go cannot parse; the broker delivers it again on every connection, so reconnecting slows down (see docs/rabbitmq.md, Unreadable deliveries)"
	}
	return ""
}

// current returns the live session, waiting while the source reconnects.
func (s *Source) current(ctx context.Context) (*session, error) {
	for {
		s.mu.Lock()
		ss, changed := s.cur, s.changed
		s.mu.Unlock()
		select {
		case <-s.closed:
			return nil, adapters.ErrClosed
		default:
		}
		if ss != nil && !ss.isDead.Load() {
			return ss, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.closed:
			return nil, adapters.ErrClosed
		}
	}
}

// Receive fills buf with deliveries: it blocks for the first one, then takes
// what is already there without waiting, up to len(buf). Across a
// reconnection it waits for the new channel. It returns ErrClosed after
// Close and ctx's error when ctx is done.
func (s *Source) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	if len(buf) == 0 {
		return 0, nil
	}
	for {
		ss, err := s.current(ctx)
		if err != nil {
			return 0, err
		}
		select {
		case a, ok := <-ss.deliveries:
			if !ok {
				// The channel closed, or the broker cancelled the consumer
				// (queue deleted): start over on a new channel. A channel
				// the broker closed says why through NotifyClose, which
				// may come a moment after its deliveries end: let it name
				// the cause (consumer_timeout's 406, say) rather than this
				// generic one.
				if ss.ch.IsClosed() {
					select {
					case <-ss.dead:
					case <-ctx.Done():
					case <-time.After(time.Second):
					}
				}
				ss.kill(errors.New("rabbitmq: consumer cancelled by the broker or channel closed"))
				continue
			}
			buf[0] = s.message(ss, a.d, a.at)
			n := 1
		fill:
			for n < len(buf) {
				select {
				case a, ok := <-ss.deliveries:
					if !ok {
						break fill
					}
					buf[n] = s.message(ss, a.d, a.at)
					n++
				default:
					break fill
				}
			}
			ss.received.Store(true)
			ss.track(buf[:n])
			return n, nil
		case <-ss.dead:
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-s.closed:
			return 0, adapters.ErrClosed
		}
	}
}

func (s *Source) message(ss *session, d amqp.Delivery, arrived time.Time) *ackwise.Message {
	attempt, isReturn := attemptOf(d.Headers, d.Redelivered, s.v.QueueType == Quorum, s.v.waitQueues)
	r := &receipt{s: ss, d: d, at: arrived, returned: isReturn}
	h := fromTable(d.Headers)
	m := &ackwise.Message{
		ID:          eventIDOf(h, d.MessageId),
		Key:         h.Get(HeaderKey),
		Payload:     d.Body,
		Headers:     h,
		Source:      s.v.Queue,
		Partition:   -1,
		Offset:      -1,
		BrokerID:    d.MessageId,
		Attempt:     attempt,
		PublishedAt: d.Timestamp,
		Handle:      r,
	}
	// A producer's ackwise-first-failure is no failure of ours.
	if v, ok := h.Lookup(ackwise.HeaderFirstFailure); ok && isReturn {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			m.FirstFailure = t
		}
	}
	return m
}

// track lists receipts as in flight, in delivery order, and takes them
// off the waiting list (keeping whether they were warned about there).
func (ss *session) track(msgs []*ackwise.Message) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.isDead.Load() {
		return
	}
	for _, m := range msgs {
		r := m.Handle.(*receipt)
		for len(ss.waiting) > 0 && ss.waiting[0].tag <= r.d.DeliveryTag {
			if ss.waiting[0].tag == r.d.DeliveryTag {
				r.warned = ss.waiting[0].warned
			}
			ss.waiting[0] = waiting{}
			ss.waiting = ss.waiting[1:]
		}
		r.prev, r.listed = ss.tail, true
		if ss.tail != nil {
			ss.tail.next = r
		} else {
			ss.head = r
		}
		ss.tail = r
	}
}

// untrack removes r from the in-flight list.
func (ss *session) untrack(r *receipt) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.unlinkLocked(r)
}

// unlinkLocked removes r from the in-flight list; ss.mu is held.
func (ss *session) unlinkLocked(r *receipt) {
	if !r.listed {
		return
	}
	r.listed = false
	if r.prev != nil {
		r.prev.next = r.next
	} else if ss.head == r {
		ss.head = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	} else if ss.tail == r {
		ss.tail = r.prev
	}
	r.prev, r.next = nil, nil
}

// receipt returns msg's receipt, or an error wrapping ErrReceiptInvalid when
// msg is not from this source or its channel died.
func (s *Source) receipt(op string, msg *ackwise.Message) (*receipt, error) {
	r, ok := msg.Handle.(*receipt)
	if !ok || r == nil || r.s == nil || r.s.src != s {
		return nil, fmt.Errorf("rabbitmq: %s: message handle %T is not a receipt of this source: %w", op, msg.Handle, adapters.ErrReceiptInvalid)
	}
	if r.s.isDead.Load() {
		r.s.untrack(r)
		return nil, r.invalid(op)
	}
	return r, nil
}

// settleOnce marks r settled, or fails when a settle already did (or its
// channel died meanwhile).
func (r *receipt) settleOnce(op string) error {
	if r.done.CompareAndSwap(false, true) {
		return nil
	}
	if r.s.isDead.Load() {
		return r.invalid(op)
	}
	return fmt.Errorf("rabbitmq: %s delivery %d: already settled or released", op, r.d.DeliveryTag)
}

func (r *receipt) invalid(op string) error {
	return fmt.Errorf("rabbitmq: %s delivery %d of channel generation %d: channel closed, the broker redelivers it: %w", op, r.d.DeliveryTag, r.s.gen, adapters.ErrReceiptInvalid)
}

// settled maps the error of an ack/nack/reject on r's channel.
func (r *receipt) settled(op string, err error) error {
	if err == nil {
		r.s.untrack(r)
		return nil
	}
	if errors.Is(err, amqp.ErrClosed) || r.s.ch.IsClosed() {
		r.s.untrack(r)
		return r.invalid(op)
	}
	return fmt.Errorf("rabbitmq: %s delivery %d: %w", op, r.d.DeliveryTag, err)
}

// Ack acknowledges msg (basic.ack) on the channel that delivered it. The
// ack is handed to the channel's writer and Ack returns without waiting
// for the write (basic.ack has no reply in AMQP either); acks of
// contiguous deliveries are coalesced into one basic.ack with
// multiple=true, and Close writes what is left. A delivery from a channel
// that has since died is not acked (its tag means nothing on another
// channel): Ack returns an error wrapping adapters.ErrReceiptInvalid and the
// broker redelivers the message, as it does when the channel dies before
// the ack was written.
func (s *Source) Ack(ctx context.Context, msg *ackwise.Message) error {
	r, err := s.receipt("ack", msg)
	if err != nil {
		return err
	}
	if err := r.settleOnce("ack"); err != nil {
		return err
	}
	return r.s.ack(r, "ack")
}

// Nack moves a copy of msg to the wait queue of the smallest tier at least
// delay long (the largest tier for longer delays), waits for the broker's
// confirm, then acks the original (invariant 3). The copy has the payload
// and headers of msg, ackwise-attempt = msg.Attempt+1 and
// ackwise-first-failure = msg.FirstFailure (now if unknown), and the
// delivery's x-death history only when it is a return from a wait queue
// (see the package doc: a producer's never reaches the broker's
// dead-letter worker); when its tier's TTL
// expires the broker dead-letters it back to the work queue. If the channel
// of msg dies after the copy was confirmed, the original is redelivered
// too: a duplicate the inbox absorbs. A copy whose headers would not fit in
// one frame loses its largest ones, named in HeaderTrimmed.
func (s *Source) Nack(ctx context.Context, msg *ackwise.Message, delay time.Duration) error {
	if s.v.Plain {
		return fmt.Errorf("rabbitmq: nack of %s: %w", s.v.Queue, ErrPlain)
	}
	if len(s.v.waitQueues) == 0 {
		return fmt.Errorf("rabbitmq: nack of %s: %w", s.v.Queue, ErrNoTiers)
	}
	r, err := s.receipt("nack", msg)
	if err != nil {
		return err
	}
	if r.done.Load() {
		return r.settleOnce("nack")
	}
	tier := s.tierFor(delay)
	queue := s.v.waitQueues[tier]
	h := hopHeaders(msg, max(msg.Attempt, 1)+1)
	out := outgoing{key: queue, pub: s.copyOf(r, msg, moveTable(r.d.Headers, h, "", r.returned)), trim: keepOnHop}
	return s.move(ctx, "nack", SpanNack, msg, r, out, func(err error) error {
		return fmt.Errorf("rabbitmq: nack: move to wait queue %q: %w", queue, err)
	})
}

// move publishes out, r's copy, to its queue, and once the broker confirmed
// it acks r: the move of Nack and DeadLetter, in a span named span.
// wrap makes the error of a failed publish.
func (s *Source) move(ctx context.Context, op, span string, msg *ackwise.Message, r *receipt, out outgoing, wrap func(error) error) (err error) {
	if err := s.beginMove(op); err != nil {
		return err
	}
	defer s.endMove()
	ctx, sp := startSpan(ctx, s.tracer, span, out.key, attribute.String("messaging.message.id", msg.ID))
	defer func() { endSpan(sp, err) }()
	if err := s.pub.publish(ctx, []outgoing{out}, s.stillValid(r, op), r.s.dead)[0]; err != nil {
		return wrap(err)
	}
	if err := r.settleOnce(op); err != nil {
		return err
	}
	return r.s.ack(r, op)
}

// hopHeaders returns msg's headers with the hop headers the engine owns
// set to its own values: ackwise-attempt = attempt, ackwise-first-failure
// = msg.FirstFailure (now, if unknown). Whatever a producer put in them
// is not carried on.
func hopHeaders(msg *ackwise.Message, attempt int) ackwise.Headers {
	h := msg.Headers.Clone()
	h.Set(ackwise.HeaderAttempt, strconv.Itoa(attempt))
	first := msg.FirstFailure
	if first.IsZero() {
		first = time.Now()
	}
	h.Set(ackwise.HeaderFirstFailure, first.UTC().Format(time.RFC3339Nano))
	return h
}

// keepOnHop and keepOnDeadLetter name the headers a moved copy too large
// for a frame keeps while others are left to remove (trimToFit): the event
// ID, and what the move itself sets.
func keepOnHop(k string) bool {
	return k == ackwise.HeaderEventID || k == ackwise.HeaderAttempt || k == ackwise.HeaderFirstFailure
}

func keepOnDeadLetter(k string) bool {
	return k == ackwise.HeaderEventID || strings.HasPrefix(k, dlq.HeaderPrefix)
}

// beginMove counts a move in flight until endMove; once Close began it
// fails with ErrClosed (the broker redelivers the message).
func (s *Source) beginMove(op string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return fmt.Errorf("rabbitmq: %s: %w", op, adapters.ErrClosed)
	}
	s.moving++
	return nil
}

func (s *Source) endMove() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.moving--
	if s.moving == 0 && s.movesIdle != nil {
		close(s.movesIdle)
		s.movesIdle = nil
	}
}

// waitMoves refuses new moves and waits, at most d, for those in flight: a
// move whose copy is confirmed then acks its original on the channel that
// is still open. Moves still waiting for a publishing channel fail.
func (s *Source) waitMoves(d time.Duration) {
	s.mu.Lock()
	s.closing = true
	var idle chan struct{}
	if s.moving > 0 {
		idle = make(chan struct{})
		s.movesIdle = idle
	}
	s.mu.Unlock()
	s.pub.refuseNew()
	if idle == nil {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	}
}

// tierFor returns the index of the smallest tier at least d long, or the
// largest.
func (s *Source) tierFor(d time.Duration) int {
	i, _ := slices.BinarySearch(s.v.DelayTiers, d)
	return min(i, len(s.v.DelayTiers)-1)
}

// stillValid stops a move whose delivery became void while the publish
// waited for a channel: moving it then would only make a duplicate.
func (s *Source) stillValid(r *receipt, op string) func() error {
	return func() error {
		if r.s.isDead.Load() {
			r.s.untrack(r)
			return r.invalid(op)
		}
		return nil
	}
}

// copyOf builds the publishing of a moved message: body byte for byte, the
// given headers, the delivery's properties except those that would change
// its fate (expiration would make a wait queue's head block; user-id would
// be refused from another user), persistent.
func (s *Source) copyOf(r *receipt, msg *ackwise.Message, headers amqp.Table) amqp.Publishing {
	d := &r.d
	id := d.MessageId
	if id == "" {
		// Not an ID the next hop reads as the event ID: the copy has the
		// event ID its delivery had (in ackwise-event-id), or none, as the
		// handler saw it.
		id = s.pub.anonID()
	}
	return amqp.Publishing{
		Headers:         headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       id,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            msg.Payload,
	}
}

// DeadLetter publishes msg to the dead-letter queue with env's headers added
// to its own (the delivery's other headers kept as Nack keeps them, x-death
// on a return only, ackwise-attempt = msg.Attempt, envelope headers of an
// earlier dead-lettering replaced), payload byte for byte,
// waits for the broker's confirm, then acks the original (invariants 3 and
// 4). A dead letter whose headers would not fit in one frame loses its
// largest ones (the envelope and the event ID last), named in
// HeaderTrimmed.
func (s *Source) DeadLetter(ctx context.Context, msg *ackwise.Message, env dlq.Envelope) error {
	if s.v.Plain {
		return fmt.Errorf("rabbitmq: dead-letter from %s: %w", s.v.Queue, ErrPlain)
	}
	r, err := s.receipt("dead-letter", msg)
	if err != nil {
		return err
	}
	if r.done.Load() {
		return r.settleOnce("dead-letter")
	}
	h := hopHeaders(msg, max(msg.Attempt, 1))
	out := outgoing{key: s.v.DeadLetterQueue, pub: s.copyOf(r, msg, deadLetterTable(r.d.Headers, h, env, r.returned)), trim: keepOnDeadLetter}
	return s.move(ctx, "dead-letter", SpanDeadLetter, msg, r, out, func(err error) error {
		return fmt.Errorf("rabbitmq: dead-letter to %q: %w", s.v.DeadLetterQueue, err)
	})
}

// Release hands msg back with basic.nack requeue=true; the broker delivers
// it again at once (to this or another consumer). On a quorum queue this
// counts as a delivery in x-delivery-count; on a classic queue the
// redelivered flag is set.
func (s *Source) Release(ctx context.Context, msg *ackwise.Message) error {
	r, err := s.receipt("release", msg)
	if err != nil {
		return err
	}
	if err := r.settleOnce("release"); err != nil {
		return err
	}
	return r.settled("release", r.s.ch.Nack(r.d.DeliveryTag, false, true))
}

// ExtendLease does nothing and returns nil: RabbitMQ deliveries have no
// lease to extend, only the broker's consumer_timeout (see ConsumerTimeout).
func (s *Source) ExtendLease(ctx context.Context, msg *ackwise.Message, d time.Duration) error {
	return nil
}

// OnInvalid sets f, called when a consuming channel dies and its
// deliveries stop being Valid, and when deliveries in flight are held past
// ConsumerTimeoutWarn (adapters.Invalidator).
func (s *Source) OnInvalid(f func()) { s.invalid.OnInvalid(f) }

// Valid reports whether msg is still this consumer's to handle: the
// channel that delivered it is alive, no settle took it yet, and it has not
// been held past ConsumerTimeoutWarn (see there). It is cheap (two atomic
// loads and a clock reading).
func (s *Source) Valid(msg *ackwise.Message) bool {
	r, ok := msg.Handle.(*receipt)
	if !ok || r == nil || r.s == nil || r.s.src != s || r.s.isDead.Load() || r.done.Load() {
		return false
	}
	// Held past ConsumerTimeoutWarn, a delivery is close to the broker's
	// consumer_timeout, which would take back every delivery of its
	// channel: the engine hands it back (a new delivery comes) rather than
	// start its handler or go on trying its move. Not on a plain source:
	// the dlq tools hold its deliveries while they scan, and read an
	// invalid one as redelivered.
	return s.v.Plain || s.v.ConsumerTimeout <= 0 || time.Since(r.at) < s.v.ConsumerTimeoutWarn
}

// Backlog returns how many messages the queue held when this source's
// channel began to consume it (dlq.Backlogger: dlq.Redrive receives no
// more new messages than that, so the dead letters that a consumer which
// still fails sends back while the run reads the queue wait for the next
// run). The count is RabbitMQ's message count from a passive queue.declare
// on that channel just before basic.consume: ready messages only, not
// those delivered to another consumer and not yet acknowledged (the run
// may then end a little early). It is taken then rather than now because
// from basic.consume on the broker pushes up to Prefetch deliveries ahead
// of Receive, which a count taken now would miss (queue.declare-ok does
// not count unacknowledged messages), and deliveries on their way to the
// client cannot be counted at all. So Backlog answers only until Receive
// returns a delivery of that channel (after a reconnection, of the new
// channel: its count is taken afresh); after that it returns an error,
// and dlq.Redrive runs bounded by event IDs and redrive counts alone.
// Open a source per run, as the ackwise CLI does. A queue that no longer
// exists is an error (a passive declare of its own checks). On a
// priority queue a message published after the count may be delivered
// before one counted, which is then left for the next run.
func (s *Source) Backlog(ctx context.Context) (int, error) {
	ss, err := s.current(ctx)
	if err != nil {
		return 0, err
	}
	err = withChannel(ss.conn, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(s.v.Queue, true, false, false, false, nil)
		return err
	})
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return 0, fmt.Errorf("rabbitmq: backlog of %q: the queue does not exist: %w", s.v.Queue, err)
		}
		return 0, fmt.Errorf("rabbitmq: backlog of %q: %w", s.v.Queue, err)
	}
	if ss.received.Load() {
		return 0, fmt.Errorf("rabbitmq: backlog of %q: unknown once this source has received: the count taken when it began to consume is stale, and the deliveries the broker pushes ahead of Receive cannot be counted (open a new source)", s.v.Queue)
	}
	return ss.ready, nil
}

// Capabilities reports Delay with DelayTiers (one wait queue each) and
// MaxDelay the largest tier when Config.DelayTiers is set (else no Delay:
// the engine retries in place), DeliveryCount on quorum queues only, and no lease
// (Lease 0, ExtendLease false: see Config.ConsumerTimeout).
func (s *Source) Capabilities() adapters.Capabilities {
	c := s.caps
	c.DelayTiers = slices.Clone(c.DelayTiers)
	return c
}

// Extensions declares Invalidator: a dead channel, and a delivery held past
// ConsumerTimeoutWarn, are told of.
func (s *Source) Extensions() adapters.Extensions {
	return adapters.Extensions{Invalidator: s}
}

// Close lets the moves in flight (Nack, DeadLetter) finish, waiting at most
// 10s in all for their publisher confirms, writes the acks not yet written,
// stops consuming and closes the connections. Unacknowledged deliveries are
// requeued by the broker; a move that did not finish in time may leave its
// copy beside the requeued original (a duplicate). Moves begun after Close
// fail with ErrClosed. It is safe to call more than once.
func (s *Source) Close() error {
	s.closeOnce.Do(func() {
		// Moves first: killing the channel while a copy awaits its
		// confirm would leave the original unacked, so the broker would
		// requeue it beside its copy.
		deadline := time.Now().Add(closeDrainTimeout)
		s.waitMoves(closeDrainTimeout)
		s.mu.Lock()
		cur := s.cur
		s.mu.Unlock()
		if cur != nil && !cur.isDead.Load() {
			cur.flush() // acks recorded but not yet written
		}
		close(s.closed)
		s.cancel()
		s.wg.Wait()
		s.mu.Lock()
		ss := s.cur
		s.mu.Unlock()
		if ss != nil {
			ss.kill(adapters.ErrClosed)
			ss.conn.Close()
		}
		s.pub.closeWithin(time.Until(deadline))
	})
	return nil
}

// QueueDepth returns the number of ready messages cfg.Queue holds, by a
// passive queue.declare on a connection of its own that it closes before
// returning: unlike a Source, it consumes nothing, so it may be called on a
// queue live consumers read (the ackwise CLI's lag command samples it).
// RabbitMQ counts ready messages only, not those delivered and not yet
// acknowledged. A queue that does not exist is an error, never 0.
func QueueDepth(ctx context.Context, cfg Config) (int, error) {
	v, err := cfg.validate()
	if err != nil {
		return 0, err
	}
	ac, err := v.conn.dial(ctx)
	if err != nil {
		return 0, err
	}
	defer ac.Close()
	var n int
	err = withChannel(ac, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(v.Queue, true, false, false, false, nil)
		n = q.Messages
		return err
	})
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return 0, fmt.Errorf("rabbitmq: depth of %q: the queue does not exist: %w", v.Queue, err)
		}
		return 0, fmt.Errorf("rabbitmq: depth of %q: %w", v.Queue, err)
	}
	return n, nil
}

package rabbitmq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// ErrUnroutable is returned (wrapped) by a publish the broker returned with
// basic.return: no queue was bound to take it. ackwise publishes with the
// mandatory flag, so an unroutable message is an error, never dropped
// quietly.
var ErrUnroutable = errors.New("rabbitmq: message unroutable")

// ErrNacked is returned (wrapped) by a publish the broker refused with
// basic.nack (an internal error, or a full queue with overflow
// reject-publish). Publishing again later may succeed.
var ErrNacked = errors.New("rabbitmq: broker refused the message")

// ErrPlain is returned (wrapped) by Nack and DeadLetter on a source opened
// with Config.Plain: a plain queue has no wait queues and no dead-letter
// queue to move a message to. It wraps errors.ErrUnsupported, so the engine
// does not try such a move again.
var ErrPlain = fmt.Errorf("rabbitmq: plain source: no wait or dead-letter queues: %w", errors.ErrUnsupported)

// ErrNoTiers is returned (wrapped) by Nack on a source opened without
// Config.DelayTiers (tiers= in the URL): it has no wait queues to delay a
// message in, and its Capabilities.Delay is false, so the engine retries
// in place. It wraps errors.ErrUnsupported.
var ErrNoTiers = fmt.Errorf("rabbitmq: no delay tiers (Config.DelayTiers, tiers= in the URL): no wait queues: %w", errors.ErrUnsupported)

// errConnLost marks a publish whose confirmation never came because its
// channel died; the publisher sends it again on the next channel.
var errConnLost = errors.New("rabbitmq: channel closed before the broker confirmed")

// closeDrainTimeout bounds how long Close waits for outstanding confirms.
const closeDrainTimeout = 10 * time.Second

// outgoing is one message to publish.
type outgoing struct {
	exchange, key string
	pub           amqp.Publishing
	// trim, when set, lets the publish remove headers of a message whose
	// content header would not fit in a frame (trimToFit), keeping those
	// it reports true for as long as anything else is left; when nil, such
	// a message fails with ErrHeadersTooLarge.
	trim func(key string) bool
}

// publisher publishes with confirms on one channel of its own connection,
// pipelining confirms: a batch is written in one go and its confirms are
// awaited together. When the channel or connection dies it reconnects in the
// background, with backoff, and resends what was not confirmed.
type publisher struct {
	c    conn
	role string

	mu      sync.Mutex
	cur     *pubSession
	changed chan struct{} // closed and replaced when cur or refused changes
	refused error         // the last reconnection was refused for good (refusedForGood)

	closed    chan struct{}
	closeOnce sync.Once
	done      chan struct{}
	// refusing, once closed, fails publishes that have not yet got a
	// channel with ErrClosed, while those waiting for confirms go on
	// (Source.Close lets the moves in flight finish).
	refusing   chan struct{}
	refuseOnce sync.Once
	ctx        context.Context
	cancel     context.CancelFunc

	idPrefix string
	idSeq    atomic.Uint64
}

func newPublisher(ctx context.Context, c conn, role string) (*publisher, error) {
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("rabbitmq: random message-id prefix: %w", err)
	}
	p := &publisher{
		c:        c,
		role:     role,
		changed:  make(chan struct{}),
		closed:   make(chan struct{}),
		done:     make(chan struct{}),
		refusing: make(chan struct{}),
		idPrefix: hex.EncodeToString(rnd[:]) + "-",
	}
	p.ctx, p.cancel = contextFor(p.closed)
	s, err := p.open(ctx)
	if err != nil {
		p.cancel()
		return nil, err
	}
	p.cur = s
	go p.run(s)
	return p, nil
}

// nextID returns a message-id unique to this publisher, for messages that
// have none.
func (p *publisher) nextID() string {
	return p.idPrefix + strconv.FormatUint(p.idSeq.Add(1), 10)
}

// anonIDPrefix starts the message-id ackwise gives a copy of a delivery that
// had none. A publish needs a unique message-id, to match a basic.return to
// it; a source must not take this one for the event ID (see
// Source.message), or a message without an event ID would get one on its
// first hop that its first delivery never had.
const anonIDPrefix = "ackwise-anon-"

// anonID returns a message-id unique to this publisher that no source takes
// for an event ID.
func (p *publisher) anonID() string {
	return anonIDPrefix + p.nextID()
}

func (p *publisher) open(ctx context.Context) (*pubSession, error) {
	ac, err := p.c.dial(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := ac.Channel()
	if err != nil {
		ac.Close()
		return nil, fmt.Errorf("rabbitmq: open channel on %s: %w", p.c.redacted, err)
	}
	if err := ch.Confirm(false); err != nil {
		ac.Close()
		return nil, fmt.Errorf("rabbitmq: enable publisher confirms on %s: %w", p.c.redacted, err)
	}
	s := &pubSession{
		conn:    ac,
		ch:      ch,
		c:       p.c,
		role:    p.role,
		pending: make(map[uint64]*pendingPub),
		pubSem:  make(chan struct{}, 1),
		dead:    make(chan struct{}),
	}
	// Returns are unbuffered and handled by the same goroutine as confirms:
	// the broker sends basic.return before the basic.ack of the same message,
	// amqp091-go hands both over from its one reader goroutine, so the return
	// is recorded before the confirm is seen.
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1024))
	returns := ch.NotifyReturn(make(chan amqp.Return))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	blocked := ac.NotifyBlocked(make(chan amqp.Blocking, 4))
	go s.loop(confirms, returns, closes)
	go func() {
		for b := range blocked {
			if b.Active {
				p.c.log.Warn("rabbitmq: broker blocked publishing (resource alarm)", "role", p.role, ackwise.LogKeyReason, b.Reason)
			} else {
				p.c.log.Info("rabbitmq: broker unblocked publishing", "role", p.role)
			}
		}
	}()
	return s, nil
}

func (p *publisher) set(s *pubSession) {
	p.mu.Lock()
	p.cur = s
	p.refused = nil
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// refuse records the broker's refusal for good of the last reconnection
// (nil: the attempt failed otherwise) and, when that changes anything,
// wakes the publishes waiting for a channel: they fail with err, or with
// nil wait again.
func (p *publisher) refuse(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil && p.refused == nil {
		return
	}
	p.refused = err
	close(p.changed)
	p.changed = make(chan struct{})
}

// run replaces the session whenever it dies, until Close.
func (p *publisher) run(s *pubSession) {
	defer close(p.done)
	rd := p.c.redial()
	rd.connected()
	for {
		select {
		case <-s.dead:
		case <-p.closed:
			return
		}
		wait := rd.wait()
		p.c.log.Warn("rabbitmq: publisher channel lost; reconnecting", "role", p.role, "url", p.c.redacted, ackwise.LogKeyError, s.err, ackwise.LogKeyRetryIn, wait)
		p.set(nil)
		s.conn.Close()
		for {
			if !sleep(wait, p.closed) {
				return
			}
			ns, err := p.open(p.ctx)
			if err != nil {
				wait = rd.wait()
				p.c.log.Warn("rabbitmq: publisher reconnect failed", "role", p.role, ackwise.LogKeyError, err, ackwise.LogKeyRetryIn, wait)
				// Refused for good, publishes fail at once rather than wait
				// for their ctx; reconnecting goes on, for when access is
				// given back. A refusal stands only until an attempt fails
				// otherwise.
				var refused error
				if refusedForGood(err) {
					refused = err
				}
				p.refuse(refused)
				continue
			}
			rd.connected()
			s = ns
			p.set(ns)
			p.c.log.Info("rabbitmq: publisher reconnected", "role", p.role, "url", p.c.redacted)
			break
		}
	}
}

// errVoid stops a wait whose void channel closed; publish then reports
// abort's error.
var errVoid = errors.New("rabbitmq: publish no longer wanted")

// session returns the live session, waiting while the publisher reconnects,
// until ctx ends or void (nil: never) is closed. While the broker refuses
// the reconnection for good, it fails at once with that refusal, marked
// ackwise.Permanent: waiting would only run out the caller's ctx.
func (p *publisher) session(ctx context.Context, void <-chan struct{}) (*pubSession, error) {
	for {
		p.mu.Lock()
		s, changed, refused := p.cur, p.changed, p.refused
		p.mu.Unlock()
		select {
		case <-p.refusing:
			return nil, adapters.ErrClosed
		default:
		}
		if s != nil && !s.isDead.Load() {
			return s, nil
		}
		if refused != nil {
			return nil, ackwise.Permanent(refused)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-p.refusing:
			return nil, adapters.ErrClosed
		case <-void:
			return nil, errVoid
		}
	}
}

// publish publishes msgs and returns once the broker confirmed all of them,
// with each message's outcome: nil once confirmed, else why not. Messages
// whose channel died before their confirm came are sent again on the next
// channel (they may then be stored twice). Unroutable and refused messages
// are errors. abort, when not nil, is asked before each attempt and stops
// the publish of the messages not yet confirmed with its error; void (nil:
// never), once closed, ends any wait for a channel, and abort is asked
// again (a move whose delivery's channel died stops waiting for the broker
// to come back).
func (p *publisher) publish(ctx context.Context, msgs []outgoing, abort func() error, void <-chan struct{}) []error {
	res := make([]error, len(msgs))
	todo := make([]int, len(msgs))
	for i := range todo {
		todo[i] = i
	}
	// fail ends the publish of the messages not yet settled with err.
	fail := func(err error) []error {
		for _, k := range todo {
			res[k] = err
		}
		return res
	}
	for {
		s, err := p.nextAttempt(ctx, abort, void)
		if err != nil {
			return fail(err)
		}
		out, err := s.publishBatch(ctx, msgs, todo)
		if err != nil {
			return fail(err)
		}
		var retry []int
		for i, e := range out {
			if errors.Is(e, errConnLost) {
				retry = append(retry, todo[i])
			} else {
				res[todo[i]] = e
			}
		}
		if len(retry) == 0 {
			return res
		}
		todo = retry
		select {
		case <-s.dead:
		case <-void:
			return fail(voided(abort))
		case <-ctx.Done():
			return fail(fmt.Errorf("rabbitmq: unconfirmed: %w", ctx.Err()))
		}
		// A soft (channel-level) error is the broker refusing one of the
		// messages published on the channel, such as one to a missing
		// exchange (404) or with a malformed header (406). AMQP does not say
		// which: the channel is shared, and the messages of other calls
		// died with it unconfirmed. Send each of ours again alone, on a
		// channel of its own, so that a refusal fails only the message that
		// caused it.
		var ae *amqp.Error
		if errors.As(s.err, &ae) && ae.Recover {
			p.publishEachAlone(ctx, msgs, todo, abort, void, res)
			return res
		}
	}
}

// publishEachAlone publishes msgs[todo...] one at a time, each alone on a
// channel of its own, and sets their outcomes in res. ctx's end, Close,
// void and an invalid receipt end the ones not yet published with that
// error.
func (p *publisher) publishEachAlone(ctx context.Context, msgs []outgoing, todo []int, abort func() error, void <-chan struct{}, res []error) {
	for i, k := range todo {
		err := p.publishAlone(ctx, &msgs[k], abort, void)
		res[k] = err
		switch {
		case err == nil:
		case ctx.Err() != nil, errors.Is(err, adapters.ErrClosed), errors.Is(err, errVoid), errors.Is(err, adapters.ErrReceiptInvalid):
			for _, rest := range todo[i+1:] {
				res[rest] = err
			}
			return
		}
	}
}

// nextAttempt starts an attempt of a publish: abort says whether it may
// go on, then the session to publish on (waiting for one until ctx is
// done or void closes).
func (p *publisher) nextAttempt(ctx context.Context, abort func() error, void <-chan struct{}) (*pubSession, error) {
	if abort != nil {
		if err := abort(); err != nil {
			return nil, err
		}
	}
	s, err := p.session(ctx, void)
	if errors.Is(err, errVoid) {
		return nil, voided(abort)
	}
	return s, err
}

// publishAlone publishes m alone on a new channel of the current
// connection, sending it again on the next connection when the connection
// dies first.
func (p *publisher) publishAlone(ctx context.Context, m *outgoing, abort func() error, void <-chan struct{}) error {
	for {
		s, err := p.nextAttempt(ctx, abort, void)
		if err != nil {
			return err
		}
		if err := s.publishAlone(ctx, m); !errors.Is(err, errConnLost) {
			return err
		}
		select {
		case <-s.dead:
		case <-void:
			return voided(abort)
		case <-ctx.Done():
			return fmt.Errorf("rabbitmq: 1 message unconfirmed: %w", ctx.Err())
		}
	}
}

// publishAlone publishes m on a channel of s's connection that carries
// nothing else, and waits for its confirm: a channel-level refusal then
// names m. It returns errConnLost when the connection died first.
func (s *pubSession) publishAlone(ctx context.Context, m *outgoing) error {
	if err := s.fit(m); err != nil {
		return err
	}
	ch, err := s.conn.Channel()
	if err != nil {
		if errors.Is(err, amqp.ErrClosed) || s.conn.IsClosed() {
			return errConnLost
		}
		return fmt.Errorf("rabbitmq: open a channel: %w", err)
	}
	defer ch.Close()
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	closed := func() error {
		if e := <-closes; e != nil && e.Recover {
			return fmt.Errorf("rabbitmq: the broker closed the channel: %w", e)
		}
		return errConnLost
	}
	if err := ch.Confirm(false); err != nil {
		if ch.IsClosed() {
			return closed()
		}
		return fmt.Errorf("rabbitmq: enable publisher confirms: %w", err)
	}
	if err := ch.PublishWithContext(ctx, m.exchange, m.key, true, false, m.pub); err != nil {
		if ch.IsClosed() || errors.Is(err, amqp.ErrClosed) {
			return closed()
		}
		return fmt.Errorf("rabbitmq: publish to exchange %q routing key %q: %w", m.exchange, m.key, err)
	}
	select {
	case c, ok := <-confirms:
		if !ok {
			return closed()
		}
		// amqp091-go hands a basic.return over before the basic.ack of
		// the same message, from one goroutine.
		select {
		case r := <-returns:
			return fmt.Errorf("%w: exchange %q routing key %q: %d %s", ErrUnroutable, r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText)
		default:
		}
		if !c.Ack {
			return fmt.Errorf("%w (basic.nack): exchange %q routing key %q", ErrNacked, m.exchange, m.key)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("rabbitmq: waiting for publisher confirms: %w", ctx.Err())
	}
}

// voided is publish's error once its void channel closed: abort's, which
// says why.
func voided(abort func() error) error {
	if abort != nil {
		if err := abort(); err != nil {
			return err
		}
	}
	return errVoid
}

// refuseNew makes publishes that have no channel yet fail with ErrClosed;
// those already published still wait for their confirms.
func (p *publisher) refuseNew() {
	p.refuseOnce.Do(func() { close(p.refusing) })
}

// close stops reconnecting, waits for outstanding confirms (at most
// closeDrainTimeout) and closes the connection.
func (p *publisher) close() { p.closeWithin(closeDrainTimeout) }

// closeWithin is close waiting at most d for outstanding confirms.
func (p *publisher) closeWithin(d time.Duration) {
	p.closeOnce.Do(func() {
		p.refuseNew()
		close(p.closed)
		p.cancel()
		<-p.done
		p.mu.Lock()
		s := p.cur
		p.mu.Unlock()
		if s != nil {
			s.drain(d)
			s.conn.Close()
		}
	})
}

// pubSession is one confirm-mode channel and what is waiting on it.
type pubSession struct {
	conn *amqp.Connection
	ch   *amqp.Channel
	c    conn   // for its logger
	role string // the publisher's

	pubSem chan struct{} // one slot: serializes publishing so sequence numbers match (lockPublish)

	pendMu  sync.Mutex
	pending map[uint64]*pendingPub
	failed  bool          // the channel died: nothing more is registered
	drained chan struct{} // closed when pending empties, if asked for

	dead   chan struct{}
	isDead atomic.Bool
	err    error // why the channel died; written before dead is closed
}

// lockPublish takes the channel for publishing, or fails when ctx ends
// first: a write can block for long (a broker that blocks publishers in a
// resource alarm stops reading), and a caller waiting behind it keeps its
// deadline.
func (s *pubSession) lockPublish(ctx context.Context) error {
	select {
	case s.pubSem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("rabbitmq: waiting for the publishing channel: %w", ctx.Err())
	}
}

// unlockPublish hands the channel to the next publisher.
func (s *pubSession) unlockPublish() { <-s.pubSem }

type pendingPub struct {
	b                    *batch
	i                    int
	msgID, exchange, key string
	ret                  error
	// dc is the message's deferred confirmation, set once its publish
	// returned: the true ack or nack (see onConfirm).
	dc atomic.Pointer[amqp.DeferredConfirmation]
}

// batch collects the outcome of one publishBatch call.
type batch struct {
	mu        sync.Mutex // guards res and set: publishBatch reads them when ctx ends first
	res       []error
	set       []bool // res[i] is message i's outcome
	remaining atomic.Int64
	done      chan struct{}
}

// resolve records the outcome of message i. Each message is resolved once,
// by whoever removed it from the pending map.
func (b *batch) resolve(i int, err error) {
	b.mu.Lock()
	b.res[i], b.set[i] = err, true
	b.mu.Unlock()
	if b.remaining.Add(-1) == 0 {
		close(b.done)
	}
}

// outcomes returns the outcome of each message, or err for one whose
// confirm has not come or whose channel died first: it may still be
// published, but is not sent again.
func (b *batch) outcomes(err error) []error {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]error, len(b.res))
	for i, e := range b.res {
		out[i] = err
		if b.set[i] && !errors.Is(e, errConnLost) {
			out[i] = e
		}
	}
	return out
}

// publishBatch publishes msgs[idx...] on s and waits for their confirms. It
// returns one outcome per index (ctx's error for those still unconfirmed
// when ctx ended, or not yet published). A message that does not fit in a
// frame (s.fit) fails alone, or is trimmed, before anything is sent.
func (s *pubSession) publishBatch(ctx context.Context, msgs []outgoing, idx []int) ([]error, error) {
	b := &batch{res: make([]error, len(idx)), set: make([]bool, len(idx)), done: make(chan struct{})}
	b.remaining.Store(int64(len(idx)))
	// What would not fit in a frame fails (or is trimmed) before anything
	// is sent: the broker would close the connection on it.
	send := make([]int, 0, len(idx)) // positions in idx
	var unfit []int
	for i, k := range idx {
		if err := s.fit(&msgs[k]); err != nil {
			b.res[i] = err
			unfit = append(unfit, i)
			continue
		}
		send = append(send, i)
	}
	for _, i := range unfit {
		b.resolve(i, b.res[i])
	}
	if len(send) == 0 {
		return b.res, nil
	}

	if err := s.lockPublish(ctx); err != nil {
		return b.outcomes(err), nil
	}
	seq0 := s.ch.GetNextPublishSeqNo()
	entries := make([]pendingPub, len(send))
	s.pendMu.Lock()
	registered := !s.failed
	if registered {
		for j, i := range send {
			m := &msgs[idx[i]]
			entries[j] = pendingPub{b: b, i: i, msgID: m.pub.MessageId, exchange: m.exchange, key: m.key}
			s.pending[seq0+uint64(j)] = &entries[j]
		}
	}
	s.pendMu.Unlock()
	if !registered {
		s.unlockPublish()
		for _, i := range send {
			b.resolve(i, errConnLost)
		}
		return b.res, nil
	}
	for j, i := range send {
		m := &msgs[idx[i]]
		dc, err := s.ch.PublishWithDeferredConfirm(m.exchange, m.key, true, false, m.pub)
		if err == nil {
			entries[j].dc.Store(dc)
		} else {
			if s.ch.IsClosed() || errors.Is(err, amqp.ErrClosed) {
				err = errConnLost
			} else {
				err = fmt.Errorf("rabbitmq: publish to exchange %q routing key %q: %w", m.exchange, m.key, err)
			}
			// Unregister what was not published; entries the dying channel
			// already failed are resolved by it.
			s.pendMu.Lock()
			var mine []int
			for l := j; l < len(send); l++ {
				if _, ok := s.pending[seq0+uint64(l)]; ok {
					delete(s.pending, seq0+uint64(l))
					mine = append(mine, send[l])
				}
			}
			s.pendMu.Unlock()
			for _, i := range mine {
				b.resolve(i, err)
			}
			break
		}
	}
	s.unlockPublish()

	select {
	case <-b.done:
		return b.res, nil
	case <-ctx.Done():
		// The messages already confirmed (or refused) keep their outcome.
		return b.outcomes(fmt.Errorf("rabbitmq: waiting for publisher confirms: %w", ctx.Err())), nil
	}
}

// fit makes m fit in one frame of s's connection (its negotiated
// frame_max), trimming its headers when m allows it (outgoing.trim), or
// fails it, marked ackwise.Permanent: sending it again cannot help.
func (s *pubSession) fit(m *outgoing) error {
	frameMax := s.conn.Config.FrameSize
	size, err := headerFrameSize(&m.pub)
	switch {
	case err != nil:
		return ackwise.Permanent(fmt.Errorf("rabbitmq: message %q cannot be encoded: %w", m.pub.MessageId, err))
	case frameMax <= 0 || size <= frameMax:
		return nil
	case m.trim == nil:
		return ackwise.Permanent(fmt.Errorf("%w: message %q: its content header frame is %d bytes, the connection's frame_max %d", ErrHeadersTooLarge, m.pub.MessageId, size, frameMax))
	}
	names, err := trimToFit(&m.pub, frameMax, m.trim)
	if err != nil {
		return ackwise.Permanent(fmt.Errorf("rabbitmq: message %q: %w", m.pub.MessageId, err))
	}
	s.c.log.Warn("rabbitmq: headers removed from a moved copy to fit in one frame, named in "+HeaderTrimmed,
		"role", s.role, "routing_key", m.key, "message_id", m.pub.MessageId, "headers", names, "frame_size", size, "frame_max", frameMax)
	return nil
}

// loop applies confirms and returns in the order amqp091-go hands them over,
// and fails what is pending when the channel dies.
func (s *pubSession) loop(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, closes <-chan *amqp.Error) {
	for confirms != nil || returns != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			// The broker sends basic.return before the basic.ack of the same
			// message and the return channel is unbuffered, so the return is
			// applied here before its confirm can be read.
			s.onReturn(r)
		case c, ok := <-confirms:
			if !ok {
				confirms = nil
				continue
			}
			s.onConfirm(c)
		}
	}
	var err error = amqp.ErrClosed
	if e, ok := <-closes; ok && e != nil {
		err = e
	}
	s.err = err
	s.isDead.Store(true)
	s.pendMu.Lock()
	s.failed = true
	lost := s.pending
	s.pending = nil
	if s.drained != nil {
		close(s.drained)
		s.drained = nil
	}
	s.pendMu.Unlock()
	for _, e := range lost {
		e.b.resolve(e.i, errConnLost)
	}
	close(s.dead)
}

func (s *pubSession) onReturn(r amqp.Return) {
	s.pendMu.Lock()
	defer s.pendMu.Unlock()
	// Messages are matched by message-id, exchange and routing key, unique
	// in practice (the sink's message-id is the event ID). Should two
	// pending messages share all three, the oldest not yet returned is
	// taken: returns come in publish order, and two messages with the same
	// exchange and routing key route alike unless bindings changed between
	// them.
	var best uint64
	var e *pendingPub
	for seq, p := range s.pending {
		if p.ret == nil && p.msgID == r.MessageId && p.exchange == r.Exchange && p.key == r.RoutingKey && (e == nil || seq < best) {
			best, e = seq, p
		}
	}
	if e != nil {
		e.ret = fmt.Errorf("%w: exchange %q routing key %q: %d %s", ErrUnroutable, r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText)
	}
}

func (s *pubSession) onConfirm(c amqp.Confirmation) {
	s.pendMu.Lock()
	e, ok := s.pending[c.DeliveryTag]
	if ok {
		delete(s.pending, c.DeliveryTag)
		if len(s.pending) == 0 && s.drained != nil {
			close(s.drained)
			s.drained = nil
		}
	}
	s.pendMu.Unlock()
	if !ok {
		return
	}
	// RabbitMQ may nack a message at once and ack the ones around it later
	// with one multiple ack that spans it; amqp091-go's NotifyPublish then
	// hands over an ack for the nacked message as well (its resequencing
	// overwrites the nack it held back). Its deferred confirmation keeps
	// the nack, and is resolved before any confirmation of its tag is
	// handed over. Nil only while the publish call has not returned, when
	// no later message (whose multiple ack could span it) was published.
	ack := c.Ack
	if dc := e.dc.Load(); dc != nil {
		select {
		case <-dc.Done():
			ack = dc.Acked()
		default:
		}
	}
	var err error
	switch {
	case e.ret != nil:
		err = e.ret
	case !ack:
		err = fmt.Errorf("%w (basic.nack): exchange %q routing key %q", ErrNacked, e.exchange, e.key)
	}
	e.b.resolve(e.i, err)
}

// drain waits until nothing is pending on s, at most d.
func (s *pubSession) drain(d time.Duration) {
	s.pendMu.Lock()
	if len(s.pending) == 0 || s.failed {
		s.pendMu.Unlock()
		return
	}
	if s.drained == nil {
		s.drained = make(chan struct{})
	}
	ch := s.drained
	s.pendMu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
}

package consumer

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// ErrRunning is returned by Run on a consumer that is already running.
var ErrRunning = errors.New("consumer: already running")

// ErrDrainTimeout is returned by Run when handlers were still running after
// the drain deadline and a grace period after their context was cancelled.
// Their messages are not settled by Run: a handler that returns later still
// has its message settled then, if the source is still open; otherwise the
// broker redelivers it. Until those handlers return, the engine goes on
// extending their messages' leases (where the source has leases), so the
// broker does not hand them to another consumer meanwhile, and Run returns
// ErrRunning.
var ErrDrainTimeout = errors.New("consumer: drain timed out: handlers still running")

// Consumer runs a handler on the messages of one source. Create it with New.
type Consumer struct {
	src      adapters.Source
	recycler adapters.Recycler   // src, when it reuses messages; else nil
	acker    adapters.BatchAcker // src, when it acks batches; else nil
	detacher adapters.Detacher   // src, when its messages share memory; else nil
	caps     adapters.Capabilities
	cfg      Config
	h        ackwise.Handler
	inPlace  bool // retries wait in place instead of through the broker
	clock    ackwise.Clock
	log      *slog.Logger
	stats    counters
	running  atomic.Bool

	pool pool
	pace pace

	mu         sync.Mutex
	inflight   int
	lanes      lanes
	space      chan struct{} // signalled when in-flight drops below the limit
	stopping   atomic.Bool   // written under mu, read without it
	drained    chan struct{} // closed when in-flight reaches 0 while stopping
	holds      holds
	leases     leases
	breaker    *breakerState
	settleCtx  context.Context // set by Run before its goroutines start
	handlerCtx context.Context // set by Run before its goroutines start
}

// New creates a consumer that runs h on the messages of src. It validates
// cfg against the source's capabilities and returns an error naming the bad
// field and value; it never panics on bad input. New does not take ownership
// of src: the caller closes it after Run returned.
func New(src adapters.Source, h ackwise.Handler, cfg Config) (*Consumer, error) {
	if src == nil {
		return nil, errors.New("consumer: source is nil")
	}
	if h == nil {
		return nil, errors.New("consumer: handler is nil")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := cfg.Retry
	ownSchedule := len(r.Tiers) > 0 || r.InitialInterval != 0 || r.Multiplier != 0 || r.MaxInterval != 0 || r.Jitter != 0
	cfg = cfg.withDefaults()
	caps := src.Capabilities()
	recycler, _ := src.(adapters.Recycler)
	acker, _ := src.(adapters.BatchAcker)
	detacher, _ := src.(adapters.Detacher)
	c := &Consumer{
		src:      src,
		recycler: recycler,
		acker:    acker,
		detacher: detacher,
		caps:     caps,
		cfg:      cfg,
		clock:    cfg.Clock,
		log:      cfg.Logger.With(slog.String("consumer", cfg.Name)),
		space:    make(chan struct{}, 1),
	}
	c.pool.c = c
	c.holds = holds{c: c, seed: maphash.MakeSeed()}
	c.lanes.init(cfg.Ordering, cfg.MaxInFlight)
	switch cfg.RetryMode {
	case RetryBroker:
		if !caps.Delay {
			return nil, fmt.Errorf("consumer: RetryMode = %v: the source cannot delay redelivery (Capabilities.Delay is false); use RetryInPlace or configure the adapter's delay mechanism (retry topics, wait queues)", cfg.RetryMode)
		}
	case RetryInPlace:
		c.inPlace = true
	default:
		c.inPlace = !caps.Delay || (caps.Ordered && cfg.Ordering != OrderNone)
	}
	if !c.inPlace && !ownSchedule && len(caps.DelayTiers) > 0 {
		// Retries go through the source's tiers (retry topics, wait
		// queues) and the policy sets no schedule of its own: the schedule
		// is the tiers, so that a message walks the chain (the first retry
		// waits the first tier, the next the second, the last repeating).
		// The default exponential schedule, rounded up to a tier by the
		// source, would only ever reach the first tiers.
		c.cfg.Retry.Tiers = slices.Clone(caps.DelayTiers)
	}
	c.leases.init(c)
	if c.inPlace && caps.Lease > 0 && !caps.ExtendLease {
		c.log.Warn("retries wait in place but the source cannot extend leases: a message waiting longer than the lease is delivered again", slog.Duration("lease", caps.Lease))
	}
	if cfg.Breaker != nil {
		b, err := cfg.Breaker.state(c)
		if err != nil {
			return nil, err
		}
		c.breaker = b
	}
	inner := h
	if len(cfg.Middleware) > 0 {
		inner = ackwise.Chain(inner, cfg.Middleware...)
	}
	if cfg.Inbox != nil {
		inner = cfg.Inbox(inner)
	}
	c.h = inner
	return c, nil
}

// Stats returns the consumer's counters.
func (c *Consumer) Stats() Stats {
	c.mu.Lock()
	inflight := c.inflight
	var paused bool
	var held, trips int
	if b := c.breaker; b != nil {
		paused, held, trips = b.open, len(b.held), b.trips
	}
	c.mu.Unlock()
	o := &c.stats.outcomes
	return Stats{
		Received:      c.stats.received.Load(),
		Acked:         o[Acked].Load(),
		Retried:       o[Retried].Load(),
		DeadLettered:  o[DeadLettered].Load(),
		Discarded:     o[Discarded].Load(),
		Released:      o[Released].Load(),
		SettleFailed:  o[SettleFailed].Load(),
		Panics:        c.stats.panics.Load(),
		ReceiveErrors: c.stats.receiveErrors.Load(),
		InFlight:      inflight,
		Paused:        paused,
		Held:          held,
		BreakerTrips:  trips,
	}
}

// Run receives and handles messages until ctx is done or the source is
// closed, then drains: it stops receiving, lets running handlers finish for
// up to Config.DrainTimeout, settles what finished and releases the rest to
// the broker unacknowledged. It returns nil after a clean drain, the
// source's error wrapping adapters.ErrClosed if the source closed under it,
// or ErrDrainTimeout. A Consumer runs once at a time; it may be run again
// after Run returned (after ErrDrainTimeout, once the handlers it left
// running returned).
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}

	// Settle calls carry the Run context's values but are never cancelled:
	// a finished handler's ack must still reach the broker during a drain.
	c.settleCtx = context.WithoutCancel(ctx)
	handlerCtx, cancelHandlers := context.WithCancel(c.settleCtx)
	defer cancelHandlers()
	c.handlerCtx = handlerCtx
	c.mu.Lock()
	c.stopping.Store(false)
	c.drained = make(chan struct{})
	c.mu.Unlock()
	c.pool.work = make(chan *chunk, c.cfg.MaxInFlight)
	c.pool.slots = make(chan struct{}, c.cfg.Concurrency)
	c.pace.reset()
	if inv, ok := c.src.(adapters.Invalidator); ok {
		inv.OnInvalid(c.wakeInvalid)
	}

	quit := make(chan struct{})   // workers and the stall watch
	hbQuit := make(chan struct{}) // the heartbeat, which may outlive them
	var workers sync.WaitGroup
	// The last worker state is the receive loop's, for inline runs.
	c.pool.workers = make([]*workerState, c.cfg.Concurrency+1)
	for i := range c.pool.workers {
		c.pool.workers[i] = &workerState{}
	}
	for _, w := range c.pool.workers[:c.cfg.Concurrency] {
		workers.Add(1)
		go func() {
			defer workers.Done()
			c.pool.run(handlerCtx, w, quit)
		}()
	}
	var hb sync.WaitGroup
	hb.Add(1)
	go func() {
		defer hb.Done()
		c.pool.stallWatch(quit)
	}()
	if c.leases.on {
		hb.Add(1)
		go func() {
			defer hb.Done()
			c.leases.loop(hbQuit)
		}()
	}
	// The receive loop runs on its own goroutine: it may be running a
	// handler inline when ctx ends, and the drain must start anyway.
	workers.Add(1)
	recvDone := make(chan error, 1)
	go func() {
		defer workers.Done()
		recvDone <- c.receiveLoop(ctx, c.pool.workers[c.cfg.Concurrency])
	}()
	var recvErr error
	recvEnded := false
	select {
	case recvErr = <-recvDone:
		recvEnded = true
	case <-ctx.Done():
	}

	// Drain (invariant 7).
	c.stop()
	err := c.awaitDrain(cancelHandlers)
	close(quit)
	if err != nil {
		// Handlers are stuck past their cancelled context. Hand back what
		// is still queued, return, and stay "running" until the stuck
		// workers come back, so a new Run cannot mix with them. Their
		// messages keep their leases until then: a handler that returns
		// late still has its message settled, and meanwhile the broker
		// must not deliver it to another consumer.
		c.pool.releaseQueued()
		go func() {
			workers.Wait()
			close(hbQuit)
			hb.Wait()
			c.running.Store(false)
		}()
		return err
	}
	close(hbQuit)
	if !recvEnded {
		recvErr = <-recvDone
	}
	workers.Wait()
	hb.Wait()
	c.running.Store(false)
	return recvErr
}

// receiveLoop fills free in-flight slots from the source until ctx is done.
// w is its worker state for the messages it runs inline.
func (c *Consumer) receiveLoop(ctx context.Context, w *workerState) error {
	buf := make([]*ackwise.Message, c.cfg.ReceiveBatch)
	failures := 0 // in a row
	for {
		if ctx.Err() != nil {
			return nil
		}
		free := c.awaitSpace(ctx)
		if free == 0 {
			return nil
		}
		epoch := c.lanes.returns.Load()
		n, err := c.src.Receive(ctx, buf[:min(free, len(buf))])
		if n > 0 {
			failures = 0
			c.stats.received.Add(uint64(n))
			c.pool.dispatch(buf[:n], w, epoch)
			forget(c, buf[:n])
		} else if err == nil && ctx.Err() == nil {
			// The contract says Receive blocks for at least one message;
			// do not spin on one that does not.
			err = errors.New("consumer: source returned no message and no error")
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, adapters.ErrClosed) {
				return err
			}
			c.stats.receiveErrors.Add(1)
			failures++
			pause := backoffAfter(failures)
			c.log.Warn("receive failed", slog.Any("error", err), slog.Duration("retry_in", pause))
			if !c.sleep(ctx, pause) {
				return nil
			}
		}
	}
}

// sleep waits d on the engine's clock; false if ctx ended first.
func (c *Consumer) sleep(ctx context.Context, d time.Duration) bool {
	done := make(chan struct{})
	t := c.clock.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
		return true
	case <-ctx.Done():
		t.Stop()
		return false
	}
}

// awaitSpace blocks until fewer than MaxInFlight messages are in flight and
// the breaker lets consumption go on, and returns the free slots; 0 when ctx
// ended.
func (c *Consumer) awaitSpace(ctx context.Context) int {
	for {
		c.mu.Lock()
		free := c.cfg.MaxInFlight - c.inflight
		paused := c.breaker != nil && c.breaker.open
		c.mu.Unlock()
		if free > 0 && !paused {
			return free
		}
		select {
		case <-c.space:
		case <-ctx.Done():
			return 0
		}
	}
}

// signalSpace wakes the receive loop. Called with c.mu held.
func (c *Consumer) signalSpace() {
	select {
	case c.space <- struct{}{}:
	default:
	}
}

// result is what process did with a message.
type result int

const (
	settled   result = iota // settled: the caller finishes it
	held                    // still in flight: waiting in place or held by the breaker
	succeeded               // the handler returned nil: the caller acks it, then finishes it
	// returned: handed back to the broker unsettled (released, or its
	// settle failed), so it comes back later. The caller finishes it and
	// releases the messages queued behind it in its lane: run now, they
	// would overtake it.
	returned
)

// process runs t's message and settles it, except a success, which the
// caller acks (so that a worker acks the messages of a chunk together).
// elapsed is the handler's run time when an Observer wants it.
func (c *Consumer) process(ctx context.Context, tp *task) (res result, elapsed time.Duration) {
	msg := tp.msg
	if tp.moves > 0 {
		return c.retryMove(*tp), 0
	}
	if c.stopping.Load() || !c.src.Valid(msg) {
		c.releaseTask(*tp)
		return returned, 0
	}
	if msg.BrokerID == "" && tp.sum == 0 {
		// Its identity is its content as received: a handler that changes
		// the message (against its contract: replaces its payload with a
		// decoded one, say) must not make its redelivery unrecognisable
		// after a failed settle.
		tp.sum = c.holds.sumOf(msg)
	}
	t := *tp
	if c.holds.nFailed.Load() > 0 {
		if res, ok := c.holds.holdRedelivery(t); ok {
			return res, 0
		}
	}
	t.retried = false // it runs: this attempt gets an outcome of its own
	var start time.Time
	if c.cfg.Observer != nil {
		start = time.Now()
	}
	err := c.invoke(ctx, msg)
	if c.cfg.Observer != nil {
		// At least 1ns: a zero elapsed tells the Observer the handler did
		// not run (a clock coarser than the run would read 0).
		elapsed = max(time.Since(start), 1)
	}
	if err == nil {
		if c.breaker != nil {
			c.breaker.success()
		}
		return succeeded, elapsed
	}
	if ctx.Err() != nil {
		// The engine cancelled the handler at the drain deadline: whatever
		// it returned, the work did not finish, so the message is not
		// settled (invariant 7).
		c.release(msg)
		return returned, 0
	}
	cl := ackwise.Classify(err, c.cfg.Classifiers...)
	var panicked *panicError
	if errors.As(err, &panicked) {
		cl = ackwise.Classification{Class: ackwise.ClassPermanent}
		if c.cfg.RetryPanics {
			cl.Class = ackwise.ClassTransient
		}
	}
	return c.fail(t, err, cl, elapsed), 0
}

// fail settles a failed message according to its class.
func (c *Consumer) fail(t task, err error, cl ackwise.Classification, elapsed time.Duration) result {
	msg := t.msg
	sctx := c.settleCtx
	now := c.clock.Now()
	if msg.FirstFailure.IsZero() {
		msg.FirstFailure = now
	}
	switch cl.Class {
	case ackwise.ClassDiscard:
		c.log.Debug("discarded", slog.String("event_id", adapters.EventID(msg)), slog.Any("error", err))
		return c.settle(t, Discarded, elapsed, c.src.Ack(sctx, msg))
	case ackwise.ClassPermanent:
		return c.deadLetter(t, dlq.ReasonPermanent, err, cl.Class, now, elapsed)
	}
	if c.breaker != nil && c.breaker.failure(t, cl.After) {
		// The dependency looks down: hold the message without spending an
		// attempt; the breaker probes with it later.
		return held
	}
	if c.cfg.Retry.Exhausted(msg.Attempt) {
		return c.deadLetter(t, dlq.ReasonMaxAttempts, err, cl.Class, now, elapsed)
	}
	delay := cl.After
	if delay <= 0 {
		delay = c.cfg.Retry.Delay(msg.Attempt)
	}
	c.log.Debug("retrying", slog.String("event_id", adapters.EventID(msg)), slog.Int("attempt", msg.Attempt), slog.Duration("delay", delay), slog.Any("error", err))
	if c.inPlace {
		if c.stopping.Load() {
			c.release(msg) // no new waits during the drain
			return returned
		}
		// Observe before the wait is scheduled: once it is, the message may
		// run again on another worker.
		c.observe(msg, Retried, elapsed)
		t.retried = true
		if !c.holds.waitInPlace(t, delay, true) {
			c.releaseTask(t) // Run began stopping meanwhile: observed once, as Retried
			return returned
		}
		return held
	}
	// Only the broker's delay has a ceiling: a wait in place is the
	// engine's own timer, and honours a RetryAfter longer than the
	// broker's last tier.
	if c.caps.MaxDelay > 0 && delay > c.caps.MaxDelay {
		delay = c.caps.MaxDelay
	}
	return c.move(t, pendingMove{o: Retried, do: func(ctx context.Context) error { return c.src.Nack(ctx, msg, delay) }}, elapsed)
}

func (c *Consumer) deadLetter(t task, reason dlq.Reason, err error, class ackwise.Class, now time.Time, elapsed time.Duration) result {
	msg := t.msg
	env := dlq.New(msg, reason, err, class, now, c.cfg.Name, c.cfg.Version)
	return c.move(t, pendingMove{o: DeadLettered, do: func(ctx context.Context) error {
		if derr := c.src.DeadLetter(ctx, msg, env); derr != nil {
			// Not confirmed: the message must not be acked (invariant 3).
			return fmt.Errorf("dead-letter: %w", derr)
		}
		c.log.Warn("dead-lettered", slog.String("event_id", adapters.EventID(msg)), slog.String("reason", string(reason)), slog.Int("attempts", msg.Attempt), slog.Any("error", err))
		return nil
	}}, elapsed)
}

// move runs do, a move of t's message to the broker's delay (Nack) or to
// the dead-letter destination, and settles the message by its result. A
// move that failed while the message is still this consumer's (its receipt
// valid) is tried again in place after a pause, 10ms doubling up to 5s: the
// message stays in flight, its lane held and its lease extended, and its
// handler does not run again. Handed back to the broker instead, it would
// run again on each try, and some brokers count every redelivery: a Kafka
// share group at its delivery limit archives the record, a quorum queue
// drops or dead-letters it, so a dead-letter destination refusing writes
// for a few hundred milliseconds would lose the message. At stop the
// message is released, unsettled; and so is one that stops being Valid
// meanwhile: at once when the source tells (wakeInvalid), else when its
// pause ends (RabbitMQ: a delivery held past ConsumerTimeoutWarn, before the
// broker's consumer_timeout takes back every delivery of its channel).
func (c *Consumer) move(t task, pm pendingMove, elapsed time.Duration) result {
	msg := t.msg
	err := pm.do(c.settleCtx)
	if err == nil || errors.Is(err, adapters.ErrReceiptInvalid) || errors.Is(err, errors.ErrUnsupported) ||
		c.stopping.Load() || !c.src.Valid(msg) {
		// Settled; or not this consumer's any more; or a move the source
		// can never make (a plain RabbitMQ queue has nowhere to move to).
		return c.settle(t, pm.o, elapsed, err)
	}
	c.observe(msg, SettleFailed, elapsed)
	t.moves = min(t.moves, 254) + 1
	pause := backoffAfter(int(t.moves))
	c.log.Error("settle failed; trying again in place", slog.String("outcome", pm.o.String()), slog.String("event_id", adapters.EventID(msg)), slog.Int("tries", int(t.moves)), slog.Duration("retry_in", pause), slog.Any("error", err))
	c.holds.detach(msg) // before the lock: a copy of a large payload takes time
	c.mu.Lock()
	if c.stopping.Load() {
		c.mu.Unlock()
		c.releaseTask(t) // no new waits during the drain
		return returned
	}
	c.holds.waitMoveLocked(t, pm, pause)
	if b := c.breaker; b != nil && msg == b.probing {
		// A probe being moved told nothing about the dependency: probe
		// with the next held message meanwhile (see probeEndedLocked).
		b.probeEndedLocked()
	}
	c.mu.Unlock()
	return held
}

// retryMove tries again the failed move t waited for (see move), or
// releases t's message when the consumer is stopping or the message is no
// longer this consumer's (observed once, as SettleFailed, when its move
// failed).
func (c *Consumer) retryMove(t task) result {
	if c.stopping.Load() || !c.src.Valid(t.msg) {
		c.releaseTask(t)
		return returned
	}
	return c.move(t, c.holds.takeMove(t.msg), 0)
}

// settle records the outcome of a settle call: settled, or returned when it
// failed (the broker redelivers msg).
func (c *Consumer) settle(t task, o Outcome, elapsed time.Duration, err error) result {
	msg := t.msg
	if err != nil {
		if !errors.Is(err, adapters.ErrReceiptInvalid) {
			c.holds.settleFailed(t)
			c.log.Error("settle failed; the broker will redeliver", slog.String("outcome", o.String()), slog.String("event_id", adapters.EventID(msg)), slog.Any("error", err))
			// Hand the delivery back so it is not stuck unsettled (an AMQP
			// delivery would hold its prefetch slot until the channel
			// closes). Release is never an ack, so this is always safe.
			_ = c.src.Release(context.Background(), msg)
		}
		c.observe(msg, SettleFailed, elapsed)
		return returned
	}
	c.holds.settledOK(t)
	c.observe(msg, o, elapsed)
	return settled
}

func (c *Consumer) observe(msg *ackwise.Message, o Outcome, elapsed time.Duration) {
	c.stats.outcomes[o].Add(1)
	if c.cfg.Observer != nil {
		c.cfg.Observer.Observe(msg, o, elapsed)
	}
}

func (c *Consumer) release(msg *ackwise.Message) {
	_ = c.src.Release(context.Background(), msg)
	c.observe(msg, Released, 0)
}

// releaseTask releases t's message, observed as Released unless its last
// outcome was an in-place Retried whose next attempt has not run
// (task.retried): it is observed once, as Retried, as a message waiting at
// the broker is; or a failed move waiting to be tried again (task.moves),
// observed already, as SettleFailed.
func (c *Consumer) releaseTask(t task) {
	if t.moves > 0 {
		c.holds.takeMove(t.msg)
	}
	if t.retried || t.moves > 0 {
		_ = c.src.Release(context.Background(), t.msg)
		return
	}
	c.release(t.msg)
}

// wakeInvalid ends the in-place waits of the messages that are no longer
// Valid (adapters.Invalidator): each goes to a worker as when its wait
// ends, which hands it back (process, retryMove), observed as it would be
// then, and releases the messages queued behind it in its lane. A retry's
// wait ends without the next attempt: the message does not run again. The
// messages an open breaker holds are handed back the same way
// (handBackInvalidLocked).
func (c *Consumer) wakeInvalid() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopping.Load() {
		return // stop ends every wait
	}
	c.holds.wakeInvalidLocked()
	if c.breaker != nil {
		c.breaker.handBackInvalidLocked()
	}
}

// stop begins the drain: no more handler starts, in-place waits are
// released.
func (c *Consumer) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopping.Store(true)
	c.holds.stopLocked()
	if c.breaker != nil {
		c.breaker.stopLocked()
	}
	if c.inflight == 0 {
		close(c.drained)
	}
}

// awaitDrain waits for in-flight messages to settle or be released, up to
// the drain deadline, then cancels handlers and waits a short grace.
func (c *Consumer) awaitDrain(cancelHandlers context.CancelFunc) error {
	c.mu.Lock()
	drained := c.drained
	c.mu.Unlock()
	if c.cfg.DrainTimeout < 0 {
		<-drained
		return nil
	}
	t := time.NewTimer(c.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-drained:
		return nil
	case <-t.C:
	}
	c.log.Warn("drain deadline passed; cancelling running handlers", slog.Duration("drain_timeout", c.cfg.DrainTimeout))
	cancelHandlers()
	grace := min(max(c.cfg.DrainTimeout/10, 100*time.Millisecond), 5*time.Second)
	t.Reset(grace)
	select {
	case <-drained:
		return nil
	case <-t.C:
		return ErrDrainTimeout
	}
}

// panicError is a recovered handler panic.
type panicError struct {
	value any
	stack string
}

func (p *panicError) Error() string {
	return dlq.BoundError(fmt.Sprintf("panic: %v\n%s", p.value, p.stack))
}

// invoke runs the handler pipeline, recovering a panic into an error.
func (c *Consumer) invoke(ctx context.Context, msg *ackwise.Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			c.stats.panics.Add(1)
			err = &panicError{value: v, stack: string(debug.Stack())}
			c.log.Error("handler panicked", slog.String("event_id", adapters.EventID(msg)), slog.Any("panic", v))
		}
	}()
	return c.h.Handle(ctx, msg)
}

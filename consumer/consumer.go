package consumer

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
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
//
// Its state is split by what owns it, each part in a file of its own: the
// pool of workers (handoff.go), the lanes that keep per-key order
// (lanes.go), the messages waiting in place (holds.go), the lease
// heartbeat (leases.go) and the breaker (breaker.go); settle.go runs and
// settles a message. The parts share one lock, mu, with the in-flight
// count: a message passes from one to another (a lane's next message goes
// to the pool as the one before it finishes, a wait in place ends by
// queueing to the pool, the drain ends every wait and hold) and the count
// must stay true across each step. Methods named ...Locked require the
// caller to hold mu.
type Consumer struct {
	// Set by New, read-only after.
	src      adapters.Source
	recycler adapters.Recycler    // src's, when it reuses messages; else nil
	acker    adapters.BatchAcker  // src's, when it acks batches; else nil
	detacher adapters.Detacher    // src's, when its messages share memory; else nil
	invalid  adapters.Invalidator // src's, when it tells of invalid deliveries; else nil
	caps     adapters.Capabilities
	cfg      Config
	h        ackwise.Handler      // New's, with its middleware; nil for NewBatch's
	bh       ackwise.BatchHandler // NewBatch's, with its middleware; nil for New's
	inPlace  bool                 // retries wait in place instead of through the broker
	clock    ackwise.Clock
	log      *slog.Logger

	stats   counters
	running atomic.Bool
	pace    pace // how long handlers take; lock-free

	mu       sync.Mutex
	inflight int           // received and not finished
	space    chan struct{} // signalled when in-flight drops below the limit
	stopping atomic.Bool   // written under mu, read without it
	drained  chan struct{} // closed when in-flight reaches 0 while stopping
	pool     pool
	lanes    lanes
	holds    holds
	leases   leases
	ages     ages          // for the lag gauge (metrics.go)
	breaker  *breakerState // nil without Config.Breaker
	gauges   *gauges       // nil unless Config.Observer is NewMetrics' and this consumer's

	settleCtx  context.Context // set by Run before its goroutines start
	handlerCtx context.Context // set by Run before its goroutines start
}

// New creates a consumer that runs h on the messages of src. It validates
// cfg against the source's capabilities and returns an error naming the bad
// field and value; it never panics on bad input. New does not take ownership
// of src: the caller closes it after Run returned.
func New(src adapters.Source, h ackwise.Handler, cfg Config) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("consumer: handler is nil")
	}
	if err := cfg.Batch.unused(); err != nil {
		return nil, err
	}
	c, err := newConsumer(src, cfg)
	if err != nil {
		return nil, err
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

// newConsumer is what New and NewBatch share: cfg validated and its
// defaults applied, the source's capabilities checked, the parts set up.
// The caller sets the handler.
func newConsumer(src adapters.Source, cfg Config) (*Consumer, error) {
	if src == nil {
		return nil, errors.New("consumer: source is nil")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := cfg.Retry
	ownSchedule := len(r.Tiers) > 0 || r.InitialInterval != 0 || r.Multiplier != 0 || r.MaxInterval != 0 || r.Jitter != 0
	cfg = cfg.withDefaults()
	caps := src.Capabilities()
	ext := src.Extensions()
	if ac := ext.AttemptsChecker; ac != nil {
		if err := ac.CheckAttempts(cfg.Retry.MaxAttempts); err != nil {
			return nil, fmt.Errorf("consumer: Retry.MaxAttempts = %d disagrees with the source's broker: %w", cfg.Retry.MaxAttempts, err)
		}
	}
	c := &Consumer{
		src:      src,
		recycler: ext.Recycler,
		acker:    ext.BatchAcker,
		detacher: ext.Detacher,
		invalid:  ext.Invalidator,
		caps:     caps,
		cfg:      cfg,
		clock:    cfg.Clock,
		log:      cfg.Logger.With(slog.String(ackwise.LogKeyConsumer, cfg.Name)),
		space:    make(chan struct{}, 1),
	}
	c.pool.c = c
	c.holds = holds{c: c, seed: maphash.MakeSeed()}
	c.lanes.init(cfg.Ordering, cfg.MaxInFlight)
	switch cfg.RetryMode {
	case RetryBroker:
		if !caps.Delay {
			return nil, fmt.Errorf("consumer: RetryMode = %v: the source cannot delay redelivery (Capabilities.Delay is false): name delay tiers for its retry topics or wait queues (tiers= in its URL, the adapter config's tiers), or use RetryInPlace", cfg.RetryMode)
		}
	case RetryInPlace:
		c.inPlace = true
	default:
		// Tiers named (the adapter was given retry topics or wait queues):
		// through the broker, even on an ordered source.
		tiered := caps.Delay && len(caps.DelayTiers) > 0
		c.inPlace = !caps.Delay || (!tiered && caps.Ordered && cfg.Ordering != OrderNone)
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
		c.log.Warn("retries wait in place but the source cannot extend leases: a message waiting longer than the lease is delivered again", slog.Duration(ackwise.LogKeyLease, caps.Lease))
	}
	if cfg.Breaker != nil {
		b, err := cfg.Breaker.state(c)
		if err != nil {
			return nil, err
		}
		c.breaker = b
	}
	if m, ok := cfg.Observer.(*metrics); ok {
		// NewMetrics' Observer also observes this consumer's gauges (and
		// turns on the lag's table).
		c.gauges = m.claimGauges(c)
		c.ages.on = c.gauges != nil
	}
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
	wake := make(chan struct{}, 1)
	c.pool.watchWake = wake
	c.pace.reset()
	if c.invalid != nil {
		c.invalid.OnInvalid(c.wakeInvalid)
	}
	if c.gauges != nil {
		defer c.gauges.start()()
	}

	quit := make(chan struct{})   // workers and the stall watch
	hbQuit := make(chan struct{}) // the heartbeat, which may outlive them
	var workers sync.WaitGroup
	// The last worker state is the receive loop's, for inline runs.
	workerStates := make([]*workerState, c.cfg.Concurrency+1)
	for i := range workerStates {
		w := &workerState{}
		// Stopped until the worker begins a chunk (workerState.watch). It
		// wakes this Run's watch only: a late fire finds a full channel
		// or one nobody reads.
		w.timer = time.AfterFunc(time.Hour, func() {
			select {
			case wake <- struct{}{}:
			default:
			}
		})
		w.timer.Stop()
		workerStates[i] = w
	}
	c.mu.Lock() // StallWatchParked, in tests, reads them under mu
	c.pool.workers = workerStates
	c.mu.Unlock()
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
			c.log.Warn("receive failed", slog.Any(ackwise.LogKeyError, err), slog.Duration(ackwise.LogKeyRetryIn, pause))
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
		if c.bh != nil {
			c.mu.Lock()
			// Nothing more can come to fill the waiting batch: no
			// need to let it linger.
			c.pool.flushPendingLocked()
			c.mu.Unlock()
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
	c.pool.flushPendingLocked() // to the workers, which release them
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
	c.log.Warn("drain deadline passed; cancelling running handlers", slog.Duration(ackwise.LogKeyTimeout, c.cfg.DrainTimeout))
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

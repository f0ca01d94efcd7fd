package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// Defaults and bounds of BatchConfig fields.
const (
	// DefaultBatchSize is the most messages per HandleBatch call.
	DefaultBatchSize = 100
	// DefaultBatchLinger is how long a batch not yet full waits for more.
	DefaultBatchLinger = 5 * time.Millisecond
	// MaxBatchSize bounds BatchConfig.Size.
	MaxBatchSize = 1 << 16
)

// BatchConfig configures the batches of a consumer made with [NewBatch];
// [New] refuses a Config whose Batch is set. The zero value means the
// documented defaults.
type BatchConfig struct {
	// Size is the most messages handed to one HandleBatch call. Default
	// DefaultBatchSize (100); at most MaxBatchSize and at most MaxInFlight.
	Size int
	// Linger is how long messages ready to run wait for more to fill their
	// batch before they are handed to a handler anyway. Default
	// DefaultBatchLinger (5ms); -1 hands off at once whatever is ready.
	// It runs on Config.Clock. A full batch never waits.
	Linger time.Duration
	// Inbox is the batch idempotency middleware (middleware.BatchInbox):
	// outermost, inside the engine's recover and classification, so the
	// inbox records commit with the batch's effects or not at all.
	Inbox ackwise.BatchMiddleware
	// Middleware wraps the batch handler, the first outermost, inside
	// Inbox.
	Middleware []ackwise.BatchMiddleware
}

func (b BatchConfig) set() bool {
	return b.Size != 0 || b.Linger != 0 || b.Inbox != nil || len(b.Middleware) > 0
}

// unused is New's check: Batch is NewBatch's.
func (b BatchConfig) unused() error {
	if b.set() {
		return errors.New("consumer: Config.Batch is set: it configures NewBatch's batches, and New runs a Handler on one message at a time (use NewBatch with a BatchHandler)")
	}
	return nil
}

func (b BatchConfig) validate() error {
	switch {
	case b.Size < 0:
		return fmt.Errorf("consumer: Batch.Size = %d: must be positive (0 means %d)", b.Size, DefaultBatchSize)
	case b.Size > MaxBatchSize:
		return fmt.Errorf("consumer: Batch.Size = %d: at most MaxBatchSize (%d)", b.Size, MaxBatchSize)
	case b.Linger < -1:
		return fmt.Errorf("consumer: Batch.Linger = %v: must be positive, 0 (default %v) or -1 (no wait)", b.Linger, DefaultBatchLinger)
	}
	for i, mw := range b.Middleware {
		if mw == nil {
			return fmt.Errorf("consumer: Batch.Middleware[%d] is nil", i)
		}
	}
	return nil
}

// NewBatch creates a consumer that runs h on batches of the messages of
// src: up to cfg.Batch.Size messages per call, a batch not yet full
// waiting cfg.Batch.Linger for more. Everything else is as for [New], per
// message: each message of a batch has its own outcome (see
// [ackwise.BatchHandler]), and is acked, retried, dead-lettered or
// discarded as if a Handler had returned it; the breaker, leases, metrics
// and the drain are the same.
//
// Order: a batch holds at most one message of a key (of a partition, with
// OrderPartition), so per-key order holds as it does for New — and a batch
// holds as many keys as are ready. Under OrderPartition a batch is at most
// as large as the number of partitions: use OrderKey (the default) or
// OrderNone for large batches.
//
// Messages of a batch that failed together — one error for the whole
// batch, a panic, or the same error value in several entries of a
// BatchError (as middleware.BatchInbox passes a whole-batch error on) —
// with a transient or permanent error are not settled by it: each runs
// again alone, at once, so that one bad message cannot take its
// batch-mates to the dead-letter destination or use up their attempts;
// each is then settled by the outcome of its own run. A shared
// rate-limited or discard outcome is applied to every message as it is.
// Give distinct messages distinct error values (ackwise.Permanent(err)
// wraps each anew) in a BatchError: a value shared by several entries is
// taken for a failure of them together.
//
// Config.Inbox and Config.Middleware are for Handlers: NewBatch refuses
// them; set cfg.Batch.Inbox and cfg.Batch.Middleware. MaxInFlight must be
// at least Batch.Size; its default is the larger of Concurrency ×
// DefaultInFlightPerWorker and 2 × Batch.Size, and ReceiveBatch's is
// Batch.Size.
func NewBatch(src adapters.Source, h ackwise.BatchHandler, cfg Config) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("consumer: batch handler is nil")
	}
	if cfg.Inbox != nil {
		return nil, errors.New("consumer: Config.Inbox is set: it wraps a Handler; give NewBatch a batch inbox in Config.Batch.Inbox (middleware.BatchInbox)")
	}
	if len(cfg.Middleware) > 0 {
		return nil, errors.New("consumer: Config.Middleware is set: it wraps a Handler; give NewBatch batch middleware in Config.Batch.Middleware")
	}
	b := cfg.Batch
	if err := b.validate(); err != nil {
		return nil, err
	}
	if b.Size == 0 {
		b.Size = DefaultBatchSize
	}
	if b.Linger == 0 {
		b.Linger = DefaultBatchLinger
	}
	if cfg.MaxInFlight == 0 {
		conc := cfg.Concurrency
		if conc <= 0 || conc > MaxConcurrency {
			conc = DefaultConcurrency // a bad Concurrency is refused below
		}
		cfg.MaxInFlight = min(max(conc*DefaultInFlightPerWorker, 2*b.Size), MaxInFlightMax)
	}
	if cfg.MaxInFlight > 0 && cfg.MaxInFlight < b.Size {
		return nil, fmt.Errorf("consumer: MaxInFlight = %d is below Batch.Size = %d: no batch could fill", cfg.MaxInFlight, b.Size)
	}
	if cfg.ReceiveBatch == 0 {
		cfg.ReceiveBatch = b.Size
	}
	cfg.Batch = b
	c, err := newConsumer(src, cfg)
	if err != nil {
		return nil, err
	}
	inner := h
	if len(b.Middleware) > 0 {
		inner = ackwise.ChainBatch(inner, b.Middleware...)
	}
	if b.Inbox != nil {
		inner = b.Inbox(inner)
	}
	c.bh = inner
	return c, nil
}

// batchState is what a worker keeps for its batches, reused from batch to
// batch.
type batchState struct {
	tasks  []task
	msgs   []*ackwise.Message
	errs   []error
	shared []bool // sharedFailures'
}

// runBatch runs the tasks of ch (NewBatch's consumers) in batches of up
// to Batch.Size: it readies each task, calls the batch handler once on
// those that may run, settles each by its own outcome, then acks and
// finishes them together. It returns a chunk of the next messages of their
// lanes, or nil.
func (p *pool) runBatch(ctx context.Context, w *workerState, ch *chunk) *chunk {
	c := p.c
	w.active.Store(ch)
	size := c.cfg.Batch.Size
	bs := &w.batch
	for {
		start := monotime()
		from, to := ch.claimUpTo(size)
		n := to - from
		for k := from; k < to; k++ {
			t := ch.tasks[k]
			rt, res, run := c.prepare(&t)
			if !run {
				if res != held {
					w.ran = append(w.ran, ran{t, 0, res})
				}
				continue
			}
			bs.tasks = append(bs.tasks, rt)
			bs.msgs = append(bs.msgs, rt.msg)
		}
		if len(bs.tasks) > 0 {
			p.handleBatch(ctx, w, bs)
		}
		if n > 0 {
			// Timed per message, as for a Handler: a batch whose
			// messages cost less than a hand-off each runs on the
			// receive loop (inline). Timed per batch instead, batches
			// of 64 no-op messages went to the workers and cost more
			// CPU per record (BenchmarkKafkaConsumeBatch).
			c.pace.sample(monotime()-start, n)
		}
		if n < size || ch.exhausted() {
			return p.finishRan(w, ch)
		}
		// More batches in ch (the receive loop's, inline): ack and
		// finish this one first.
		if next := p.finishRan(w, nil); next != nil {
			p.handOff(next)
		}
	}
}

// handleBatch calls the batch handler on bs and settles each of its
// messages by its own outcome; the messages of the batch that failed
// together run again one at a time first (sharedFailures, NewBatch).
func (p *pool) handleBatch(ctx context.Context, w *workerState, bs *batchState) {
	c := p.c
	n := len(bs.msgs)
	if cap(bs.errs) < n {
		bs.errs = make([]error, n, cap(bs.msgs))
	}
	errs := bs.errs[:n]
	err, elapsed := p.callBatch(ctx, w, bs.msgs, errs)
	var alone []bool // the messages run again alone, with their own run time
	if err != nil && n > 1 && ctx.Err() == nil {
		alone = sharedFailures(errs, c.cfg.Classifiers, &bs.shared)
	}
	if alone != nil {
		c.log.Warn("messages of a batch failed together; running each alone", slog.Int(ackwise.LogKeyBatch, n), slog.Any(ackwise.LogKeyError, err))
	}
	for i, t := range bs.tasks {
		el := elapsed
		if alone != nil && alone[i] {
			_, el = p.callBatch(ctx, w, bs.msgs[i:i+1], errs[i:i+1])
		}
		p.settleRan(ctx, w, t, errs[i], el)
	}
	clear(errs)
	forget(c, bs.tasks)
	forget(c, bs.msgs)
	bs.tasks, bs.msgs = bs.tasks[:0], bs.msgs[:0]
}

// settleRan settles t by its handler's err and keeps it in w.ran unless it
// is held.
func (p *pool) settleRan(ctx context.Context, w *workerState, t task, err error, elapsed time.Duration) {
	if err == nil && p.c.breaker == nil {
		w.ran = append(w.ran, ran{t, elapsed, succeeded}) // outcome's, without the call
		return
	}
	if res, el := p.c.outcome(ctx, t, err, elapsed); res != held {
		w.ran = append(w.ran, ran{t, el, res})
	}
}

// sharedFailures finds the messages of a batch that failed together: two
// or more messages whose outcome is one and the same error value, of a
// class one bad message may have caused (transient, permanent, a panic).
// That is what a handler that returned one error for the batch (or
// panicked) gives every message, and what a batch middleware passing such
// an error on (middleware.BatchInbox) gives the messages it ran; a
// rate-limit or a discard is meant for every message and is kept. It
// returns, in *shared (reused), true for each such message, or nil when
// there is none.
func sharedFailures(errs []error, classifiers []ackwise.Classifier, shared *[]bool) []bool {
	var seen map[error]int // a shared error's first message
	found := false
	for i, err := range errs {
		if err == nil || !splits(err, classifiers) || !reflect.TypeOf(err).Comparable() {
			continue
		}
		if seen == nil {
			seen = make(map[error]int, 1)
			*shared = slices.Grow((*shared)[:0], len(errs))[:len(errs)]
			clear(*shared)
		}
		first, ok := firstOf(seen, err, i)
		if !ok {
			continue
		}
		(*shared)[first], (*shared)[i], found = true, true, true
	}
	if !found {
		return nil
	}
	return *shared
}

// firstOf returns the message err was first seen for in seen, or records
// i as its first and returns false. An error of a comparable type may
// still hold a value that cannot be hashed (an interface field holding a
// slice): such an error is never shared.
func firstOf(seen map[error]int, err error, i int) (first int, ok bool) {
	defer func() {
		if recover() != nil {
			first, ok = 0, false
		}
	}()
	if first, ok = seen[err]; !ok {
		seen[err] = i
	}
	return first, ok
}

// splits says whether err, a failure several messages of a batch share,
// may be one bad message's: transient or permanent, a panic included; not
// a rate limit or a discard, which the handler means for every message.
func splits(err error, classifiers []ackwise.Classifier) bool {
	var panicked *panicError
	if errors.As(err, &panicked) {
		return true
	}
	switch ackwise.Classify(err, classifiers...).Class {
	case ackwise.ClassTransient, ackwise.ClassPermanent:
		return true
	}
	return false
}

// callBatch calls the batch handler on msgs, recovering a panic into an
// error, and fills errs (one per message) from what it returned. It
// returns that error and, when an Observer wants it, the call's run time.
func (p *pool) callBatch(ctx context.Context, w *workerState, msgs []*ackwise.Message, errs []error) (err error, elapsed time.Duration) {
	c := p.c
	var start time.Time
	if c.cfg.Observer != nil {
		start = time.Now()
	}
	prog := w.progress.Add(1) // odd: in a handler
	err = c.invokeBatch(ctx, msgs)
	for !w.progress.CompareAndSwap(prog, prog+1) {
		runtime.Gosched()
	}
	if c.cfg.Observer != nil {
		elapsed = max(time.Since(start), 1)
	}
	ackwise.BatchOutcomes(err, errs)
	return err, elapsed
}

// invokeBatch runs the batch handler pipeline, recovering a panic into an
// error.
func (c *Consumer) invokeBatch(ctx context.Context, msgs []*ackwise.Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			c.stats.panics.Add(1)
			err = &panicError{value: v, stack: string(debug.Stack())}
			c.log.Error("batch handler panicked", slog.Int(ackwise.LogKeyBatch, len(msgs)), slog.String(ackwise.LogKeyEventID, msgs[0].EventID()), slog.Any(ackwise.LogKeyPanic, v))
		}
	}()
	return c.bh.HandleBatch(ctx, msgs)
}

// gatherLocked fills batches (NewBatch's consumers): it joins the tasks
// waiting for their batch to fill (pool.pending) with all's, leaves in all
// the full batches, and keeps the rest waiting, up to Batch.Linger, for
// the next dispatch to fill their batch; with Linger -1 nothing waits.
// Called with c.mu held, by dispatch.
func (p *pool) gatherLocked(all *chunk) {
	c := p.c
	if len(p.pending) > 0 {
		// Swap the buffers: all's takes the waiting tasks first, in the
		// order they were received, and pending's is left empty.
		p.pending = append(p.pending, all.tasks...)
		forget(c, all.tasks)
		all.tasks, p.pending = p.pending, all.tasks[:0]
	}
	if c.cfg.Batch.Linger < 0 {
		return
	}
	size := c.cfg.Batch.Size
	full := len(all.tasks) / size * size
	if full == len(all.tasks) {
		return
	}
	p.pending = append(p.pending, all.tasks[full:]...)
	forget(c, all.tasks[full:])
	all.tasks = all.tasks[:full]
	if !p.lingering {
		p.lingering = true
		c.clock.AfterFunc(c.cfg.Batch.Linger, p.lingerEnded)
	}
}

// lingerEnded hands the tasks still waiting for their batch to fill to the
// workers: their linger is over.
func (p *pool) lingerEnded() {
	c := p.c
	c.mu.Lock()
	defer c.mu.Unlock()
	p.lingering = false
	p.flushPendingLocked()
}

// flushPendingLocked hands the tasks waiting for their batch to fill to the
// workers, as a batch (or, at stop, to be released by them). Called with
// c.mu held.
func (p *pool) flushPendingLocked() {
	if len(p.pending) == 0 {
		return
	}
	p.queueLocked(p.pending...)
	forget(p.c, p.pending)
	p.pending = p.pending[:0]
}

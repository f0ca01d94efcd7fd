package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// Running a message and settling it: process runs the handler pipeline on
// a task, fail classifies a failure and settles the message (retry in
// place, move to the broker's delay or the dead-letter destination, ack a
// discard), and finishLocked ends its time in flight, freeing its place
// and taking the next message of its lane.

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
	t, res, run := c.prepare(tp)
	if !run {
		return res, 0
	}
	var start time.Time
	if c.cfg.Observer != nil {
		start = time.Now()
	}
	err := c.invoke(ctx, t.msg)
	if c.cfg.Observer != nil {
		// At least 1ns: a zero elapsed tells the Observer the handler did
		// not run (a clock coarser than the run would read 0).
		elapsed = max(time.Since(start), 1)
	}
	return c.outcome(ctx, t, err, elapsed)
}

// prepare readies t's message for its handler: it returns the task to run
// and run=true, or the message's result and run=false when it must not run
// (a failed move tried again instead, a message no longer this consumer's
// or arriving as the consumer stops, a redelivery held back).
func (c *Consumer) prepare(tp *task) (t task, res result, run bool) {
	msg := tp.msg
	if tp.moves > 0 {
		return task{}, c.retryMove(*tp), false
	}
	if c.stopping.Load() || !c.src.Valid(msg) {
		c.releaseTask(*tp)
		return task{}, returned, false
	}
	if msg.BrokerID == "" && tp.sum == 0 {
		// Its identity is its content as received: a handler that changes
		// the message (against its contract: replaces its payload with a
		// decoded one, say) must not make its redelivery unrecognisable
		// after a failed settle.
		tp.sum = c.holds.sumOf(msg)
	}
	t = *tp
	if c.holds.nFailed.Load() > 0 {
		if res, ok := c.holds.holdRedelivery(t); ok {
			return task{}, res, false
		}
	}
	t.retried = false // it runs: this attempt gets an outcome of its own
	return t, 0, true
}

// outcome settles t by err, what its handler returned: a success is left
// to the caller to ack, a failure is classified and settled.
func (c *Consumer) outcome(ctx context.Context, t task, err error, elapsed time.Duration) (result, time.Duration) {
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
		c.release(t.msg)
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
		c.log.Debug("discarded", slog.String(ackwise.LogKeyEventID, msg.EventID()), slog.Any(ackwise.LogKeyError, err))
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
	c.log.Debug("retrying", slog.String(ackwise.LogKeyEventID, msg.EventID()), slog.Int(ackwise.LogKeyAttempt, msg.Attempt), slog.Duration(ackwise.LogKeyDelay, delay), slog.Any(ackwise.LogKeyError, err))
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
		c.log.Warn("dead-lettered", slog.String(ackwise.LogKeyEventID, msg.EventID()), slog.String(ackwise.LogKeyReason, string(reason)), slog.Int(ackwise.LogKeyAttempt, msg.Attempt), slog.Any(ackwise.LogKeyError, err))
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
	c.log.Error("settle failed; trying again in place", slog.String(ackwise.LogKeyOutcome, pm.o.String()), slog.String(ackwise.LogKeyEventID, msg.EventID()), slog.Int(ackwise.LogKeyTries, int(t.moves)), slog.Duration(ackwise.LogKeyRetryIn, pause), slog.Any(ackwise.LogKeyError, err))
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
			c.log.Error("settle failed; the broker will redeliver", slog.String(ackwise.LogKeyOutcome, o.String()), slog.String(ackwise.LogKeyEventID, msg.EventID()), slog.Any(ackwise.LogKeyError, err))
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
			c.log.Error("handler panicked", slog.String(ackwise.LogKeyEventID, msg.EventID()), slog.Any(ackwise.LogKeyPanic, v))
		}
	}()
	return c.h.Handle(ctx, msg)
}

// finishLocked ends t: its message was settled or released. It frees its
// in-flight slot and returns the next task of its lane, if any. The caller
// calls finishedLocked after a batch, and then, without c.mu, recycles the
// message: the engine is done with it and nothing refers to it any more
// (its lease and the breaker's probe are cleared here). Called with c.mu
// held.
func (c *Consumer) finishLocked(t *task) (task, bool) {
	c.leases.endLocked(t.msg)
	c.ages.endLocked(t.age)
	c.inflight--
	if b := c.breaker; b != nil && t.msg == b.probing {
		b.probeEndedLocked()
	}
	if t.ln == nil {
		return task{}, false
	}
	if next, age := t.ln.next(); next != nil {
		return task{msg: next, ln: t.ln, age: age}, true
	}
	return task{}, false
}

// finishedLocked wakes the receive loop and the drain after messages were
// finished. Called with c.mu held.
func (c *Consumer) finishedLocked() {
	c.signalSpace()
	if c.stopping.Load() && c.inflight == 0 {
		close(c.drained)
	}
}

// finishOne finishes t alone and returns the next task of its lane.
//
// remark says t was released behind a message of its lane that went back
// to the broker: when the lane goes idle, it is marked as returned again
// (lane.returnedAt, the identity kept). A message received while the lane
// was being released, before the broker had every release, may be
// dispatched only now; it would overtake the redelivery of the returned
// message, itself perhaps received meanwhile and released with the others.
func (c *Consumer) finishOne(t task, remark bool) (task, bool) {
	c.mu.Lock()
	next, ok := c.finishLocked(&t)
	if !ok && remark && t.ln != nil {
		t.ln.returnedAt = c.lanes.returns.Add(1)
	}
	c.finishedLocked()
	recycle := c.recycler != nil && !c.leases.holdsLocked(t.msg)
	c.mu.Unlock()
	if recycle {
		c.recycler.Recycle(t.msg)
	}
	return next, ok
}

// releaseLane releases t's message and every message behind it in its
// lane; remark as for finishOne.
func (c *Consumer) releaseLane(t task, remark bool) {
	for ok := true; ok; t, ok = c.finishOne(t, remark) {
		c.releaseTask(t)
	}
}

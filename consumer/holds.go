package consumer

import (
	"context"
	"hash/maphash"
	"math"
	"sync/atomic"
	"time"

	"github.com/ackwise/ackwise"
)

// holds keeps the messages that wait in place, in flight, their lanes held
// and their leases extended, without a worker:
//
//   - waiting: a retry in place (RetryInPlace), the held redelivery of a
//     message whose settle failed, and a failed move waiting to be tried
//     again, each on a timer that hands it back to the workers (wake);
//   - moves: what each failed move waiting in place was (Nack or
//     DeadLetter), for Consumer.retryMove;
//   - failed: the messages whose settle failed, by identity (msgID), so
//     that their redeliveries wait (holdRedelivery), 10ms doubling per
//     failure in a row up to 5s (backoffAfter).
//
// Its fields are guarded by Consumer.mu, which it shares with the rest of
// the engine: a wait ends by handing the message to the workers, and the
// drain ends every wait, under the same lock. Methods named ...Locked
// require the caller to hold c.mu; the others take it.
type holds struct {
	c       *Consumer
	waiting map[*ackwise.Message]waitEntry
	moves   map[*ackwise.Message]pendingMove
	// failed remembers the messages whose settle failed. nFailed is its
	// length, stored under mu and read without it, so that while no
	// settle fails a message costs one atomic load, not a lock and a
	// lookup.
	failed  map[msgID]failedSettle
	nFailed atomic.Int32
	swept   time.Time    // when failed was last swept (sweepLocked)
	seed    maphash.Seed // for the identity of messages without a broker ID (idOf)
}

// waitEntry is a message waiting in place: for its retry, held as the
// redelivery of a message whose settle failed (holdRedelivery), or for its
// failed move to be tried again.
type waitEntry struct {
	timer ackwise.Timer
	t     task
}

// pendingMove is a move of a message (Nack, DeadLetter) that failed and
// waits in place to be tried again (see Consumer.move).
type pendingMove struct {
	o  Outcome
	do func(ctx context.Context) error
}

// failedSettle is a message whose settle failed: failures times in a row,
// its next run not before notBefore.
type failedSettle struct {
	failures  int
	notBefore time.Time
}

// maxFailedSettles bounds holds.failed (invariant 6): when full, an
// arbitrary entry is dropped, and that message's next redelivery runs at
// once.
const maxFailedSettles = 4096

// failedSettleTTL is how long past its wait an entry of holds.failed is
// kept. A message that still fails renews its entry within 5s of its last
// run; one settled by another consumer (after a rebalance, or a competing
// consumer of a queue) never comes back here to be forgotten, and while
// entries are kept every message takes c.mu to look itself up.
const failedSettleTTL = time.Minute

// Pauses after failures in a row (backoffAfter).
const (
	firstBackoff = 10 * time.Millisecond
	maxBackoff   = 5 * time.Second
)

// backoffAfter is the pause after the nth failure in a row (n ≥ 1) of a
// settle (a move tried again in place, the redelivery of a message whose
// settle failed) or of a Receive: 10ms doubling up to 5s, no jitter (the
// pauses are of one consumer's own calls, not a crowd's). It is not
// backoff/v4's ExponentialBackOff, a stateful iterator with a clock of its
// own: the engine counts the failures already (per message, in a task or
// in holds.failed), and needs only the pause that count calls for.
func backoffAfter(n int) time.Duration {
	return min(firstBackoff<<min(max(n, 1)-1, 10), maxBackoff)
}

// msgID identifies a message across its redeliveries: its source and
// broker ID ("topic/partition@offset" on Kafka, the AMQP message-id). A
// message without a broker ID (an AMQP message published without a
// message-id) is known by its content instead: sum hashes its key, event ID
// and payload as received, before a handler could change them (task.sum),
// which every redelivery repeats (headers are left out: a
// broker may add per-delivery ones, such as RabbitMQ's x-delivery-count).
// Two such messages with the same content count as one: one may wait out
// the other's hold (5s at most), no more.
type msgID struct {
	source, brokerID string
	sum              uint64
}

// idOf returns the identity of t's message across its redeliveries.
func (h *holds) idOf(t task) msgID {
	if t.msg.BrokerID != "" {
		return msgID{source: t.msg.Source, brokerID: t.msg.BrokerID}
	}
	sum := t.sum
	if sum == 0 {
		sum = h.sumOf(t.msg)
	}
	return msgID{source: t.msg.Source, sum: sum}
}

// sumOf hashes msg's key, event ID and payload (msgID).
func (h *holds) sumOf(msg *ackwise.Message) uint64 {
	var s maphash.Hash
	s.SetSeed(h.seed)
	s.WriteString(msg.Key)
	s.WriteByte(0)
	s.WriteString(msg.ID)
	s.WriteByte(0)
	s.Write(msg.Payload)
	return s.Sum64()
}

// settleFailed remembers t's message, whose settle failed: the broker
// redelivers it at once, and run at once it would likely fail again, in a
// loop as fast as the broker redelivers, an error logged each time (on
// Kafka, a partition rewind each time). Its redeliveries wait 10ms,
// doubling with each failure in a row up to 5s (holdRedelivery). Only this
// message waits: the others go on at their pace.
func (h *holds) settleFailed(t task) {
	id := h.idOf(t)
	now := h.c.clock.Now()
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	if h.failed == nil {
		h.failed = make(map[msgID]failedSettle)
	}
	f, ok := h.failed[id]
	if !ok && len(h.failed) >= maxFailedSettles {
		for k := range h.failed {
			delete(h.failed, k)
			break
		}
	}
	f.failures++
	f.notBefore = now.Add(backoffAfter(f.failures))
	h.failed[id] = f
	h.nFailed.Store(int32(len(h.failed)))
}

// settledOK forgets the failed settles of t's message, if any: it is
// settled.
func (h *holds) settledOK(t task) {
	if h.nFailed.Load() == 0 {
		return
	}
	id := h.idOf(t)
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	delete(h.failed, id)
	h.nFailed.Store(int32(len(h.failed)))
}

// holdRedelivery holds t's message in place when it is the redelivery of a
// message whose settle failed and its delay is not over: it stays in
// flight, its lane held (its key keeps its order) and its lease extended,
// and runs when the delay is over, at the same attempt. ok is false when
// the message may run now.
func (h *holds) holdRedelivery(t task) (res result, ok bool) {
	c := h.c
	id, now := h.idOf(t), c.clock.Now()
	c.mu.Lock()
	h.sweepLocked(now)
	f, found := h.failed[id]
	c.mu.Unlock()
	if !found || !now.Before(f.notBefore) {
		return 0, false
	}
	if !h.waitInPlace(t, f.notBefore.Sub(now), false) {
		c.releaseTask(t)
		return returned, true
	}
	return held, true
}

// sweepLocked drops, at most once per failedSettleTTL, the entries of
// failed whose wait ended more than failedSettleTTL ago. Caller holds c.mu.
func (h *holds) sweepLocked(now time.Time) {
	if now.Sub(h.swept) < failedSettleTTL {
		return
	}
	h.swept = now
	for id, f := range h.failed {
		if now.Sub(f.notBefore) > failedSettleTTL {
			delete(h.failed, id)
		}
	}
	h.nFailed.Store(int32(len(h.failed)))
}

// waitInPlace schedules t's message to run again after delay. The message
// stays in flight and its lane stays held. retry says the wait is for a
// retry, which runs at the next attempt (a held redelivery runs at the
// same). It returns false when the consumer is stopping; the caller then
// releases the message.
func (h *holds) waitInPlace(t task, delay time.Duration, retry bool) bool {
	h.detach(t.msg)
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	if h.c.stopping.Load() {
		return false
	}
	h.waitLocked(t, delay, retry)
	return true
}

// waitMoveLocked is waitInPlace for a failed move pm of t's message, tried
// again after pause (Consumer.retryMove), once the caller checked that the
// consumer is not stopping and detached the message. Caller holds c.mu.
func (h *holds) waitMoveLocked(t task, pm pendingMove, pause time.Duration) {
	if h.moves == nil {
		h.moves = make(map[*ackwise.Message]pendingMove)
	}
	h.moves[t.msg] = pm
	h.waitLocked(t, pause, false)
}

// takeMove returns the failed move msg waited for, and forgets it.
func (h *holds) takeMove(msg *ackwise.Message) pendingMove {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	pm := h.moves[msg]
	delete(h.moves, msg)
	return pm
}

// waitLocked is waitInPlace once it checked that the consumer is not
// stopping and detached the message. Caller holds c.mu.
func (h *holds) waitLocked(t task, delay time.Duration, retry bool) {
	c := h.c
	if !c.src.Valid(t.msg) {
		// No longer this consumer's: a worker hands it back now. Checked
		// under c.mu, so that a wakeInvalid that ran before this wait
		// began is not missed.
		c.pool.queueLocked(t)
		return
	}
	if h.waiting == nil {
		h.waiting = make(map[*ackwise.Message]waitEntry)
	}
	h.waiting[t.msg] = waitEntry{timer: c.clock.AfterFunc(delay, func() { h.wake(t, retry) }), t: t}
}

// detach lets a message that starts waiting keep only its own memory
// (adapters.Detacher).
func (h *holds) detach(msg *ackwise.Message) {
	if d := h.c.detacher; d != nil {
		d.Detach(msg)
	}
}

// wake puts a message whose in-place wait is over back on the work queue,
// at its next attempt after a retry's wait.
func (h *holds) wake(t task, retry bool) {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	if _, ok := h.waiting[t.msg]; !ok {
		return // released by stop
	}
	delete(h.waiting, t.msg)
	if retry && t.msg.Attempt < math.MaxInt {
		// Saturating: the attempt number may come from a header (a retry
		// topic's ackwise-attempt, a delivery count), and MaxInt+1 would
		// wrap to a negative attempt, read as attempt 1.
		t.msg.Attempt++
	}
	h.c.pool.queueLocked(t)
}

// wakeInvalidLocked ends the waits of the messages that are no longer
// Valid (Consumer.wakeInvalid). Caller holds c.mu.
func (h *holds) wakeInvalidLocked() {
	for msg, w := range h.waiting {
		if !h.c.src.Valid(msg) && w.timer.Stop() {
			delete(h.waiting, msg)
			h.c.pool.queueLocked(w.t)
		}
	}
}

// stopLocked ends every wait as the drain begins: a worker releases each
// message, finishing its lane. Caller holds c.mu.
func (h *holds) stopLocked() {
	for msg, w := range h.waiting {
		if w.timer.Stop() {
			delete(h.waiting, msg)
			h.c.pool.queueLocked(w.t)
		}
	}
}

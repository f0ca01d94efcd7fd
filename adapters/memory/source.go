package memory

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// source is what queue and log sources share: the ID the history names
// them by, the destination they read, the channel that wakes a blocked
// Receive, the closed and crashed flags, the faults injected into the
// source, and the engine's hook for deliveries that stopped being Valid.
// QueueSource and GroupSource embed it.
type source struct {
	id   string
	d    *dest
	wake chan struct{}
	// group is the consumer group's name on a log, "" on a queue.
	group string
	// onCrash does what a crash means for the kind of source (a queue
	// source voids its deliveries; a group member leaves its group).
	// Called once, with d.mu held.
	onCrash func(now time.Time)
	// faults are the faults injected into this source only; guarded by
	// d.mu.
	faults []*InjectedFault
	// waiting says the source is in its destination's waiters; guarded by
	// the destination's lock.
	waiting bool
	// voided says the source is in its destination's voided list; guarded
	// by the destination's lock.
	voided bool
	hook   adapters.InvalidHook

	closed  atomic.Bool
	crashed atomic.Bool
}

func (s *source) init(id string, d *dest, group string, onCrash func(now time.Time)) {
	s.id = id
	s.d = d
	s.group = group
	s.onCrash = onCrash
	s.wake = make(chan struct{}, 1)
}

// stateErr returns the error of a closed or crashed source.
func (s *source) stateErr() error {
	if s.crashed.Load() {
		return fmt.Errorf("memory: source %s: %w", s.id, ErrCrashed)
	}
	if s.closed.Load() {
		return adapters.ErrClosed
	}
	return nil
}

// live returns ctx's error, or the error of a closed or crashed source.
func (s *source) live(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.stateErr()
}

// signal wakes the source's blocked Receive, if any, without blocking; a
// wake-up sent while none is blocked makes the next wait return at once.
func (s *source) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// waitOn adds s to waiters unless it is there already. Caller holds the
// destination's lock.
func (s *source) waitOn(waiters *[]*source) {
	if !s.waiting {
		s.waiting = true
		*waiters = append(*waiters, s)
	}
}

// unwait takes s out of waiters. Caller holds the destination's lock.
func (s *source) unwait(waiters *[]*source) {
	if !s.waiting {
		return
	}
	s.waiting = false
	w := *waiters
	for i, x := range w {
		if x == s {
			copy(w[i:], w[i+1:])
			w[len(w)-1] = nil
			*waiters = w[:len(w)-1]
			return
		}
	}
}

// wakeWaiters wakes every source of waiters and empties it. Caller holds the
// destination's lock.
func wakeWaiters(waiters *[]*source) {
	w := *waiters
	for _, s := range w {
		s.waiting = false
		s.signal()
	}
	clear(w)
	*waiters = w[:0]
}

// voidLocked notes that deliveries of s stopped being Valid: s's hook
// (adapters.Invalidator) is called once d.mu is released, by unlock. Caller
// holds d.mu, after the change Valid sees.
func (d *dest) voidLocked(s *source) {
	if !s.voided {
		s.voided = true
		d.voided = append(d.voided, s)
	}
}

// unlock releases d.mu, then calls the hooks of the sources voidLocked
// named meanwhile: a hook calls Valid and makes the engine settle, so it
// runs without the lock, as adapters.Invalidator asks.
func (d *dest) unlock() {
	if len(d.voided) == 0 {
		d.mu.Unlock()
		return
	}
	v := d.voided
	d.voided = nil
	for _, s := range v {
		s.voided = false
	}
	d.mu.Unlock()
	for _, s := range v {
		s.hook.Invalidated()
	}
}

// lockReceive does what every Receive starts with. It checks ctx, the
// source's state and the broker's availability; an empty buf ends the call
// there (ok false, err nil). Then it takes d.mu and reads the clock under
// it: a reading made before may be stale by then (the clock moved on, a
// message was published since), and a lease started from it would end
// early, or already have ended. Under the lock it checks again what may
// have changed meanwhile: the destination deleted, Close or Crash (a closed
// or crashed source must not take messages it will never settle), an
// outage begun (Outage wakes only the receivers already waiting, so one
// starting since must be seen here, or this receiver would wait instead of
// failing at once). It returns ok with d.mu held, or err with it released.
func (s *source) lockReceive(ctx context.Context, empty bool) (now time.Time, ok bool, err error) {
	d := s.d
	if err = s.live(ctx); err != nil {
		return now, false, err
	}
	if empty {
		return now, false, nil
	}
	if err = d.unavailable(d.b.clock.Now()); err != nil {
		return now, false, err
	}
	d.mu.Lock()
	now = d.b.clock.Now()
	if d.deleted {
		err = adapters.ErrClosed
	} else if err = s.stateErr(); err == nil {
		err = d.unavailable(now)
	}
	if err != nil {
		d.mu.Unlock()
		return now, false, err
	}
	return now, true, nil
}

// waitUnlock parks s among waiters, releases d.mu and blocks until a
// wake-up (a publish, a settle, a timer) or the end of ctx. Caller holds
// d.mu.
func (s *source) waitUnlock(ctx context.Context, waiters *[]*source) error {
	s.waitOn(waiters)
	s.d.mu.Unlock()
	select {
	case <-s.wake:
		return nil
	case <-ctx.Done():
		s.d.mu.Lock()
		s.unwait(waiters)
		s.d.mu.Unlock()
		return ctx.Err()
	}
}

// lockSettle does what every settle call does once it knows the delivery
// is the source's and the broker available: it takes d.mu, checks the
// source's state again and applies the settle faults of kinds. done means
// the call is over with err as its result (nil for a lost ack) and d.mu
// released; else d.mu is held.
func (s *source) lockSettle(msg *ackwise.Message, now time.Time, kinds ...FaultKind) (done bool, err error) {
	d := s.d
	d.mu.Lock()
	if err = s.stateErr(); err != nil {
		d.mu.Unlock()
		return true, err
	}
	if len(kinds) == 0 || (len(d.faults) == 0 && len(s.faults) == 0) {
		return false, nil
	}
	x := fire(msg, [2][]*InjectedFault{s.faults, d.faults}, kinds...)
	if x == nil {
		return false, nil
	}
	switch x.f.Kind {
	case FaultCrashBeforeAck, FaultCrashBeforeSettle:
		s.crashLocked(now, x.f.Kind)
		err = fmt.Errorf("memory: source %s crashed before settling %s: %w", s.id, msg.BrokerID, ErrCrashed)
	case FaultLoseAck:
		s.recordFault(x, msg, now)
	default: // FaultFailAck
		s.recordFault(x, msg, now)
		err = fmt.Errorf("memory: ack of %s: %w", msg.BrokerID, x.err())
	}
	d.unlock() // a crash voided the source's deliveries
	return true, err
}

// receipt returns msg's Handle, nil for a nil msg.
func (s *source) receipt(msg *ackwise.Message) any {
	if msg == nil {
		return nil
	}
	return msg.Handle
}

// notMine returns the error of a settle call on msg, which s did not
// deliver (or which is nil).
func (s *source) notMine(msg *ackwise.Message) error {
	if msg == nil {
		return fmt.Errorf("memory: nil message: %w", adapters.ErrReceiptInvalid)
	}
	return fmt.Errorf("memory: message %q was not delivered by source %s: %w", msg.ID, s.id, adapters.ErrReceiptInvalid)
}

// inject puts the settle or receive fault f in force on s only.
func (s *source) inject(f Fault) (*InjectedFault, error) {
	return inject(f, true, &s.d.mu, &s.faults)
}

// crash is Crash: the source fails as a consumer killed with SIGKILL.
func (s *source) crash() {
	now := s.d.b.clock.Now()
	s.d.mu.Lock()
	s.crashLocked(now, 0)
	s.d.unlock()
}

// crashLocked marks s crashed, once, records it (with the fault that
// caused it, if any) and runs onCrash. Caller holds d.mu.
func (s *source) crashLocked(now time.Time, k FaultKind) {
	if s.crashed.Swap(true) {
		return
	}
	s.d.record(Event{Kind: EventCrashed, Consumer: s.id, Group: s.group, Partition: -1, Offset: -1, Fault: k}, now)
	s.d.b.log.Debug("memory: source crashed", "member", s.id, "fault", k.String())
	s.onCrash(now)
}

// recordFault records that fault x fired on m. Caller holds d.mu.
func (s *source) recordFault(x *InjectedFault, m *ackwise.Message, now time.Time) {
	s.d.record(Event{Kind: EventFault, Consumer: s.id, Group: s.group, ID: m.ID, Key: m.Key, BrokerID: m.BrokerID, Partition: m.Partition, Offset: m.Offset, Attempt: m.Attempt, Fault: x.f.Kind}, now)
	s.d.b.log.Debug("memory: fault fired", "member", s.id, "fault", x.f.Kind.String(), ackwise.LogKeyEventID, m.ID)
}

// reorderLocked applies a reorder fault (FaultReorder) to batch: when one
// fires, the batch is returned in reverse order. Caller holds d.mu.
func (s *source) reorderLocked(batch []*ackwise.Message, now time.Time) {
	if len(batch) < 2 {
		return
	}
	if x := fireBatch(batch, [2][]*InjectedFault{s.faults, s.d.faults}); x != nil {
		s.recordFault(x, batch[0], now)
		slices.Reverse(batch)
	}
}

// inject validates f and puts it in force in list, guarded by mu (the
// destination's lock).
func inject(f Fault, forSource bool, mu *sync.Mutex, list *[]*InjectedFault) (*InjectedFault, error) {
	if err := f.validate(forSource); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	return newFault(f, mu, list), nil
}

package memory

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// source is what queue and log sources share: the ID the history names
// them by, the channel that wakes a blocked Receive, the closed and crashed
// flags, and the engine's hook for deliveries that stopped being Valid.
// QueueSource and GroupSource embed it.
type source struct {
	id   string
	wake chan struct{}
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

func (s *source) init(id string) {
	s.id = id
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

// settleFault returns the result of the settle call on msg that the settle
// fault x fired on: for a crash it calls crash first, for a lost or failed
// ack recordFault. Caller holds the destination's lock.
func (s *source) settleFault(x *InjectedFault, msg *ackwise.Message, crash func(FaultKind), recordFault func()) error {
	switch x.f.Kind {
	case FaultCrashBeforeAck, FaultCrashBeforeSettle:
		crash(x.f.Kind)
		return fmt.Errorf("memory: source %s crashed before settling %s: %w", s.id, msg.BrokerID, ErrCrashed)
	case FaultLoseAck:
		recordFault()
		return nil
	default: // FaultFailAck
		recordFault()
		return fmt.Errorf("memory: ack of %s: %w", msg.BrokerID, x.err())
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

package memory

import (
	"context"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ackwise/ackwise"
)

// VirtualStart is the time a [VirtualClock] made with a zero start shows.
var VirtualStart = time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC)

// VirtualClock is an [ackwise.Clock] whose time moves only when a test calls
// [VirtualClock.Advance], so a ten-minute backoff or a 30-second visibility
// timeout runs in microseconds. It is built on clockwork's FakeClock.
//
// Timers made with AfterFunc fire, in deadline order, during the Advance call
// that reaches their deadline; each callback runs in its own goroutine, as
// with time.AfterFunc. [VirtualClock.WaitForTimers] lets a test wait until the
// code under test has scheduled its timers ("the engine scheduled its retry")
// before advancing, and [VirtualClock.WaitForTimer] until the one timer it
// expects is armed, whatever else is pending. The broker's own wake-up
// timers are not counted there: a test waits for broker state with the
// broker's history instead (see memorytest).
//
// All methods are safe for concurrent use.
type VirtualClock struct {
	// mu is held for writing by Advance and for reading while the broker
	// converts an absolute deadline into a FakeClock duration, so the two
	// never interleave.
	mu sync.RWMutex
	fc *clockwork.FakeClock

	cmu     sync.Mutex
	pending map[*virtualTimer]struct{}
	changed chan struct{}
}

// NewVirtualClock returns a virtual clock showing start; a zero start means
// [VirtualStart].
func NewVirtualClock(start time.Time) *VirtualClock {
	if start.IsZero() {
		start = VirtualStart
	}
	return &VirtualClock{
		fc:      clockwork.NewFakeClockAt(start),
		pending: map[*virtualTimer]struct{}{},
		changed: make(chan struct{}),
	}
}

// Now returns the clock's current time.
func (c *VirtualClock) Now() time.Time { return c.fc.Now() }

// AfterFunc schedules f to run in its own goroutine once the clock has been
// advanced by d. A d of zero or less runs f at once. The timer counts as
// pending for [VirtualClock.WaitForTimers] until it fires or is stopped.
func (c *VirtualClock) AfterFunc(d time.Duration, f func()) ackwise.Timer {
	vt := &virtualTimer{c: c}
	c.mu.RLock()
	defer c.mu.RUnlock()
	vt.at = c.fc.Now().Add(d)
	if d > 0 {
		c.cmu.Lock()
		c.pending[vt] = struct{}{}
		c.notifyLocked()
		c.cmu.Unlock()
	}
	vt.t = c.fc.AfterFunc(d, func() {
		c.forget(vt)
		f()
	})
	return vt
}

// afterFuncAt schedules f for the absolute time t without counting it as
// pending; the broker uses it for its wake-ups.
func (c *VirtualClock) afterFuncAt(t time.Time, f func()) ackwise.Timer {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.fc.AfterFunc(t.Sub(c.fc.Now()), f)
}

// Advance moves the clock forward by d, firing every timer whose deadline is
// reached, in deadline order. When Advance returns the fired timers no longer
// count as pending, but their callbacks may still be running in their own
// goroutines. A d of zero or less does nothing.
func (c *VirtualClock) Advance(d time.Duration) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	c.fc.Advance(d)
	now := c.fc.Now()
	c.mu.Unlock()
	c.cmu.Lock()
	for vt := range c.pending {
		if !vt.at.After(now) {
			delete(c.pending, vt)
		}
	}
	c.notifyLocked()
	c.cmu.Unlock()
}

// Pending returns the number of AfterFunc timers that have neither fired nor
// been stopped.
func (c *VirtualClock) Pending() int {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	return len(c.pending)
}

// WaitForTimers blocks until at least n AfterFunc timers are pending or ctx
// is done, and returns ctx's error in the latter case. It waits on a
// notification, not by polling.
func (c *VirtualClock) WaitForTimers(ctx context.Context, n int) error {
	return c.waitPending(ctx, func() bool { return len(c.pending) >= n })
}

// waitPending waits until ok, called with cmu held, holds, or ctx is done.
func (c *VirtualClock) waitPending(ctx context.Context, ok func() bool) error {
	for {
		c.cmu.Lock()
		if ok() {
			c.cmu.Unlock()
			return nil
		}
		ch := c.changed
		c.cmu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// WaitForTimer blocks until an AfterFunc timer is pending that fires d or
// more after the clock's current time, or ctx is done (it then returns
// ctx's error). It waits on a notification, not by polling.
//
// It lets a test wait for the timer it expects, such as the engine's retry
// in place after ackwise.RetryAfter(err, d), without counting the other
// timers that may be pending: the engine's lease heartbeat (every third of
// a lease, armed when Run starts), a breaker probe. WaitForTimers(ctx, 1)
// would return on those at once. Then Advance(d) fires it.
func (c *VirtualClock) WaitForTimer(ctx context.Context, d time.Duration) error {
	return c.waitPending(ctx, func() bool {
		now := c.Now()
		for vt := range c.pending {
			if vt.at.Sub(now) >= d {
				return true
			}
		}
		return false
	})
}

func (c *VirtualClock) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *VirtualClock) forget(vt *virtualTimer) {
	c.cmu.Lock()
	if _, ok := c.pending[vt]; ok {
		delete(c.pending, vt)
		c.notifyLocked()
	}
	c.cmu.Unlock()
}

type virtualTimer struct {
	c  *VirtualClock
	t  clockwork.Timer
	at time.Time
}

// Stop prevents the call if it has not happened yet and reports whether it
// did so.
func (vt *virtualTimer) Stop() bool {
	// AfterFunc holds c.mu while vt.t is being set, so Stop racing with a
	// just-returned AfterFunc sees it set.
	if vt.t.Stop() {
		vt.c.forget(vt)
		return true
	}
	return false
}

// absClock is implemented by clocks that can schedule at an absolute time
// without a race against a concurrent Advance.
type absClock interface {
	afterFuncAt(t time.Time, f func()) ackwise.Timer
}

// afterAt schedules f at the absolute time t on clock.
func afterAt(clock ackwise.Clock, now, t time.Time, f func()) ackwise.Timer {
	if ac, ok := clock.(absClock); ok {
		return ac.afterFuncAt(t, f)
	}
	return clock.AfterFunc(t.Sub(now), f)
}

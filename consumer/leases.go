package consumer

import (
	"errors"
	"log/slog"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// leases is the heartbeat: it extends the leases of in-flight messages
// where the source has leases it can extend (Capabilities.ExtendLease and
// a Lease), so that a long handler, a wait in place or a message the
// breaker holds never loses its message to another consumer. Its fields
// are guarded by Consumer.mu, which it shares with the rest of the engine:
// a message's lease is set and dropped as it starts and stops being in
// flight, under the same lock. Methods named ...Locked require the caller
// to hold c.mu.
type leases struct {
	c  *Consumer
	on bool // the source has leases to extend; else at stays nil
	// at is when each in-flight message's lease was last set.
	at map[*ackwise.Message]time.Time
	// extending holds the messages loop is extending outside mu. One
	// finished meanwhile is not recycled by its finisher but by loop after
	// its round (recycle), so ExtendLease never sees a recycled message.
	extending map[*ackwise.Message]bool
	recycle   []*ackwise.Message
}

// init sets the heartbeat up for c's source.
func (l *leases) init(c *Consumer) {
	l.c = c
	l.on = c.caps.ExtendLease && c.caps.Lease > 0
	if l.on {
		l.at = make(map[*ackwise.Message]time.Time)
	}
}

// startLocked records that m's lease was set at now, as it was received.
// Caller holds c.mu.
func (l *leases) startLocked(m *ackwise.Message, now time.Time) {
	if l.on {
		l.at[m] = now
	}
}

// endLocked forgets m, which is no longer in flight. Caller holds c.mu.
func (l *leases) endLocked(m *ackwise.Message) {
	if l.on {
		delete(l.at, m)
	}
}

// holdsLocked reports whether loop is extending the lease of msg, a
// finished message, outside c.mu; if so loop recycles it after its round.
// Caller holds c.mu.
func (l *leases) holdsLocked(msg *ackwise.Message) bool {
	if !l.on || !l.extending[msg] {
		return false
	}
	l.recycle = append(l.recycle, msg)
	return true
}

// loop extends the leases of messages that have been in flight for a
// third of the lease, until quit is closed.
func (l *leases) loop(quit <-chan struct{}) {
	c := l.c
	every := c.caps.Lease / 3
	var due []*ackwise.Message
	for {
		tick := make(chan struct{})
		t := c.clock.AfterFunc(every, func() { close(tick) })
		select {
		case <-quit:
			t.Stop()
			return
		case <-tick:
		}
		now := c.clock.Now()
		due = due[:0]
		c.mu.Lock()
		for m, at := range l.at {
			if now.Sub(at) >= every {
				due = append(due, m)
				l.at[m] = now
				if c.recycler != nil {
					if l.extending == nil {
						l.extending = make(map[*ackwise.Message]bool)
					}
					l.extending[m] = true
				}
			}
		}
		c.mu.Unlock()
		for _, m := range due {
			// Not a receipt no longer valid, nor a source closed (after Run
			// returned ErrDrainTimeout, the application may close it while
			// handlers it left running hold messages): the broker
			// redelivers those messages, which is all there is to say.
			if err := c.src.ExtendLease(c.settleCtx, m, c.caps.Lease); err != nil && !errors.Is(err, adapters.ErrReceiptInvalid) && !errors.Is(err, adapters.ErrClosed) {
				c.log.Warn("lease extension failed", slog.String(ackwise.LogKeyEventID, m.EventID()), slog.Any(ackwise.LogKeyError, err))
			}
		}
		clear(due)
		if c.recycler != nil {
			c.mu.Lock()
			clear(l.extending)
			done := l.recycle
			l.recycle = nil
			c.mu.Unlock()
			if len(done) > 0 {
				c.recycler.Recycle(done...)
			}
		}
	}
}

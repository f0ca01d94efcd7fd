package consumer

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ackwise/ackwise"
)

// Defaults for zero Breaker fields.
const (
	DefaultBreakerThreshold = 10
	DefaultProbeInterval    = 5 * time.Second
	DefaultMaxProbeInterval = time.Minute
)

// Breaker tells a dependency outage from a poison message. When transient or
// rate-limited failures of Threshold different keys follow one another with
// no success between them, the dependency is taken to be down: the consumer
// stops receiving, holds the failed messages in flight without spending their
// attempts, and every ProbeInterval (doubling up to MaxProbeInterval) runs
// one held message as a probe. A probe never runs sooner than the RetryAfter
// delay of the failure that opened the breaker or of the failed probe before
// it: the dependency said when to come back. The first success closes the
// breaker, runs the held messages again and resumes receiving. A lone
// failing message never trips it, because the successes of other messages
// reset the count or its own repeats count as one key; it goes through
// retries to the dead-letter destination as usual.
//
// Held messages count against MaxInFlight and keep their leases extended
// where the broker allows. A held message that stops being Valid (a Kafka
// revoke, a dead RabbitMQ channel) is handed back, released, at once where
// the source says so (adapters.Invalidator), else when the probe reaches
// it; a breaker left holding nothing closes. The zero value means the
// documented defaults.
type Breaker struct {
	// Threshold is the number of different keys whose consecutive transient
	// failures open the breaker. Default DefaultBreakerThreshold (10).
	Threshold int
	// ProbeInterval is the wait before the first probe. Default
	// DefaultProbeInterval (5s).
	ProbeInterval time.Duration
	// MaxProbeInterval caps the doubling probe interval. Default
	// DefaultMaxProbeInterval (1m).
	MaxProbeInterval time.Duration
}

func (b *Breaker) state(c *Consumer) (*breakerState, error) {
	cfg := *b
	switch {
	case cfg.Threshold < 0:
		return nil, fmt.Errorf("consumer: Breaker.Threshold = %d: must be positive (0 means %d)", cfg.Threshold, DefaultBreakerThreshold)
	case cfg.ProbeInterval < 0:
		return nil, fmt.Errorf("consumer: Breaker.ProbeInterval = %v: must be positive", cfg.ProbeInterval)
	case cfg.MaxProbeInterval < 0:
		return nil, fmt.Errorf("consumer: Breaker.MaxProbeInterval = %v: must be positive", cfg.MaxProbeInterval)
	}
	if cfg.Threshold == 0 {
		cfg.Threshold = DefaultBreakerThreshold
	}
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = DefaultProbeInterval
	}
	if cfg.MaxProbeInterval == 0 {
		cfg.MaxProbeInterval = max(DefaultMaxProbeInterval, cfg.ProbeInterval)
	}
	if cfg.MaxProbeInterval < cfg.ProbeInterval {
		return nil, fmt.Errorf("consumer: Breaker.MaxProbeInterval = %v is below ProbeInterval = %v", cfg.MaxProbeInterval, cfg.ProbeInterval)
	}
	return &breakerState{c: c, cfg: cfg, keys: make(map[string]struct{})}, nil
}

// breakerState is the running breaker of a Consumer (Config.Breaker). Its
// fields are guarded by Consumer.mu, which it shares with the rest of the
// engine: a held message is in flight, in a lane, and is handed to the
// workers under the same lock. Methods named ...Locked require the caller
// to hold c.mu; the others take it.
type breakerState struct {
	c          *Consumer
	cfg        Breaker
	keys       map[string]struct{} // keys failing in a row since the last success
	open       bool
	held       []task
	probe      ackwise.Timer
	probeGen   uint64 // the current probe timer's; an older one that fires late does nothing
	probeDelay time.Duration
	probing    *ackwise.Message
	trips      int
	// engaged is whether a success has anything to reset: keys is not
	// empty or the breaker is open. Written under Consumer.mu; read without
	// it so that a success takes no lock while nothing is failing.
	engaged atomic.Bool
}

// stopProbe stops the probe timer. Caller holds c.mu.
func (b *breakerState) stopProbe() {
	if b.probe != nil {
		b.probe.Stop()
		b.probe = nil
	}
	b.probeGen++ // a timer that fired already does nothing
}

func breakerKey(msg *ackwise.Message) string {
	if msg.Key != "" {
		return msg.Key
	}
	if id := msg.EventID(); id != "" {
		return id
	}
	return msg.BrokerID
}

// success records a success: it resets the failure run and closes an open
// breaker, running the held messages again.
//
// A success racing with another worker's failure may see no failure yet and
// not reset it: the two have no order anyway.
func (b *breakerState) success() {
	if !b.engaged.Load() {
		return
	}
	c := b.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(b.keys) > 0 {
		clear(b.keys)
	}
	if !b.open {
		b.engaged.Store(false)
		return
	}
	b.open = false
	b.engaged.Store(false)
	b.probing = nil
	b.stopProbe()
	c.log.Info("breaker closed: dependency answered again; resuming", slog.Int(ackwise.LogKeyHeld, len(b.held)))
	c.pool.queueLocked(b.held...)
	clear(b.held)
	b.held = b.held[:0]
	c.signalSpace()
}

// failure records a transient or rate-limited failure of t's message; after
// is the delay a rate-limited failure asked for (zero for none). It returns
// true when the breaker is (now) open and the message is held.
func (b *breakerState) failure(t task, after time.Duration) bool {
	c := b.c
	c.mu.Lock()
	defer c.mu.Unlock()
	msg := t.msg
	if c.stopping.Load() {
		return false
	}
	if !b.open {
		b.engaged.Store(true)
		b.keys[breakerKey(msg)] = struct{}{}
		if len(b.keys) < b.cfg.Threshold {
			return false
		}
		b.open = true
		b.trips++
		b.probeDelay = b.cfg.ProbeInterval
		clear(b.keys)
		c.log.Warn("breaker open: many keys failing at once; pausing consumption", slog.Int(ackwise.LogKeyThreshold, b.cfg.Threshold))
	} else if msg == b.probing {
		b.probing = nil
		b.probeDelay = min(2*b.probeDelay, b.cfg.MaxProbeInterval)
	}
	c.holds.detach(msg)
	if !c.src.Valid(msg) {
		// No longer this consumer's (a Kafka revoke, a dead RabbitMQ
		// channel), perhaps since before a wakeInvalid that could not see
		// it held: a worker hands it back now, as waitLocked does.
		c.pool.queueLocked(t)
	} else {
		b.held = append(b.held, t)
	}
	if b.probing == nil {
		if len(b.held) == 0 {
			c.log.Info("breaker closed: the message it would hold is no longer this consumer's, nothing to probe with; resuming")
			b.closeIdleLocked()
		} else if b.probe == nil {
			b.scheduleProbeLocked(after)
		}
	}
	return true
}

// handBackInvalidLocked hands back the held messages that are no longer
// Valid (wakeInvalid): each goes to a worker, which releases it and the
// messages queued behind it in its lane, observed as Released, as a wait
// in place that ends on an invalid message is. Held, they would stay in
// flight until the next probe: a Kafka revoke would wait for them up to
// its RevokeTimeout, a dead RabbitMQ channel's redeliveries behind them.
// A breaker left with nothing to probe with closes (closeIdleLocked).
// Caller holds c.mu.
func (b *breakerState) handBackInvalidLocked() {
	if len(b.held) == 0 {
		return
	}
	c := b.c
	kept := b.held[:0]
	for _, t := range b.held {
		if c.src.Valid(t.msg) {
			kept = append(kept, t)
		} else {
			c.pool.queueLocked(t)
		}
	}
	if len(kept) == len(b.held) {
		return
	}
	clear(b.held[len(kept):])
	b.held = kept
	if b.open && len(b.held) == 0 && b.probing == nil {
		c.log.Info("breaker closed: its held messages are no longer this consumer's; resuming")
		b.closeIdleLocked()
	}
}

// closeIdleLocked closes the open breaker, which holds nothing to probe
// with and runs no probe: open, it would pause consumption for good.
// Receiving resumes; a dependency still down opens it again. Caller holds
// c.mu.
func (b *breakerState) closeIdleLocked() {
	b.open = false
	b.engaged.Store(len(b.keys) > 0)
	b.stopProbe()
	b.c.signalSpace()
}

// probeEndedLocked is called when the probe message finished without
// telling whether the dependency is back: it was dead-lettered, discarded,
// released, or its move failed and waits in place. Probe again with the
// next held message, or close the breaker when nothing is held any more.
// Caller holds c.mu.
func (b *breakerState) probeEndedLocked() {
	b.probing = nil
	if !b.open {
		return
	}
	if len(b.held) > 0 && !b.c.stopping.Load() {
		if b.probe == nil {
			b.scheduleProbeLocked(0)
		}
		return
	}
	b.closeIdleLocked()
}

// scheduleProbeLocked starts the probe timer: after the probe delay, or
// after, the RetryAfter delay of the failure that armed it, when longer.
// Caller holds c.mu.
func (b *breakerState) scheduleProbeLocked(after time.Duration) {
	b.probeGen++
	gen := b.probeGen
	b.probe = b.c.clock.AfterFunc(max(b.probeDelay, after), func() { b.runProbe(gen) })
}

// runProbe runs one held message to test the dependency, when gen is the
// current probe timer's. A timer stopped too late (it fired, and waited for
// c.mu while the breaker closed and opened again) must neither start a
// second probe beside the current timer's nor drop that timer.
func (b *breakerState) runProbe(gen uint64) {
	c := b.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != b.probeGen {
		return
	}
	b.probe = nil
	if !b.open || c.stopping.Load() || len(b.held) == 0 || b.probing != nil {
		return
	}
	// Held messages that stopped being this consumer's without the source
	// telling (no Invalidator: an SQS lease that ran out during the outage)
	// go back now, all at once, instead of one a probe interval; with none
	// left the breaker closes.
	b.handBackInvalidLocked()
	if len(b.held) == 0 {
		return
	}
	t := b.held[0]
	b.held = b.held[1:]
	b.probing = t.msg
	c.pool.queueLocked(t)
}

// stopLocked ends the breaker's part in a Run that stops: the probe timer
// stops, the held messages go to the workers, which release them, and the
// next Run starts with the breaker closed. Caller holds c.mu.
func (b *breakerState) stopLocked() {
	b.stopProbe()
	b.c.pool.queueLocked(b.held...)
	b.held = nil
	b.open, b.probing = false, nil
	clear(b.keys)
	b.engaged.Store(false)
}

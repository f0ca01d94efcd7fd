package consumer

import (
	"sync/atomic"
	"time"
)

// Pace thresholds on the average run time of a message, with hysteresis.
// Samples are capped at sampleCap, so that one outlier (a preempted worker,
// a lone slow message) does not make the pace slow; two in a row do.
const (
	inlineBelow = 500 * time.Nanosecond
	inlineAbove = time.Microsecond
	fastBelow   = 10 * time.Microsecond
	slowAbove   = 20 * time.Microsecond
	sampleCap   = 100 * time.Microsecond
)

// pace tells how long a message takes to run and picks the hand-off.
type pace struct {
	avg   atomic.Int64 // moving average of a message's run time, ns
	mode  atomic.Int32
	fixed bool // the mode is pinned (tests); set before Run
}

const (
	modeSingle int32 = iota
	modeBatch
	modeInline
)

// reset starts single: a slow handler is never batched before it was timed.
func (p *pace) reset() {
	if p.fixed {
		return
	}
	p.avg.Store(int64(slowAbove))
	p.mode.Store(modeSingle)
}

// sample records that n messages ran in d. Concurrent samples may overwrite
// one another: the average only needs to be roughly right.
func (p *pace) sample(d time.Duration, n int) {
	if p.fixed {
		return
	}
	per := min(d/time.Duration(n), sampleCap)
	avg := time.Duration(p.avg.Load())
	avg += (per - avg) / 8
	p.avg.Store(int64(avg))
	m := p.mode.Load()
	next := m
	switch {
	case avg > slowAbove:
		next = modeSingle
	case avg < inlineBelow:
		next = modeInline
	case m == modeInline && avg > inlineAbove, m == modeSingle && avg < fastBelow:
		next = modeBatch
	}
	if next != m {
		p.mode.Store(next)
	}
}

// slow switches to single mode at once, as if a slow message was measured.
func (p *pace) slow() {
	if p.fixed {
		return
	}
	p.avg.Store(int64(slowAbove))
	p.mode.Store(modeSingle)
}

// epoch anchors monotime.
var epoch = time.Now()

// monotime reads the monotonic clock only (time.Now reads the wall clock
// too).
func monotime() time.Duration { return time.Since(epoch) }

package ackwise

import "time"

// Clock is the time source of the engine and the in-memory broker. Tests
// replace it with a virtual clock (adapters/memory.VirtualClock) so that a
// ten-minute backoff runs in milliseconds. Implementations must be safe for
// concurrent use.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending call scheduled with [Clock.AfterFunc].
type Timer interface {
	// Stop prevents the call if it has not happened yet and reports whether it
	// did so.
	Stop() bool
}

// SystemClock is the real clock.
var SystemClock Clock = systemClock{}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

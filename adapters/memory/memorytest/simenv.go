package memorytest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
)

// Errors SimEnv returns for injected faults. They carry no class mark, so
// the engine's rules make them transient: retried with backoff.
var (
	// ErrSimOutage is returned by SimEnv.Call during a dependency outage
	// window (SimOutage); the dependency is not called.
	ErrSimOutage = errors.New("memorytest: dependency unavailable (simulated outage)")
	// ErrSimLostReply is returned by SimEnv.Call after the dependency did
	// its work (SimLostReply).
	ErrSimLostReply = errors.New("memorytest: dependency reply lost (simulated timeout)")
	// ErrSimPublishFailed is returned by SimEnv.Publish (SimPublishFailure).
	ErrSimPublishFailed = errors.New("memorytest: publish failed (simulated)")
)

// SimEnv is what a simulated seed gives the user's Init, Setup and Check:
// the virtual clock, the dependency and publish wrappers the simulation
// injects faults into, and the outcome of each message. Its methods are
// safe for concurrent use by the handlers of several workers.
type SimEnv struct {
	c *core
}

// Seed returns the seed being run.
func (e *SimEnv) Seed() uint64 { return e.c.seed }

// Clock returns the seed's virtual clock, which starts at
// memory.VirtualStart. Timers made with its AfterFunc belong to the
// consumer process: their callbacks run in the simulation's loop, between
// handler calls, and a crash cancels them (work a handler defers to a timer
// is lost with the process, as it would be).
func (e *SimEnv) Clock() ackwise.Clock { return simClock{e.c} }

// Call calls the user's dependency f under the simulation's faults: during
// an outage window (SimOutage) it returns ErrSimOutage without calling
// f; with SimLostReply it calls f and returns ErrSimLostReply. The
// timeline shows name. Wrap each call to a dependency a handler makes
// (a payment API, a database outside the inbox transaction) in Call.
// Pass the handler's ctx (or one derived from it): the faults that fire
// at a call (SimLostReply, SimCrashInHandler) know the delivery from
// it, and a call from a timer gets only outages. With
// SimCrashInHandler, Call panics after f returns: let the panic unwind
// the handler.
func (e *SimEnv) Call(ctx context.Context, name string, f func() error) error {
	c := e.c
	d, _ := ctx.Value(deliveryKey{}).(*delivery)
	c.mu.Lock()
	for _, o := range c.outages {
		if c.now >= o[0] && c.now < o[1] {
			c.eventOf(d, "call "+name, "failed: outage")
			c.mu.Unlock()
			return fmt.Errorf("%s: %w", name, ErrSimOutage)
		}
	}
	lost := false
	if d != nil {
		d.calls++
		_, lost = c.fault(SimLostReply, d.s, d.n, d.calls)
	}
	c.mu.Unlock()
	err := f()
	c.crashPoint(d, "call "+name)
	if err == nil && lost {
		c.mu.Lock()
		c.eventOf(d, "fault: lost-reply", "call "+name+" did its work, its reply is lost")
		c.mu.Unlock()
		return fmt.Errorf("%s: %w", name, ErrSimLostReply)
	}
	return err
}

// simCrash is the panic that unwinds a handler whose process dies inside
// it (SimCrashInHandler).
type simCrash struct{}

// crashPoint kills the process inside d's handler, after what, when
// SimCrashInHandler fires there: it panics with simCrash.
func (c *core) crashPoint(d *delivery, what string) {
	if d == nil {
		return
	}
	c.mu.Lock()
	_, ok := c.fault(SimCrashInHandler, d.s, d.n, d.calls)
	if ok {
		d.crashed = true
		c.eventOf(d, "fault: crash-in-handler", "the process dies right after "+what)
	}
	c.mu.Unlock()
	if ok {
		panic(simCrash{})
	}
}

// Publish stores msgs as published by the handler (see Published), under
// SimPublishFailure: it may fail with ErrSimPublishFailed before storing
// them or after (a lost confirmation), and under SimCrashInHandler (it
// panics after storing, as Call does). What it stores survives crashes.
// Pass the handler's ctx, as to Call.
func (e *SimEnv) Publish(ctx context.Context, msgs ...*ackwise.Message) error {
	c := e.c
	d, _ := ctx.Value(deliveryKey{}).(*delivery)
	err := c.publish(d, msgs)
	c.crashPoint(d, "a publish")
	return err
}

func (c *core) publish(d *delivery, msgs []*ackwise.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var f SimFault
	failed := false
	if d != nil {
		d.calls++
		f, failed = c.fault(SimPublishFailure, d.s, d.n, d.calls)
	}
	if !failed || f.Stored {
		for _, m := range msgs {
			cp := *m
			cp.Headers = m.Headers.Clone()
			cp.Payload = append([]byte(nil), m.Payload...)
			c.published = append(c.published, &cp)
		}
	}
	if failed {
		what := "not stored"
		if f.Stored {
			what = "stored, confirmation lost"
		}
		c.eventOf(d, "fault: publish-failure", fmt.Sprintf("%d message(s) %s", len(msgs), what))
		return ErrSimPublishFailed
	}
	c.eventOf(d, "published", fmt.Sprintf("%d message(s)", len(msgs)))
	return nil
}

// Published returns the messages handlers published through Publish, in
// order.
func (e *SimEnv) Published() []*ackwise.Message {
	e.c.mu.Lock()
	defer e.c.mu.Unlock()
	return append([]*ackwise.Message(nil), e.c.published...)
}

// Logf adds a note to the timeline, for the user's handler or check. It
// takes the delivery from ctx when there is one.
func (e *SimEnv) Logf(ctx context.Context, format string, args ...any) {
	c := e.c
	d, _ := ctx.Value(deliveryKey{}).(*delivery)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.eventOf(d, "note", fmt.Sprintf(format, args...))
}

// SimOutcome is how the broker last settled a message.
type SimOutcome int

const (
	// SimPending: not settled (only seen while the seed runs).
	SimPending SimOutcome = iota
	// SimAcked: the handler returned nil and the ack took.
	SimAcked
	// SimDiscarded: the handler returned an ackwise.Discard error.
	SimDiscarded
	// SimDeadLettered: permanent, or its attempts were used up.
	SimDeadLettered
)

func (o SimOutcome) String() string {
	switch o {
	case SimPending:
		return "pending"
	case SimAcked:
		return "acked"
	case SimDiscarded:
		return "discarded"
	case SimDeadLettered:
		return "dead-lettered"
	}
	return fmt.Sprintf("SimOutcome(%d)", int(o))
}

// SimMessage is a workload message and what became of it.
type SimMessage struct {
	ID  string
	Key string
	// Message is the message as published (do not change it).
	Message *ackwise.Message
	Outcome SimOutcome
	// Deliveries counts the handler calls with it, duplicates included.
	Deliveries int
	// Succeeded counts the calls that returned nil.
	Succeeded int
}

// Messages returns the workload's messages in publish order, with their
// outcomes.
func (e *SimEnv) Messages() []SimMessage {
	c := e.c
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]SimMessage, len(c.msgs))
	for i, s := range c.msgs {
		out[i] = SimMessage{ID: s.m.ID, Key: s.m.Key, Message: s.m, Outcome: SimOutcome(s.state), Deliveries: s.deliveries, Succeeded: s.handled}
	}
	return out
}

// eventOf logs an event of delivery d (nil: a process event). Caller
// holds c.mu.
func (c *core) eventOf(d *delivery, what, detail string) {
	if d == nil {
		c.event(nil, nil, what, detail)
		return
	}
	saved := c.now
	c.now = d.start
	c.event(d.s, d, what, detail)
	c.now = saved
}

// simClock is the virtual clock of a seed: time moves when the loop moves
// it; timers are the process's.
type simClock struct{ c *core }

func (k simClock) Now() time.Time {
	k.c.mu.Lock()
	defer k.c.mu.Unlock()
	return memory.VirtualStart.Add(k.c.now)
}

func (k simClock) AfterFunc(d time.Duration, f func()) ackwise.Timer {
	c := k.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timerSeq++
	tm := &simTimer{at: c.now + max(d, 0), seq: c.timerSeq, proc: c.proc, f: f}
	c.timers = append(c.timers, tm)
	return simTimerHandle{c, tm}
}

type simTimerHandle struct {
	c  *core
	tm *simTimer
}

func (h simTimerHandle) Stop() bool {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	if h.tm.stopped {
		return false
	}
	for _, x := range h.c.timers {
		if x == h.tm {
			h.tm.stopped = true
			return true
		}
	}
	return false
}

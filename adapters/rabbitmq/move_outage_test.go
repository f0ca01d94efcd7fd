package rabbitmq

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

// The engine tries a failed move (Nack, DeadLetter) of a message still
// this consumer's again in place: the tests below check it on the real
// broker, with the destination queue deleted for a while.

// movesSeen wraps a Source and sends the result of each Nack and
// DeadLetter the engine makes.
type movesSeen struct {
	*Source
	errs chan error
}

func (s movesSeen) Nack(ctx context.Context, m *ackwise.Message, d time.Duration) error {
	err := s.Source.Nack(ctx, m, d)
	s.errs <- err
	return err
}

func (s movesSeen) DeadLetter(ctx context.Context, m *ackwise.Message, env dlq.Envelope) error {
	err := s.Source.DeadLetter(ctx, m, env)
	s.errs <- err
	return err
}

// seenOutcome is an outcome and whether its message was still valid then.
type seenOutcome struct {
	o     consumer.Outcome
	valid bool
}

// validLog is a consumer.Observer that sends each outcome with the
// message's validity at that moment.
type validLog struct {
	src *Source
	ch  chan seenOutcome
}

func (l validLog) Observe(m *ackwise.Message, o consumer.Outcome, _ time.Duration) {
	l.ch <- seenOutcome{o, l.src.Valid(m)}
}

func (l validLog) next(t *testing.T) seenOutcome {
	t.Helper()
	select {
	case s := <-l.ch:
		return s
	case <-time.After(testTimeout):
		t.Fatal("no outcome")
		return seenOutcome{}
	}
}

// awaitFailedTries waits for n failed tries of the move in place, each with
// the message still valid, each failing with ErrUnroutable.
func awaitFailedTries(t *testing.T, log validLog, errs chan error, n int) {
	t.Helper()
	awaitFailedTriesWith(t, log, errs, n, ErrUnroutable)
}

// awaitFailedTriesWith is awaitFailedTries with each try failing with want.
func awaitFailedTriesWith(t *testing.T, log validLog, errs chan error, n int, want error) {
	t.Helper()
	for i := range n {
		if s := log.next(t); s.o != consumer.SettleFailed || !s.valid {
			t.Fatalf("try %d: outcome %v (valid %v), want settle-failed with the delivery still valid", i+1, s.o, s.valid)
		}
		if err := <-errs; !errors.Is(err, want) {
			t.Fatalf("try %d: move failed with %v, want %v", i+1, err, want)
		}
	}
}

// runEngine runs the engine on src until stop, which returns Run's error
// and how long Run took to return once asked to stop.
func runEngine(t *testing.T, src *movesSeen, h ackwise.Handler, cfg consumer.Config) (stop func() (error, time.Duration)) {
	t.Helper()
	cons, err := consumer.New(src, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	var stopped bool
	var runErr error
	var took time.Duration
	stop = func() (error, time.Duration) {
		if !stopped {
			stopped = true
			start := time.Now()
			cancel()
			runErr = <-done
			took = time.Since(start)
		}
		return runErr, took
	}
	t.Cleanup(func() { _, _ = stop() })
	return stop
}

func deleteQueue(t *testing.T, c *amqp.Connection, queue string) {
	t.Helper()
	if err := withChannel(c, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(queue, false, false, false)
		return err
	}); err != nil {
		t.Fatalf("delete %s: %v", queue, err)
	}
}

// moveOutage publishes one message, opens a source and deletes queue (a
// queue of the source's topology) under it.
func moveOutage(t *testing.T, tiers ...time.Duration) (*amqp.Connection, Config, validated, *movesSeen, validLog) {
	t.Helper()
	return moveOutageOf(t, testConfig(t, Classic, tiers...))
}

// moveOutageOf is moveOutage on cfg.
func moveOutageOf(t *testing.T, cfg Config) (*amqp.Connection, Config, validated, *movesSeen, validLog) {
	t.Helper()
	c := needBroker(t)
	declare(t, cfg)
	v, err := cfg.validate()
	if err != nil {
		t.Fatal(err)
	}
	sink := newSink(t, SinkConfig{URL: testURL(), RoutingKey: cfg.Queue})
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "m", Key: "k", Payload: []byte("m")}); err != nil {
		t.Fatal(err)
	}
	src := &movesSeen{Source: newSource(t, cfg), errs: make(chan error, 64)}
	return c, cfg, v, src, validLog{src.Source, make(chan seenOutcome, 64)}
}

// failPermanently is a handler whose every run fails permanently, counted
// in runs.
func failPermanently(runs *atomic.Int32) ackwise.Handler {
	return ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		runs.Add(1)
		return ackwise.Permanent(errors.New("bad payload"))
	})
}

// TestDeadLetterQueueGoneWaitsInPlace: the dead-letter queue is deleted
// under a consumer whose message fails permanently. Each dead letter is
// returned unroutable; the message stays in flight (valid, not requeued),
// its handler run once; once the queue is declared again the dead letter
// is written once and the original acked.
func TestDeadLetterQueueGoneWaitsInPlace(t *testing.T) {
	t.Parallel()
	c, cfg, v, src, log := moveOutage(t)
	deleteQueue(t, c, v.DeadLetterQueue)
	var runs atomic.Int32
	h := failPermanently(&runs)
	stop := runEngine(t, src, h, consumer.Config{Observer: log})

	awaitFailedTries(t, log, src.errs, 3)
	if n := queueDepth(t, c, cfg.Queue); n != 0 || runs.Load() != 1 {
		t.Fatalf("while the dead letter fails: %d ready in the work queue, %d handler runs; want 0 (held, not requeued) and 1", n, runs.Load())
	}
	declare(t, cfg)
	requireDeadLetteredOnce(t, c, cfg, v, src, log, stop, &runs)
}

// requireDeadLetteredOnce waits, once the dead-letter queue can take the
// dead letter, for the move to go through (each try before it failed in
// place, the delivery valid), stops the engine and closes src, then checks
// that the handler ran once, the original was acked and the dead-letter
// queue holds the one dead letter of moveOutage's message.
func requireDeadLetteredOnce(t *testing.T, c *amqp.Connection, cfg Config, v validated, src *movesSeen, log validLog, stop func() (error, time.Duration), runs *atomic.Int32) {
	t.Helper()
	for s := log.next(t); s.o != consumer.DeadLettered; s = log.next(t) {
		if s.o != consumer.SettleFailed || !s.valid {
			t.Fatalf("outcome %v (valid %v) before the dead letter was written", s.o, s.valid)
		}
	}
	if err, _ := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	src.Close()
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times, want once", runs.Load())
	}
	if n := queueDepth(t, c, cfg.Queue); n != 0 {
		t.Errorf("%d messages back in the work queue after Close: the original was not acked", n)
	}
	dls := getAll(t, c, v.DeadLetterQueue)
	if len(dls) != 1 || dls[0].Headers[ackwise.HeaderEventID] != "m" || string(dls[0].Body) != "m" {
		t.Fatalf("dead-letter queue holds %d messages (%v), want the one dead letter", len(dls), dls)
	}
}

// TestWaitQueueGoneWaitsInPlace: the same for a Nack to a deleted wait
// queue (RetryBroker): the copy is moved once the wait queue is back, and
// the message comes back from it for its second (and last) run.
func TestWaitQueueGoneWaitsInPlace(t *testing.T) {
	t.Parallel()
	c, cfg, v, src, log := moveOutage(t, 50*time.Millisecond)
	deleteQueue(t, c, v.waitQueues[0])
	var runs atomic.Int32
	attempts := make(chan int, 4)
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		attempts <- m.Attempt
		if runs.Add(1) == 1 {
			return errors.New("dependency down")
		}
		return nil
	})
	stop := runEngine(t, src, h, consumer.Config{Observer: log, RetryMode: consumer.RetryBroker})

	awaitFailedTries(t, log, src.errs, 3)
	if n := queueDepth(t, c, cfg.Queue); n != 0 || runs.Load() != 1 {
		t.Fatalf("while the nack fails: %d ready in the work queue, %d handler runs; want 0 (held, not requeued) and 1", n, runs.Load())
	}
	declare(t, cfg)
	for s := log.next(t); s.o != consumer.Retried; s = log.next(t) {
		if s.o != consumer.SettleFailed || !s.valid {
			t.Fatalf("outcome %v (valid %v) before the nack was made", s.o, s.valid)
		}
	}
	if s := log.next(t); s.o != consumer.Acked {
		t.Fatalf("outcome %v after the retry, want acked", s.o)
	}
	if err, _ := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	src.Close()
	if a1, a2 := <-attempts, <-attempts; a1 != 1 || a2 != 2 || runs.Load() != 2 {
		t.Errorf("handler ran %d times (attempts %d, %d), want twice: attempt 1, then its copy's attempt 2", runs.Load(), a1, a2)
	}
	for _, q := range []string{cfg.Queue, v.waitQueues[0]} {
		if n := queueDepth(t, c, q); n != 0 {
			t.Errorf("%s holds %d messages after Close, want none (no second copy, the original acked)", q, n)
		}
	}
}

// TestMoveWaitEndsWithItsChannel: the consuming channel dies while the
// dead letter waits to be tried again: the broker requeues the message, and
// the engine lets go of it at once (the source tells it the channel died),
// not at the move's next try; the next delivery of it runs and is
// dead-lettered, once. The engine's clock is virtual and stands still: the
// move's next try never comes, so only the source's news can end the wait.
func TestMoveWaitEndsWithItsChannel(t *testing.T) {
	t.Parallel()
	c, cfg, v, src, log := moveOutage(t)
	deleteQueue(t, c, v.DeadLetterQueue)
	var runs atomic.Int32
	h := failPermanently(&runs)
	stop := runEngine(t, src, h, consumer.Config{Observer: log, Clock: memory.NewVirtualClock(time.Time{})})

	awaitFailedTries(t, log, src.errs, 1) // the next try waits on the virtual clock
	if closeConnections(t, cfg.ConnectionName) == 0 {
		t.Fatal("no connection closed")
	}
	// The source cannot consume again while the dead-letter queue is
	// missing (it checks its topology on each connection): the requeued
	// message waits in the work queue.
	waitFor(t, "the message requeued", func() bool { return queueDepth(t, c, cfg.Queue) == 1 })
	declare(t, cfg)
	// Had the engine held the void delivery until its move's next try, the
	// redelivery would have waited behind it in its key's lane and gone
	// back unrun with it (Released): one more delivery.
	for s := log.next(t); s.o != consumer.DeadLettered; s = log.next(t) {
		if s.o != consumer.SettleFailed {
			t.Fatalf("outcome %v before the dead letter was written", s.o)
		}
	}
	if err, _ := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	src.Close()
	if runs.Load() != 2 {
		t.Errorf("handler ran %d times, want twice (once per delivery)", runs.Load())
	}
	if n := queueDepth(t, c, cfg.Queue); n != 0 {
		t.Errorf("%d messages back in the work queue after Close", n)
	}
	if dls := getAll(t, c, v.DeadLetterQueue); len(dls) != 1 {
		t.Fatalf("dead-letter queue holds %d messages, want 1", len(dls))
	}
}

// TestStopWhileMoveWaits: Run is stopped while a dead letter waits to be
// tried again: Run returns without waiting for it, the message is handed
// back unsettled and the next consumer gets it. The engine's clock is
// virtual and stands still: a Run waiting for the move's next try would
// not return at all (the test fails at testTimeout, then lets the clock
// move so that Run ends).
func TestStopWhileMoveWaits(t *testing.T) {
	t.Parallel()
	c, cfg, v, src, log := moveOutage(t)
	deleteQueue(t, c, v.DeadLetterQueue)
	h := failPermanently(new(atomic.Int32))
	clock := memory.NewVirtualClock(time.Time{})
	stop := runEngine(t, src, h, consumer.Config{Observer: log, DrainTimeout: time.Minute, Clock: clock})

	awaitFailedTries(t, log, src.errs, 1) // the next try waits on the virtual clock
	stopped := make(chan error, 1)
	go func() {
		err, _ := stop()
		stopped <- err
	}()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(testTimeout):
		clock.Advance(time.Hour)
		<-stopped
		t.Fatalf("Run did not return within %v: it waited for the move's next try", testTimeout)
	}
	src.Close()
	select {
	case s := <-log.ch:
		t.Errorf("outcome %v observed after the last failed try", s.o)
	default:
	}
	got := getAll(t, c, cfg.Queue)
	if len(got) != 1 || got[0].Headers[ackwise.HeaderEventID] != "m" || !got[0].Redelivered {
		t.Fatalf("work queue holds %v, want the message handed back (redelivered)", got)
	}
}

// TestMoveWaitEndsAtConsumerTimeoutWarn: a delivery held past
// ConsumerTimeoutWarn is no longer Valid, so a failed move waiting in place
// is handed back (a new delivery comes) before the broker's consumer_timeout
// would take back every delivery of the channel: as the warning is given
// (adapters.Invalidator), not at the move's next try.
//
// The engine runs on a virtual clock that stands still until the
// dead-letter queue is back: the failed move's next try never comes by
// itself, so a hand-back can only come from the source's warning (on the
// wall clock). Had the engine waited for the try, the handler would not run
// again (the test fails at testTimeout). The hand-back must not come before
// the warning either: the handler's second run comes at least warn after the
// first delivery arrived, whatever the load. The message is published once
// the engine runs, so that the first try (with the delivery valid) comes
// well within warn.
func TestMoveWaitEndsAtConsumerTimeoutWarn(t *testing.T) {
	t.Parallel()
	const warn = 1500 * time.Millisecond
	cfg := testConfig(t, Classic)
	cfg.ConsumerTimeout, cfg.ConsumerTimeoutWarn = time.Minute, warn
	c := needBroker(t)
	declare(t, cfg)
	v, err := cfg.validate()
	if err != nil {
		t.Fatal(err)
	}
	src := &movesSeen{Source: newSource(t, cfg), errs: make(chan error, 64)}
	log := validLog{src.Source, make(chan seenOutcome, 64)}
	deleteQueue(t, c, v.DeadLetterQueue)
	var runs atomic.Int32
	type run struct{ at, arrived time.Time }
	ran := make(chan run, 64)
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		runs.Add(1)
		ran <- run{time.Now(), m.Handle.(*receipt).at}
		return ackwise.Permanent(errors.New("bad payload"))
	})
	clock := memory.NewVirtualClock(time.Time{})
	stop := runEngine(t, src, h, consumer.Config{Observer: log, Clock: clock})
	sink := newSink(t, SinkConfig{URL: testURL(), RoutingKey: cfg.Queue})
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "m", Key: "k", Payload: []byte("m")}); err != nil {
		t.Fatal(err)
	}
	next := func(what string) run {
		t.Helper()
		select {
		case r := <-ran:
			return r
		case <-time.After(testTimeout):
			t.Fatalf("no %s", what)
			return run{}
		}
	}
	first := next("handler run")
	// The dead letter failed, the delivery valid: its next try waits on
	// the virtual clock.
	awaitFailedTries(t, log, src.errs, 1)
	again := next("hand-back at the warning: the failed move waited for its next try")
	if held := again.at.Sub(first.arrived); held < warn {
		t.Fatalf("handed back %v after the delivery arrived: before ConsumerTimeoutWarn (%v)", held, warn)
	}
	// From here on a later try of the dead letter goes through: the
	// virtual clock moves on whenever a try waits for it.
	declare(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	advanced := make(chan struct{})
	go func() {
		defer close(advanced)
		for clock.WaitForTimers(ctx, 1) == nil {
			clock.Advance(time.Minute)
		}
	}()
	defer func() { cancel(); <-advanced }()
	// Failed tries before the queue was back; and a redelivery that came
	// while the hand-back was still being recorded is released unrun
	// behind it in its key's lane (Released), the next one runs.
	for s := log.next(t); s.o != consumer.DeadLettered; s = log.next(t) {
		if s.o != consumer.SettleFailed && s.o != consumer.Released {
			t.Fatalf("outcome %v before the dead letter was written", s.o)
		}
	}
	if err, _ := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if runs.Load() < 2 {
		t.Fatalf("handler ran %d times: want the redelivery run after the hand-back", runs.Load())
	}
	if dls := getAll(t, c, v.DeadLetterQueue); len(dls) != 1 {
		t.Fatalf("dead-letter queue holds %d messages, want 1", len(dls))
	}
}

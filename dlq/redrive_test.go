package dlq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/dlq"
)

// quick keeps runs short: the idle timeout is the normal end of every run.
const quick = 100 * time.Millisecond

type testBundle struct {
	b     *memory.Broker
	clk   *memory.VirtualClock
	work  string // the queue the consumer reads and the redrive target
	dead  string // its dead-letter queue
	from  *memory.QueueSource
	to    *memory.Sink
	sent  map[string]*ackwise.Message // originals by event ID
	order []string
}

// setup returns a work queue and its dead-letter queue on a broker of the
// test's own, with a source on the dead-letter queue and a sink on the work
// queue.
func setup(t *testing.T) *testBundle {
	t.Helper()
	b, clk := memorytest.NewBroker(t)
	work := memorytest.UniqueName(t)
	if err := b.CreateQueue(work, memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	tb := &testBundle{b: b, clk: clk, work: work, dead: work + memory.DeadLetterSuffix, sent: map[string]*ackwise.Message{}}
	if err := b.CreateQueue(tb.dead, memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	var err error
	if tb.from, err = b.QueueSource(tb.dead); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.from.Close() })
	if tb.to, err = b.Sink(work); err != nil {
		t.Fatal(err)
	}
	return tb
}

// deadLetter publishes msgs into the work queue and dead-letters each of
// them the way the engine does (the source's DeadLetter), with reason.
func (tb *testBundle) deadLetter(t *testing.T, reason dlq.Reason, msgs ...*ackwise.Message) {
	t.Helper()
	for _, m := range msgs {
		tb.sent[m.ID] = m
		tb.order = append(tb.order, m.ID)
	}
	memorytest.Publish(t, tb.b, tb.work, msgs...)
	src, err := tb.b.QueueSource(tb.work)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for _, d := range memorytest.Receive(t, src, len(msgs)) {
		env := dlq.New(d, reason, fmt.Errorf("handler: %s failed", d.ID), ackwise.ClassPermanent, tb.clk.Now(), "billing", "v1")
		if err := src.DeadLetter(context.Background(), d, env); err != nil {
			t.Fatal(err)
		}
	}
}

// message returns an original message with a binary payload and headers.
func message(id string) *ackwise.Message {
	return &ackwise.Message{
		ID:      id,
		Key:     "key-" + id,
		Payload: []byte{0x00, 0xff, '\n', 0xc3, 0x28, byte(len(id))},
		Headers: ackwise.HeadersOf("x-tenant", "acme", ackwise.HeaderTraceparent, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
	}
}

func messages(prefix string, n int) []*ackwise.Message {
	out := make([]*ackwise.Message, n)
	for i := range out {
		out[i] = message(fmt.Sprintf("%s%d", prefix, i))
	}
	return out
}

func (tb *testBundle) stats(t *testing.T, name string) memory.Stats {
	t.Helper()
	st, err := tb.b.Stats(name)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (tb *testBundle) ids(t *testing.T, name string) []string {
	t.Helper()
	msgs, err := tb.b.Messages(name)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return ids
}

// requireHeld fails unless the dead-letter queue holds exactly ids, none of
// them in flight (every held message was released).
func (tb *testBundle) requireHeld(t *testing.T, ids ...string) {
	t.Helper()
	if got := tb.ids(t, tb.dead); !equalSets(got, ids) {
		t.Fatalf("dead-letter queue holds %q, want %q", got, ids)
	}
	if st := tb.stats(t, tb.dead); st.InFlight != 0 || st.Ready != len(ids) {
		t.Fatalf("dead-letter queue: %d in flight, %d ready; want 0 and %d (released)", st.InFlight, st.Ready, len(ids))
	}
	for _, id := range ids {
		memorytest.RequireNotAcked(t, tb.b, tb.dead, id)
	}
}

func equalSets(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]int{}
	for _, s := range a {
		m[s]++
	}
	for _, s := range b {
		m[s]--
	}
	for _, n := range m {
		if n != 0 {
			return false
		}
	}
	return true
}

// noBacklog is a source without Backlog (a broker that cannot tell how
// many messages it holds): a run over it is bounded by its idle timeout,
// leases, event IDs and redrive counts alone.
type noBacklog struct{ s *memory.QueueSource }

func (n noBacklog) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	return n.s.Receive(ctx, buf)
}
func (n noBacklog) Ack(ctx context.Context, m *ackwise.Message) error     { return n.s.Ack(ctx, m) }
func (n noBacklog) Release(ctx context.Context, m *ackwise.Message) error { return n.s.Release(ctx, m) }
func (n noBacklog) Valid(m *ackwise.Message) bool                         { return n.s.Valid(m) }

func TestRedriveMovesEveryDeadLetterUnchanged(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	msgs := messages("e", 5)
	// An attempt counter from a wait-queue hop must not survive the redrive.
	msgs[2].Headers.Set(ackwise.HeaderAttempt, "5")
	msgs[2].Headers.Set(ackwise.HeaderFirstFailure, "2026-11-29T10:00:00Z")
	tb.deadLetter(t, dlq.ReasonMaxAttempts, msgs...)
	if got := tb.ids(t, tb.work); len(got) != 0 {
		t.Fatalf("work queue holds %q before the redrive", got)
	}

	var actions []dlq.Action
	res, err := dlq.Redrive(t.Context(), tb.from, tb.to, dlq.RedriveOptions{
		Rate: dlq.RateUnlimited, IdleTimeout: quick,
		OnMessage: func(_ *ackwise.Message, env dlq.Envelope, a dlq.Action) {
			if env.Reason != dlq.ReasonMaxAttempts {
				t.Errorf("OnMessage got envelope %+v", env)
			}
			actions = append(actions, a)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The memory queue tells its backlog: the run ends once it received
	// the 5 dead letters, without waiting to be idle.
	if res.Moved != 5 || res.Skipped != 0 || res.Failed != 0 || res.Stop != dlq.StopBacklog || res.Backlog != 5 || res.ReleaseFailed != 0 {
		t.Fatalf("result %+v", res)
	}
	if len(actions) != 5 || actions[0] != dlq.ActionMoved {
		t.Fatalf("actions %v", actions)
	}

	got, err := tb.b.Messages(tb.work)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 {
		t.Fatalf("work queue holds %d messages, want 5", len(got))
	}
	for i, m := range got {
		orig := tb.sent[tb.order[i]]
		if m.ID != orig.ID || m.Key != orig.Key || !bytes.Equal(m.Payload, orig.Payload) {
			t.Fatalf("redriven %d: id %q key %q payload %x; want %q %q %x", i, m.ID, m.Key, m.Payload, orig.ID, orig.Key, orig.Payload)
		}
		want := orig.Headers.Clone()
		want.Del(ackwise.HeaderAttempt)
		want.Del(ackwise.HeaderFirstFailure)
		want.Set(ackwise.HeaderEventID, orig.ID)
		want.Set(dlq.HeaderRedriveCount, "1")
		if !maps.Equal(m.Headers.Map(), want.Map()) {
			t.Fatalf("redriven %s headers\n got %v\nwant %v", m.ID, m.Headers, want)
		}
	}

	// Move before ack: each dead letter was acked only after its copy was
	// stored in the work queue.
	for _, id := range tb.order {
		ack := memorytest.RequireAcked(t, tb.b, tb.dead, id)
		var published uint64
		for _, e := range memorytest.Events(t, tb.b, tb.work, id) {
			if e.Kind == memory.EventPublished {
				published = e.Seq // the last publish is the redrive's
			}
		}
		if published == 0 || published > ack.Seq {
			t.Fatalf("%s: published into the work queue at #%d, acked in the dead-letter queue at #%d", id, published, ack.Seq)
		}
	}
	memorytest.RequireEmpty(t, tb.b, tb.dead)
}

func TestRedriveFilterByReason(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.deadLetter(t, dlq.ReasonPermanent, messages("p", 3)...)
	tb.deadLetter(t, dlq.ReasonMaxAttempts, messages("m", 2)...)
	// A message a broker moved without an envelope is not redriven.
	memorytest.Publish(t, tb.b, tb.dead, memorytest.Msg("plain", "", "x"))

	res, err := dlq.Redrive(t.Context(), tb.from, tb.to, dlq.RedriveOptions{
		Rate: dlq.RateUnlimited, IdleTimeout: quick,
		Filter: func(_ *ackwise.Message, env dlq.Envelope) bool { return env.Reason == dlq.ReasonPermanent },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Moved != 3 || res.Skipped != 3 || res.NoEnvelope != 1 || res.Stop != dlq.StopBacklog {
		t.Fatalf("result %+v", res)
	}
	if got := tb.ids(t, tb.work); !equalSets(got, []string{"p0", "p1", "p2"}) {
		t.Fatalf("work queue holds %q", got)
	}
	tb.requireHeld(t, "m0", "m1", "plain")
	// Each skipped message was delivered once: held, not released and
	// received again in a loop.
	memorytest.RequireDeliveries(t, tb.b, tb.dead, "m0", 1)
}

func TestRedriveDryRunMovesNothing(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.deadLetter(t, dlq.ReasonPermanent, messages("p", 4)...)
	tb.deadLetter(t, dlq.ReasonExpired, messages("x", 2)...)

	var would []string
	res, err := dlq.Redrive(t.Context(), tb.from, tb.to, dlq.RedriveOptions{
		DryRun: true, IdleTimeout: quick,
		Filter: func(_ *ackwise.Message, env dlq.Envelope) bool { return env.Reason == dlq.ReasonPermanent },
		OnMessage: func(m *ackwise.Message, _ dlq.Envelope, a dlq.Action) {
			if a == dlq.ActionWouldMove {
				would = append(would, m.ID)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Moved != 0 || res.WouldMove != 4 || res.Skipped != 2 || res.Stop != dlq.StopBacklog {
		t.Fatalf("result %+v", res)
	}
	if !equalSets(would, []string{"p0", "p1", "p2", "p3"}) {
		t.Fatalf("would move %q", would)
	}
	if got := tb.ids(t, tb.work); len(got) != 0 {
		t.Fatalf("a dry run published %q", got)
	}
	tb.requireHeld(t, "p0", "p1", "p2", "p3", "x0", "x1")

	// A dry run needs no sink.
	if _, err := dlq.Redrive(t.Context(), tb.from, nil, dlq.RedriveOptions{DryRun: true, IdleTimeout: quick}); err != nil {
		t.Fatal(err)
	}
}

func TestRedrivePublishFailureKeepsTheDeadLetter(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.deadLetter(t, dlq.ReasonPermanent, messages("e", 5)...)
	memorytest.Inject(t, tb.b, tb.work, memory.Fault{
		Kind: memory.FaultFailPublish, Count: 1,
		Match: func(m *ackwise.Message) bool { return m.ID == "e2" },
	})

	res, err := dlq.Redrive(t.Context(), tb.from, tb.to, dlq.RedriveOptions{Rate: dlq.RateUnlimited, IdleTimeout: quick})
	if !errors.Is(err, memory.ErrInjected) {
		t.Fatalf("Redrive error = %v, want the injected publish failure", err)
	}
	if !strings.Contains(err.Error(), "e2") || !strings.Contains(err.Error(), "stays in the dead-letter destination") {
		t.Fatalf("error does not say which message and what became of it: %v", err)
	}
	if res.Moved != 2 || res.Failed != 1 || res.Stop != dlq.StopError {
		t.Fatalf("result %+v", res)
	}
	if got := tb.ids(t, tb.work); !equalSets(got, []string{"e0", "e1"}) {
		t.Fatalf("work queue holds %q", got)
	}
	tb.requireHeld(t, "e2", "e3", "e4")

	// Once the target accepts again, a second run moves the rest.
	res, err = dlq.Redrive(t.Context(), tb.from, tb.to, dlq.RedriveOptions{Rate: dlq.RateUnlimited, IdleTimeout: quick})
	if err != nil || res.Moved != 3 {
		t.Fatalf("second run: %+v, %v", res, err)
	}
	if got := tb.ids(t, tb.work); !equalSets(got, tb.order) {
		t.Fatalf("work queue holds %q", got)
	}
	memorytest.RequireEmpty(t, tb.b, tb.dead)
}

func TestRedriveAckFailureIsReported(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.deadLetter(t, dlq.ReasonPermanent, messages("e", 3)...)
	if _, err := tb.from.InjectFault(memory.Fault{Kind: memory.FaultFailAck, Count: 1}); err != nil {
		t.Fatal(err)
	}
	res, err := dlq.Redrive(t.Context(), tb.from, tb.to, dlq.RedriveOptions{Rate: dlq.RateUnlimited, IdleTimeout: quick})
	if !errors.Is(err, memory.ErrInjected) || !strings.Contains(err.Error(), "published, but the ack") {
		t.Fatalf("Redrive error = %v", err)
	}
	if res.Moved != 0 || res.Failed != 1 || res.Stop != dlq.StopError {
		t.Fatalf("result %+v", res)
	}
	// The copy is in the work queue and the dead letter still in its queue:
	// a duplicate, never a loss.
	if got := tb.ids(t, tb.work); !equalSets(got, []string{"e0"}) {
		t.Fatalf("work queue holds %q", got)
	}
	tb.requireHeld(t, "e0", "e1", "e2")
}

func TestRedriveRateCap(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.deadLetter(t, dlq.ReasonPermanent, messages("e", 20)...)
	start := time.Now()
	res, err := dlq.Redrive(t.Context(), tb.from, tb.to, dlq.RedriveOptions{Rate: 100, Max: 20, IdleTimeout: quick})
	took := time.Since(start)
	if err != nil || res.Moved != 20 || res.Stop != dlq.StopMax {
		t.Fatalf("result %+v, %v", res, err)
	}
	// A token bucket of one at 100/s spaces 20 publishes by 19 intervals of
	// 10ms; the limiter promises no less. (No upper bound: the machine may be
	// slow.)
	if took < 180*time.Millisecond {
		t.Fatalf("20 messages at 100/s took %v, want at least ~190ms", took)
	}
}

func TestRedriveMax(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.deadLetter(t, dlq.ReasonPermanent, messages("e", 10)...)
	res, err := dlq.Redrive(t.Context(), tb.from, tb.to, dlq.RedriveOptions{Rate: dlq.RateUnlimited, Max: 4, IdleTimeout: quick})
	if err != nil || res.Moved != 4 || res.Stop != dlq.StopMax {
		t.Fatalf("result %+v, %v", res, err)
	}
	if got := tb.ids(t, tb.work); !equalSets(got, tb.order[:4]) {
		t.Fatalf("work queue holds %q", got)
	}
	tb.requireHeld(t, tb.order[4:]...)
	// Max received no more than it could move: the rest were never delivered.
	memorytest.RequireDeliveries(t, tb.b, tb.dead, "e9", 0)

	// In a dry run, Max counts the messages that would move.
	res, err = dlq.Redrive(t.Context(), tb.from, tb.to, dlq.RedriveOptions{DryRun: true, Max: 2, IdleTimeout: quick})
	if err != nil || res.WouldMove != 2 || res.Moved != 0 || res.Stop != dlq.StopMax {
		t.Fatalf("dry run %+v, %v", res, err)
	}
	tb.requireHeld(t, tb.order[4:]...)
}

func TestRedriveHeldLimit(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.deadLetter(t, dlq.ReasonPermanent, messages("e", 5)...)
	res, err := dlq.Redrive(t.Context(), tb.from, tb.to, dlq.RedriveOptions{
		IdleTimeout: quick, MaxHeld: 3,
		Filter: func(*ackwise.Message, dlq.Envelope) bool { return false },
	})
	if err != nil || res.Skipped != 3 || res.Stop != dlq.StopHeldLimit {
		t.Fatalf("result %+v, %v", res, err)
	}
	tb.requireHeld(t, tb.order...)
}

func TestRedriveStopsWhenAHeldMessageComesBack(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.deadLetter(t, dlq.ReasonPermanent, messages("e", 3)...)
	first := true
	res, err := dlq.Redrive(t.Context(), noBacklog{tb.from}, tb.to, dlq.RedriveOptions{
		IdleTimeout: quick,
		Filter:      func(*ackwise.Message, dlq.Envelope) bool { return false },
		OnMessage: func(*ackwise.Message, dlq.Envelope, dlq.Action) {
			if first {
				// The held deliveries' leases run out: the broker delivers
				// them again on the next receive.
				first = false
				tb.clk.Advance(memory.DefaultLease + time.Second)
			}
		},
	})
	// Without the stop, a run whose idle timeout is longer than the lease
	// would receive its own held messages for ever.
	if err != nil || res.Stop != dlq.StopRepeat || res.Skipped != 3 {
		t.Fatalf("result %+v, %v", res, err)
	}
	// The new deliveries took the old ones' place and were released.
	if res.ReleaseFailed != 0 {
		t.Fatalf("ReleaseFailed = %d, want 0", res.ReleaseFailed)
	}
	tb.requireHeld(t, tb.order...)
}

func TestRedriveKeepsGoingWhenAHeldMessageComesBackAmongNewOnes(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.deadLetter(t, dlq.ReasonExpired, message("old"))
	first := true
	var actions []string
	res, err := dlq.Redrive(t.Context(), noBacklog{tb.from}, tb.to, dlq.RedriveOptions{
		Rate: dlq.RateUnlimited, IdleTimeout: quick,
		Filter: func(_ *ackwise.Message, env dlq.Envelope) bool { return env.Reason == dlq.ReasonPermanent },
		OnMessage: func(m *ackwise.Message, _ dlq.Envelope, a dlq.Action) {
			actions = append(actions, fmt.Sprint(a, " ", m.ID))
			if first {
				// "old" is held; its lease runs out, and it comes back after
				// new dead letters that arrived meanwhile.
				first = false
				tb.clk.Advance(memory.DefaultLease + time.Second)
				tb.deadLetter(t, dlq.ReasonPermanent, messages("e", 4)...)
			}
		},
	})
	if err != nil || res.Stop != dlq.StopIdle || res.Moved != 4 || res.Skipped != 1 || res.ReleaseFailed != 0 {
		t.Fatalf("result %+v, %v; actions %q", res, err, actions)
	}
	if len(actions) != 5 {
		t.Fatalf("a redelivered held message was decided again: %q", actions)
	}
	memorytest.RequireDeliveries(t, tb.b, tb.dead, "old", 2)
	tb.requireHeld(t, "old")
}

func TestRedriveCanceledReleasesWhatItHolds(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.deadLetter(t, dlq.ReasonPermanent, messages("e", 5)...)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	res, err := dlq.Redrive(ctx, tb.from, tb.to, dlq.RedriveOptions{
		Rate: 1000, IdleTimeout: quick,
		OnMessage: func(*ackwise.Message, dlq.Envelope, dlq.Action) { cancel() },
	})
	if !errors.Is(err, context.Canceled) || res.Stop != dlq.StopCanceled || res.Moved != 1 || res.Failed != 0 {
		t.Fatalf("result %+v, %v", res, err)
	}
	tb.requireHeld(t, tb.order[1:]...)
}

func TestRedriveOptionsValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		opts dlq.RedriveOptions
		want string
	}{
		{dlq.RedriveOptions{Rate: -2}, "Rate = -2"},
		{dlq.RedriveOptions{Rate: math.NaN()}, "Rate = NaN"},
		{dlq.RedriveOptions{Rate: math.Inf(1)}, "Rate = +Inf"},
		{dlq.RedriveOptions{Max: -1}, "Max = -1"},
		{dlq.RedriveOptions{IdleTimeout: -time.Second}, "IdleTimeout = -1s"},
		{dlq.RedriveOptions{MaxHeld: -5}, "MaxHeld = -5"},
	} {
		err := tc.opts.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error containing %q", tc.opts, err, tc.want)
		}
		// Redrive validates before it touches the source.
		if _, err := dlq.Redrive(t.Context(), nil, nil, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Redrive(%+v) = %v", tc.opts, err)
		}
	}
	for _, ok := range []dlq.RedriveOptions{{}, {Rate: dlq.RateUnlimited}, {Rate: 0.5, Max: 1, IdleTimeout: time.Second, MaxHeld: 1}} {
		if err := ok.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", ok, err)
		}
	}
	tb := setup(t)
	if _, err := dlq.Redrive(t.Context(), tb.from, nil, dlq.RedriveOptions{}); err == nil || !strings.Contains(err.Error(), "to is nil") {
		t.Errorf("Redrive without a sink = %v", err)
	}
	for _, tc := range []struct {
		opts dlq.InspectOptions
		want string
	}{
		{dlq.InspectOptions{Max: -1}, "Max = -1"},
		{dlq.InspectOptions{IdleTimeout: -time.Millisecond}, "IdleTimeout = -1ms"},
	} {
		if _, err := dlq.Inspect(t.Context(), tb.from, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Inspect(%+v) = %v, want %q", tc.opts, err, tc.want)
		}
	}
}

func TestInspectNeverConsumes(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.deadLetter(t, dlq.ReasonPermanent, messages("e", 3)...)
	memorytest.Publish(t, tb.b, tb.dead, memorytest.Msg("plain", "", "x"))

	res, err := dlq.Inspect(t.Context(), tb.from, dlq.InspectOptions{Max: 10, IdleTimeout: quick})
	if err != nil || res.Stop != dlq.StopIdle || len(res.Letters) != 4 {
		t.Fatalf("Inspect: %+v, %v", res, err)
	}
	for i, l := range res.Letters[:3] {
		if l.Err != nil || l.Envelope.Reason != dlq.ReasonPermanent || l.Envelope.Consumer != "billing" || l.Message.ID != tb.order[i] {
			t.Fatalf("letter %d: %+v", i, l)
		}
		if !strings.Contains(l.Envelope.Error, tb.order[i]+" failed") || l.Message.Handle != nil {
			t.Fatalf("letter %d: error %q, handle %v", i, l.Envelope.Error, l.Message.Handle)
		}
	}
	if res.Letters[3].Err == nil || res.Letters[3].Message.ID != "plain" {
		t.Fatalf("message without envelope: %+v", res.Letters[3])
	}
	tb.requireHeld(t, "e0", "e1", "e2", "plain")

	res, err = dlq.Inspect(t.Context(), tb.from, dlq.InspectOptions{Max: 2, IdleTimeout: quick})
	if err != nil || res.Stop != dlq.StopMax || len(res.Letters) != 2 {
		t.Fatalf("Inspect Max 2: %+v, %v", res, err)
	}
	tb.requireHeld(t, "e0", "e1", "e2", "plain")
}

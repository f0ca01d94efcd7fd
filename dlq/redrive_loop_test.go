package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

// failingConsumer runs a consumer on the work queue whose handler fails
// every message as permanent: it dead-letters each one back into the
// dead-letter queue the redrive reads. It stops when the test ends.
func (tb *testBundle) failingConsumer(t *testing.T) {
	t.Helper()
	src, err := tb.b.QueueSource(tb.work)
	if err != nil {
		t.Fatal(err)
	}
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		return ackwise.Permanent(errors.New("still broken"))
	})
	c, err := consumer.New(src, h, consumer.Config{Name: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		src.Close()
	})
}

// waitDeadLettered waits until n messages were dead-lettered from the work
// queue in all (tb.deadLetter's included).
func (tb *testBundle) waitDeadLettered(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute) // generous: a busy machine
	defer cancel()
	err := tb.b.WaitHistory(ctx, tb.work, func(evs []memory.Event) bool {
		k := 0
		for _, e := range evs {
			if e.Kind == memory.EventDeadLettered {
				k++
			}
		}
		return k >= n
	})
	if err != nil {
		t.Fatalf("waiting for %d dead letters from the work queue: %v", n, err)
	}
}

// requireCounts fails unless the dead-letter queue holds n messages, all
// released, each with redrive count want.
func (tb *testBundle) requireCounts(t *testing.T, n int, want string) {
	t.Helper()
	msgs, err := tb.b.Messages(tb.dead)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != n {
		t.Fatalf("dead-letter queue holds %d messages, want %d", len(msgs), n)
	}
	for _, m := range msgs {
		if got := m.Headers.Get(dlq.HeaderRedriveCount); got != want {
			t.Fatalf("%s: %s = %q, want %q", m.ID, dlq.HeaderRedriveCount, got, want)
		}
	}
	if st := tb.stats(t, tb.dead); st.InFlight != 0 {
		t.Fatalf("dead-letter queue: %d in flight after the run", st.InFlight)
	}
}

// TestRedriveIntoAFailingConsumerEnds: a redrive into a consumer that
// still fails every message. Its dead letters come back into the
// dead-letter queue while the run reads it. Before, the run moved them
// again and again and never ended (2,130 moves from a 2,000-message DLQ in
// 30s; here it stopped only at the Max safety net). Now each run moves each
// dead letter once, ending when it received what the queue held at its
// start; after DefaultMaxRedrives runs the dead letters stay where they
// are and are reported, and Force moves them once more.
func TestRedriveIntoAFailingConsumerEnds(t *testing.T) {
	t.Parallel()
	const n = 200
	tb := setup(t)
	tb.deadLetter(t, dlq.ReasonPermanent, messages("e", n)...)
	tb.failingConsumer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	opts := dlq.RedriveOptions{Rate: dlq.RateUnlimited, IdleTimeout: 5 * time.Second, Max: 5 * n /* a safety net: without the fix the run stops only here */}
	for run := 1; run <= dlq.DefaultMaxRedrives; run++ {
		res, err := dlq.Redrive(ctx, tb.from, tb.to, opts)
		if err != nil {
			t.Fatal(err)
		}
		if res.Moved != n || res.Stop != dlq.StopBacklog || res.Backlog != n || res.RedriveLimited != 0 {
			t.Fatalf("run %d: %+v; want %d moved, stopped at the backlog", run, res, n)
		}
		tb.waitDeadLettered(t, (run+1)*n)
		tb.requireCounts(t, n, strconv.Itoa(run))
	}
	var limited int
	opts.OnMessage = func(_ *ackwise.Message, _ dlq.Envelope, a dlq.Action) {
		if a == dlq.ActionRedriveLimit {
			limited++
		}
	}
	res, err := dlq.Redrive(ctx, tb.from, tb.to, opts)
	if err != nil || res.Moved != 0 || res.RedriveLimited != n || limited != n || res.Stop != dlq.StopBacklog {
		t.Fatalf("run past the limit: %+v, %v (%d reported); want nothing moved, %d left", res, err, limited, n)
	}
	tb.requireCounts(t, n, strconv.Itoa(dlq.DefaultMaxRedrives))

	opts.Force, opts.OnMessage = true, nil
	res, err = dlq.Redrive(ctx, tb.from, tb.to, opts)
	if err != nil || res.Moved != n || res.Stop != dlq.StopBacklog {
		t.Fatalf("forced run: %+v, %v", res, err)
	}
	tb.waitDeadLettered(t, (dlq.DefaultMaxRedrives+2)*n)
	tb.requireCounts(t, n, strconv.Itoa(dlq.DefaultMaxRedrives+1))
}

// TestRedriveIntoAFailingConsumerEndsWithoutBacklog: over a source that
// cannot tell its backlog, the run still moves each event once: a dead
// letter that comes back is left (ActionAlreadyMoved), and the run ends
// idle once only such dead letters remain.
func TestRedriveIntoAFailingConsumerEndsWithoutBacklog(t *testing.T) {
	t.Parallel()
	const n = 200
	tb := setup(t)
	tb.deadLetter(t, dlq.ReasonPermanent, messages("e", n)...)
	tb.failingConsumer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, err := dlq.Redrive(ctx, noBacklog{tb.from}, tb.to, dlq.RedriveOptions{Rate: dlq.RateUnlimited, IdleTimeout: time.Second, Max: 5 * n})
	if err != nil {
		t.Fatal(err)
	}
	if res.Moved != n || res.Stop != dlq.StopIdle || res.Backlog != -1 || res.AlreadyMoved > n {
		t.Fatalf("%+v; want %d moved, ended idle", res, n)
	}
	tb.waitDeadLettered(t, 2*n)
	tb.requireCounts(t, n, "1")
}

// TestRedriveCountLimitAndForce: the count a dead letter carries decides;
// an unreadable or forged one (a producer can set the header) only makes
// its message need Force; the count written never wraps.
func TestRedriveCountLimitAndForce(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	maxInt := strconv.Itoa(math.MaxInt)
	counts := map[string]string{"c0": "", "c2": "2", "c3": "3", "bad": "x", "neg": "-1", "max": maxInt, "huge": "99999999999999999999"}
	want := map[string]string{"c0": "1", "c2": "3", "c3": "4", "bad": maxInt, "neg": maxInt, "max": maxInt, "huge": maxInt}
	var msgs []*ackwise.Message
	for id, c := range counts {
		m := message(id)
		if c != "" {
			m.Headers.Set(dlq.HeaderRedriveCount, c)
		}
		msgs = append(msgs, m)
	}
	tb.deadLetter(t, dlq.ReasonPermanent, msgs...)

	var left []string
	res, err := dlq.Redrive(t.Context(), tb.from, tb.to, dlq.RedriveOptions{
		Rate: dlq.RateUnlimited, IdleTimeout: quick,
		OnMessage: func(m *ackwise.Message, _ dlq.Envelope, a dlq.Action) {
			if a == dlq.ActionRedriveLimit {
				left = append(left, m.ID)
			}
		},
	})
	if err != nil || res.Moved != 2 || res.RedriveLimited != 5 || !equalSets(left, []string{"c3", "bad", "neg", "max", "huge"}) {
		t.Fatalf("%+v, %v; left %q", res, err, left)
	}
	tb.requireHeld(t, left...)
	res, err = dlq.Redrive(t.Context(), tb.from, tb.to, dlq.RedriveOptions{Rate: dlq.RateUnlimited, IdleTimeout: quick, Force: true})
	if err != nil || res.Moved != 5 || res.RedriveLimited != 0 {
		t.Fatalf("forced: %+v, %v", res, err)
	}
	got, err := tb.b.Messages(tb.work)
	if err != nil || len(got) != len(want) {
		t.Fatalf("work queue: %d messages, %v", len(got), err)
	}
	for _, m := range got {
		if c := m.Headers.Get(dlq.HeaderRedriveCount); c != want[m.ID] {
			t.Errorf("%s: redriven with count %q, want %q", m.ID, c, want[m.ID])
		}
	}
	// A MaxRedrives of its own.
	if err := (dlq.RedriveOptions{MaxRedrives: -1}).Validate(); err == nil {
		t.Error("MaxRedrives -1 validated")
	}
}

// TestRedriveMovesAnEventOncePerRun: two dead letters of one event (a
// dead-lettering repeated after a crash, invariant 11): a run moves the
// first and leaves the second (ActionAlreadyMoved), in a dry run too.
func TestRedriveMovesAnEventOncePerRun(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.deadLetter(t, dlq.ReasonPermanent, message("dup"), message("other"))
	tb.deadLetter(t, dlq.ReasonPermanent, message("dup"))
	for _, dry := range []bool{true, false} {
		var actions []string
		res, err := dlq.Redrive(t.Context(), tb.from, tb.to, dlq.RedriveOptions{
			Rate: dlq.RateUnlimited, IdleTimeout: quick, DryRun: dry,
			OnMessage: func(m *ackwise.Message, _ dlq.Envelope, a dlq.Action) {
				actions = append(actions, fmt.Sprint(a, " ", m.ID))
			},
		})
		moved := res.Moved + res.WouldMove
		if err != nil || moved != 2 || res.AlreadyMoved != 1 {
			t.Fatalf("dry run %v: %+v, %v; actions %q", dry, res, err, actions)
		}
		if actions[len(actions)-1] != "already-moved dup" {
			t.Fatalf("dry run %v: actions %q", dry, actions)
		}
	}
	// The second dead letter of "dup" is still there, released.
	if got := tb.ids(t, tb.dead); len(got) != 1 || got[0] != "dup" {
		t.Fatalf("dead-letter queue holds %q, want one dup", got)
	}
	if st := tb.stats(t, tb.dead); st.InFlight != 0 {
		t.Fatalf("%d in flight after the run", st.InFlight)
	}
}

// TestRedriveLeavesCutPayloads: a dead letter written with its payload cut
// to fit (a Kafka record near the dead-letter topic's max.message.bytes,
// marked dlq.HeaderTrimmed) is never moved back, also with Force: its
// consumer would handle the cut payload as if whole. A marker that cannot
// be read counts as cut; a dead letter trimmed of headers only moves.
func TestRedriveLeavesCutPayloads(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	env := dlq.Envelope{Reason: dlq.ReasonPermanent, Source: tb.work, Partition: -1, Offset: -1, Attempts: 1}
	marked := func(id, marker string) *ackwise.Message {
		m := message(id)
		m.Headers = env.Apply(m.Headers)
		m.Headers.Set(dlq.HeaderTrimmed, marker)
		return m
	}
	memorytest.Publish(t, tb.b, tb.dead,
		marked("cut", "value-bytes=1048528;value-kept=1047000;value-sha256=00;headers-dropped=0;key-bytes-dropped=0;event-id-bytes-dropped=0"),
		marked("unreadable", "value-bytes=x"),
		marked("headers-only", "value-bytes=6;value-kept=6;value-sha256=00;headers-dropped=2;key-bytes-dropped=0;event-id-bytes-dropped=0"),
	)
	var actions []string
	res, err := dlq.Redrive(t.Context(), tb.from, tb.to, dlq.RedriveOptions{
		Rate: dlq.RateUnlimited, IdleTimeout: quick, Force: true,
		OnMessage: func(m *ackwise.Message, _ dlq.Envelope, a dlq.Action) {
			actions = append(actions, fmt.Sprint(a, " ", m.ID))
		},
	})
	if err != nil || res.Moved != 1 || res.PayloadCut != 2 {
		t.Fatalf("%+v, %v; actions %q", res, err, actions)
	}
	if got := tb.ids(t, tb.work); len(got) != 1 || got[0] != "headers-only" {
		t.Fatalf("work queue holds %q, want headers-only", got)
	}
	if got := tb.ids(t, tb.dead); len(got) != 2 {
		t.Fatalf("dead-letter queue holds %q, want the two cut ones", got)
	}
}

// TestPayloadCut reads the marker strictly: only a marker saying the whole
// payload was kept lets a dead letter be redriven.
func TestPayloadCut(t *testing.T) {
	for marker, want := range map[string]bool{
		"value-bytes=10;value-kept=10": false,
		"value-bytes=10;value-kept=4":  true,
		"value-kept=10":                true,
		"value-bytes=10":               true,
		"value-bytes=-1;value-kept=-1": true,
		"":                             true,
		"value-bytes=10;value-kept=10;extra=what": false,
	} {
		if got := dlq.PayloadCut(ackwise.HeadersOf(dlq.HeaderTrimmed, marker)); got != want {
			t.Errorf("PayloadCut(%q) = %v, want %v", marker, got, want)
		}
	}
	if dlq.PayloadCut(ackwise.HeadersOf("x", "y")) {
		t.Error("PayloadCut without a marker = true")
	}
}

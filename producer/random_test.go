package producer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/producer"
	"github.com/ackwise/ackwise/retry"
)

// randomSeeds is how many seeds TestPublisherRandom runs. A failing seed
// replays alone: go test -run 'TestPublisherRandom/seed=N$' ./producer/
const randomSeeds = 400

// randomMaxInterval is the policy's MaxInterval in TestPublisherRandom: a
// RetryAfter up to it is waited, a longer one ends the retries. The test
// runs in a synctest bubble, where waits take no real time.
const randomMaxInterval = time.Second

// randomCall is what randomSink saw and did in one Publish call.
type randomCall struct {
	batch      []int    // indexes into the caller's msgs, in the order given
	ids        []string // each message's ID as the sink saw it
	start, end time.Time
	cancelled  bool  // the Publish ctx was done when the call returned
	err        error // what the call returned
	// failed maps each batch position to its failure as the Publisher
	// should read it (nil: confirmed): the listed error of a well-formed
	// PublishError, else err itself.
	failed []error
}

// randomSink is a Sink whose every call picks, from rng, an outcome per
// message or for the whole batch, and records it. It is used from one
// goroutine at a time (a Publish call).
type randomSink struct {
	rng    *rand.Rand
	msgs   []*ackwise.Message
	cancel context.CancelFunc
	calls  []randomCall
	bad    []string // contract breaches seen inside a call
}

func (s *randomSink) Close() error { return nil }

func (s *randomSink) Publish(ctx context.Context, batch ...*ackwise.Message) error {
	n := len(s.calls) + 1
	c := randomCall{start: time.Now()}
	for _, m := range batch {
		k := slices.Index(s.msgs, m)
		if k < 0 {
			s.bad = append(s.bad, fmt.Sprintf("call %d: a message that is not one of the caller's", n))
		}
		c.batch = append(c.batch, k)
		c.ids = append(c.ids, m.ID)
	}
	if s.rng.IntN(20) == 0 {
		// ctx ends while the sink works: some messages may still be
		// confirmed, the others fail with ctx's error or their own.
		s.cancel()
	}
	c.failed = make([]error, len(batch))
	switch r := s.rng.IntN(20); {
	case r < 2: // every message confirmed
	case r < 5: // one error for the whole batch
		c.err = s.failure(ctx, n, -1)
		for i := range c.failed {
			c.failed[i] = c.err
		}
	case r < 7: // a PublishError the Publisher cannot use
		c.err = s.malformed(ctx, n, len(batch))
		for i := range c.failed {
			c.failed[i] = c.err
		}
	default: // a failure per message
		for i := range c.failed {
			if s.rng.IntN(3) > 0 {
				c.failed[i] = s.failure(ctx, n, i)
			}
		}
		c.err = adapters.NewPublishError(c.failed)
		if c.err != nil && s.rng.IntN(4) == 0 {
			c.err = fmt.Errorf("sink: %w", c.err) // still found by errors.As
		}
	}
	c.end = time.Now()
	c.cancelled = ctx.Err() != nil
	s.calls = append(s.calls, c)
	return c.err
}

// failure returns a new error of a random kind for message i (-1: the
// whole batch) of call n; each is distinct, so errors.Is tells them apart.
func (s *randomSink) failure(ctx context.Context, n, i int) error {
	base := fmt.Errorf("call %d msg %d", n, i)
	switch s.rng.IntN(16) {
	case 0, 1:
		return ackwise.Permanent(base)
	case 2, 3:
		return ackwise.RetryAfter(base, time.Duration(1+s.rng.IntN(int(randomMaxInterval))))
	case 4:
		// Waited at the bound, not past it; zero is the policy's backoff.
		return ackwise.RetryAfter(base, []time.Duration{randomMaxInterval, 0, -time.Second}[s.rng.IntN(3)])
	case 5:
		return ackwise.RetryAfter(base, []time.Duration{randomMaxInterval + 1, time.Hour}[s.rng.IntN(2)])
	case 6:
		return fmt.Errorf("%w: %w", base, adapters.ErrClosed)
	case 7:
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %w", base, ctx.Err())
		}
	}
	return base // transient
}

// malformed returns a PublishError that breaks PublishError's rules (no
// failure, one without an error, an index out of order or out of range),
// whose listed errors are random failures.
func (s *randomSink) malformed(ctx context.Context, n, size int) error {
	var pe adapters.PublishError
	for i := range size {
		if s.rng.IntN(2) == 0 {
			pe.Failed = append(pe.Failed, adapters.PublishFailure{Index: i, Err: s.failure(ctx, n, i)})
		}
	}
	switch r := s.rng.IntN(5); {
	case r == 0 || len(pe.Failed) == 0:
		pe.Failed = nil
	case r == 1:
		pe.Failed[s.rng.IntN(len(pe.Failed))].Err = nil
	case r == 2:
		pe.Failed[len(pe.Failed)-1].Index = []int{size, -1}[s.rng.IntN(2)]
	default: // out of order, or twice
		f := pe.Failed[s.rng.IntN(len(pe.Failed))]
		pe.Failed = append(pe.Failed, f)
	}
	if s.rng.IntN(3) == 0 {
		return fmt.Errorf("sink: %w", &pe)
	}
	return &pe
}

// TestPublisherRandom publishes through a sink whose every call fails a
// random subset of its messages with random kinds of error (transient,
// Permanent, RetryAfter below and above MaxInterval, ErrClosed, ctx's),
// or the whole batch, sometimes with a malformed PublishError, and checks
// Publish against a model of its documented contract: which messages each
// call gets, how long it waits, when the retries end, and what the error
// says. Some seeds also cancel ctx while Publish waits between calls. Time
// is synctest's, so the waits are exact and cost nothing.
func TestPublisherRandom(t *testing.T) {
	t.Parallel()
	for seed := range uint64(randomSeeds) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) { checkRandomPublish(t, seed) })
		})
	}
}

func checkRandomPublish(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	pol := retry.Policy{
		MaxAttempts:     1 + rng.IntN(6),
		InitialInterval: time.Duration(1 + rng.IntN(int(randomMaxInterval/2))),
		MaxInterval:     randomMaxInterval,
		Jitter:          retry.NoJitter, // jitter is not seeded
	}
	// ctx ends while Publish waits: in the first wait, or at a random
	// time of the calls' span.
	var cancelAt time.Duration
	if r := rng.IntN(10); r < 2 {
		cancelAt = time.Duration(1 + rng.IntN([]int{int(pol.InitialInterval), pol.MaxAttempts * int(randomMaxInterval)}[r]))
	} else if rng.IntN(2) == 0 {
		pol.Jitter = 0.5 // no timer to race with
	}
	msgs := make([]*ackwise.Message, 1+rng.IntN(8))
	wantID := make([]string, len(msgs))
	fresh := 0 // messages without an ID, which get one in msgs order
	for i := range msgs {
		msgs[i] = &ackwise.Message{}
		switch rng.IntN(3) {
		case 0:
			wantID[i] = "own-" + strconv.Itoa(i)
			msgs[i].ID = wantID[i]
		case 1:
			wantID[i] = "header-" + strconv.Itoa(i)
			msgs[i].Headers = ackwise.HeadersOf(ackwise.HeaderEventID, wantID[i])
		default:
			fresh++
			wantID[i] = "new-" + strconv.Itoa(fresh)
		}
	}
	// The deadline bounds a Publish that would wait for a long RetryAfter;
	// it is far beyond what one should take.
	ctx, stop := context.WithTimeout(context.Background(), 24*time.Hour)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var cancelledAt time.Time // when the cancelAt timer fired
	if cancelAt > 0 {
		time.AfterFunc(cancelAt, func() {
			cancelledAt = time.Now()
			cancel()
		})
	}
	sink := &randomSink{rng: rng, msgs: msgs, cancel: cancel}
	newIDs := 0
	p, err := producer.New(sink, producer.Config{Retry: pol, NewID: func() string {
		newIDs++
		return "new-" + strconv.Itoa(newIDs)
	}})
	if err != nil {
		t.Fatal(err)
	}
	err = p.Publish(ctx, msgs...)
	returned := time.Now()
	synctest.Wait() // the cancelAt timer, if due, has fired
	for _, b := range sink.bad {
		t.Error(b)
	}

	// Replay the calls on the model: which messages each call should
	// have had, and each message's state after the last.
	confirmed := make([]bool, len(msgs))
	last := make([]error, len(msgs)) // each message's last failure
	want := make([]int, len(msgs))   // the next call's batch
	for i := range want {
		want[i] = i
	}
	perMessage := false // a call returned a PublishError, usable or not
	var due time.Time   // when the next call should come
	for n, c := range sink.calls {
		if !slices.Equal(c.batch, want) {
			t.Fatalf("call %d got msgs%v, want msgs%v (calls: %s)", n+1, c.batch, want, describe(sink.calls))
		}
		for j, k := range c.batch {
			if c.ids[j] != wantID[k] {
				t.Errorf("call %d: msgs[%d].ID = %q, want %q", n+1, k, c.ids[j], wantID[k])
			}
		}
		if _, ok := errors.AsType[*adapters.PublishError](c.err); ok {
			perMessage = true
		}
		end := c.cancelled // ctx ended: no more calls
		var minWait time.Duration
		want = nil
		for j, k := range c.batch {
			f := c.failed[j]
			last[k] = f
			confirmed[k] = f == nil
			if f == nil || errors.Is(f, adapters.ErrClosed) || ackwise.ClassOf(f) == ackwise.ClassPermanent {
				continue
			}
			if d, ok := ackwise.RetryAfterOf(f); ok {
				end = end || d > pol.MaxInterval
				minWait = max(minWait, d)
			}
			want = append(want, k)
		}
		if end || n+1 == pol.MaxAttempts {
			want = nil
		}
		// The policy's wait after attempt n+1, or longer if a failure
		// asked for it; jittered, anything up to MaxInterval.
		wait := max(minWait, pol.Delay(n+1))
		due = c.end.Add(wait)
		if len(want) > 0 && n+1 < len(sink.calls) {
			gap := sink.calls[n+1].start.Sub(c.end)
			if pol.Jitter == retry.NoJitter && gap != wait || gap < minWait || gap > pol.MaxInterval {
				t.Errorf("call %d came %v after call %d, want %v (asked for: %v)", n+2, gap, n+1, wait, minWait)
			}
		}
	}
	if len(sink.calls) > pol.MaxAttempts {
		t.Fatalf("%d calls, MaxAttempts %d", len(sink.calls), pol.MaxAttempts)
	}
	lastCall := sink.calls[len(sink.calls)-1]
	if len(want) > 0 {
		// Only a ctx that ended while Publish waited for the next call
		// stops the retries early, and Publish returns then.
		if cancelledAt.IsZero() || cancelledAt.After(due) && pol.Jitter == retry.NoJitter {
			t.Fatalf("Publish stopped after %d call(s) with msgs%v still worth another try (calls: %s)", len(sink.calls), want, describe(sink.calls))
		}
		if !returned.Equal(cancelledAt) {
			t.Errorf("Publish returned %v after its ctx ended", returned.Sub(cancelledAt))
		}
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Publish = %v, want it to wrap context.Canceled: ctx ended while it waited", err)
		}
	} else if !returned.Equal(lastCall.end) {
		// Nothing left to try: no wait (a RetryAfter beyond MaxInterval
		// is not waited for).
		t.Errorf("Publish returned %v after its last call, want at once (calls: %s)", returned.Sub(lastCall.end), describe(sink.calls))
	}
	for i, m := range msgs {
		if m.ID != wantID[i] {
			t.Errorf("msgs[%d].ID = %q after Publish, want %q", i, m.ID, wantID[i])
		}
	}

	var failedIdx []int
	var failedErrs []error
	for k, ok := range confirmed {
		if !ok {
			failedIdx = append(failedIdx, k)
			failedErrs = append(failedErrs, last[k])
		}
	}
	if len(failedIdx) == 0 {
		if err != nil {
			t.Fatalf("Publish = %v, want nil: every message was confirmed (calls: %s)", err, describe(sink.calls))
		}
		return
	}
	if err == nil {
		t.Fatalf("Publish = nil, want an error: msgs%v not confirmed (calls: %s)", failedIdx, describe(sink.calls))
	}
	if m := regexp.MustCompile(`after (\d+) attempt`).FindStringSubmatch(err.Error()); m == nil || m[1] != strconv.Itoa(len(sink.calls)) {
		t.Errorf("Publish = %q, want it to say after %d attempt(s)", err, len(sink.calls))
	}
	_, ok := errors.AsType[*adapters.PublishError](err)
	if perMessage && !ok {
		t.Errorf("Publish = %v, want an adapters.PublishError: the sink reported per message", err)
	}
	got := adapters.PublishFailures(err, len(msgs))
	var gotIdx []int
	for _, f := range got {
		gotIdx = append(gotIdx, f.Index)
	}
	if !slices.Equal(gotIdx, failedIdx) {
		t.Fatalf("Publish = %v lists msgs%v, want msgs%v (calls: %s)", err, gotIdx, failedIdx, describe(sink.calls))
	}
	for i, f := range got {
		// A PublishError holds each message's last failure itself; a
		// whole-batch error is every message's.
		if ok && f.Err != failedErrs[i] || !errors.Is(f.Err, failedErrs[i]) {
			t.Errorf("msgs[%d] listed with %v, want its last failure %v", f.Index, f.Err, failedErrs[i])
		}
		if !errors.Is(err, failedErrs[i]) {
			t.Errorf("errors.Is(Publish error, msgs[%d]'s last failure %v) = false", f.Index, failedErrs[i])
		}
	}
	// As documented for PublishError: the class of the first failure
	// marked other than Discard, as of an errors.Join.
	ref := errors.Join(failedErrs...)
	if !ok {
		ref = failedErrs[0]
	}
	if g, w := ackwise.ClassOf(err), ackwise.ClassOf(ref); g != w {
		t.Errorf("ClassOf(Publish error) = %v, want %v (%v)", g, w, err)
	}
	gd, gok := ackwise.RetryAfterOf(err)
	wd, wok := ackwise.RetryAfterOf(ref)
	if gd != wd || gok != wok {
		t.Errorf("RetryAfterOf(Publish error) = %v, %v; want %v, %v", gd, gok, wd, wok)
	}
	if g, w := errors.Is(err, adapters.ErrClosed), errors.Is(ref, adapters.ErrClosed); g != w {
		t.Errorf("errors.Is(Publish error, ErrClosed) = %v, want %v", g, w)
	}
}

// describe spells out calls for a failure message.
func describe(calls []randomCall) string {
	s := ""
	for n, c := range calls {
		s += fmt.Sprintf("\n  call %d msgs%v cancelled=%v: %v", n+1, c.batch, c.cancelled, c.err)
	}
	return s
}

package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
)

// Options describe the store under test.
type Options struct {
	// NonBlocking means a claim on a key another claim holds fails with an
	// error marked ackwise.RetryAfter instead of waiting (redisinbox). The
	// suite then redelivers after the delay, as the engine would.
	NonBlocking bool
}

// deliver calls h with msg until it returns nil or an error the caller
// expects, redelivering after RetryAfter errors as the engine would (capped
// to keep tests fast).
func deliver(ctx context.Context, t testing.TB, h ackwise.Handler, msg *ackwise.Message) error {
	for {
		err := h.Handle(ctx, msg)
		d, ok := ackwise.RetryAfterOf(err)
		if !ok {
			return err
		}
		// The broker's redelivery delay, not a synchronization.
		timer := time.NewTimer(min(d, 20*time.Millisecond))
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
	}
}

func msgFor(id string) *ackwise.Message {
	return &ackwise.Message{ID: id, Headers: ackwise.HeadersOf(ackwise.HeaderEventID, id), Source: "inboxtest", Partition: -1, Offset: -1, Attempt: 1}
}

// counted wraps, in the inbox on store under a unique consumer name, a
// handler that counts its calls in runs and returns f(call), call counting
// from 1.
func counted(t *testing.T, store middleware.InboxStore, f func(call int32) error) (h ackwise.Handler, runs *atomic.Int32) {
	t.Helper()
	runs = new(atomic.Int32)
	h = wrap(t, store, unique(t), func(context.Context, *ackwise.Message) error { return f(runs.Add(1)) })
	return h, runs
}

// redeliver delivers msg to h again (step names the delivery), wanting nil,
// then wants the handler to have run want times in all (why says why).
func redeliver(t *testing.T, h ackwise.Handler, msg *ackwise.Message, runs *atomic.Int32, step string, want int32, why string) {
	t.Helper()
	if err := deliver(t.Context(), t, h, msg); err != nil {
		t.Fatalf("%s: %v", step, err)
	}
	if n := runs.Load(); n != want {
		t.Fatalf("handler ran %d times, want %d%s", n, want, why)
	}
}

func unique(t testing.TB) string {
	return fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
}

func wrap(t testing.TB, store middleware.InboxStore, consumer string, h ackwise.HandlerFunc) ackwise.Handler {
	t.Helper()
	mw, err := middleware.Inbox(store, middleware.InboxConfig{Consumer: consumer})
	if err != nil {
		t.Fatalf("Inbox: %v", err)
	}
	return mw(h)
}

// RunInbox runs the inbox conformance tests against the stores newStore
// returns. newStore is called once per subtest; subtests run in parallel and
// use unique consumer names and event IDs.
func RunInbox(t *testing.T, newStore func(t *testing.T) middleware.InboxStore, opts Options) {
	t.Run("HandledOnce", func(t *testing.T) {
		t.Parallel()
		h, runs := counted(t, newStore(t), func(int32) error { return nil })
		msg := msgFor("e1")
		for i := range 3 {
			if err := deliver(t.Context(), t, h, msg); err != nil {
				t.Fatalf("delivery %d: %v", i+1, err)
			}
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("handler ran %d times for 3 deliveries of one event, want 1", n)
		}
	})

	t.Run("FailureLeavesNoRecord", func(t *testing.T) {
		t.Parallel()
		boom := errors.New("boom")
		h, runs := counted(t, newStore(t), func(call int32) error {
			if call == 1 {
				return boom
			}
			return nil
		})
		msg := msgFor("e1")
		if err := deliver(t.Context(), t, h, msg); !errors.Is(err, boom) {
			t.Fatalf("first delivery: got %v, want the handler's error", err)
		}
		if err := deliver(t.Context(), t, h, msg); err != nil {
			t.Fatalf("retry: %v", err)
		}
		redeliver(t, h, msg, runs, "redelivery after success", 2, " (failed attempt, then the retry)")
	})

	t.Run("PanicLeavesNoRecord", func(t *testing.T) {
		t.Parallel()
		inner, runs := counted(t, newStore(t), func(call int32) error {
			if call == 1 {
				panic("handler bug")
			}
			return nil
		})
		h := middleware.Recover(middleware.RecoverConfig{})(inner)
		msg := msgFor("e1")
		err := deliver(t.Context(), t, h, msg)
		var pe *middleware.PanicError
		if !errors.As(err, &pe) {
			t.Fatalf("first delivery: got %v, want a *PanicError", err)
		}
		redeliver(t, h, msg, runs, "retry after panic", 2, "")
	})

	t.Run("FinishedWorkCommitsAfterCancel", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		h, runs := counted(t, newStore(t), func(int32) error {
			cancel() // the engine's drain deadline passes as the handler finishes
			return nil
		})
		msg := msgFor("e1")
		if err := h.Handle(ctx, msg); err != nil {
			t.Fatalf("handler returned nil but the delivery failed with %v once ctx ended; want its work committed", err)
		}
		redeliver(t, h, msg, runs, "redelivery", 1, " (the redelivery of committed work is a duplicate)")
	})

	t.Run("ConsumersAreIndependent", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		var runs atomic.Int32
		count := func(ctx context.Context, msg *ackwise.Message) error { runs.Add(1); return nil }
		base := unique(t)
		a := wrap(t, store, base+"-a", count)
		b := wrap(t, store, base+"-b", count)
		msg := msgFor("shared")
		for _, h := range []ackwise.Handler{a, b, a, b} {
			if err := deliver(t.Context(), t, h, msg); err != nil {
				t.Fatal(err)
			}
		}
		if n := runs.Load(); n != 2 {
			t.Fatalf("handler ran %d times for two consumers, want 2", n)
		}
	})

	t.Run("RacingDeliveries", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		const events, racers = 20, 6
		var mu sync.Mutex
		runs := map[string]int{}
		h := wrap(t, store, unique(t), func(ctx context.Context, msg *ackwise.Message) error {
			mu.Lock()
			runs[msg.ID]++
			mu.Unlock()
			return nil
		})
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, events*racers)
		for e := range events {
			msg := msgFor("e" + strconv.Itoa(e))
			for range racers {
				wg.Go(func() {
					<-start
					m := *msg // each delivery is its own Message
					if err := deliver(t.Context(), t, h, &m); err != nil {
						errs <- err
					}
				})
			}
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("delivery: %v", err)
		}
		for e := range events {
			if n := runs["e"+strconv.Itoa(e)]; n != 1 {
				t.Errorf("event e%d: handler ran %d times under %d racing deliveries, want 1", e, n, racers)
			}
		}
	})

	t.Run("RacerTakesOverAfterFailure", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		entered := make(chan struct{})
		release := make(chan struct{})
		var runs, successes atomic.Int32
		boom := errors.New("first attempt fails")
		h := wrap(t, store, unique(t), func(ctx context.Context, msg *ackwise.Message) error {
			if runs.Add(1) == 1 {
				close(entered)
				<-release
				return boom
			}
			successes.Add(1)
			return nil
		})
		msg := msgFor("e1")
		first := make(chan error, 1)
		go func() { first <- h.Handle(t.Context(), msg) }()
		<-entered
		second := make(chan error, 1)
		go func() { m := *msg; second <- deliver(t.Context(), t, h, &m) }()
		close(release)
		if err := <-first; !errors.Is(err, boom) {
			t.Fatalf("first delivery: got %v, want its handler's error", err)
		}
		if err := <-second; err != nil {
			t.Fatalf("second delivery: %v", err)
		}
		if n := successes.Load(); n != 1 {
			t.Fatalf("handler succeeded %d times, want 1 (the racer, after the first attempt failed)", n)
		}
		if err := deliver(t.Context(), t, h, msg); err != nil || runs.Load() != 2 {
			t.Fatalf("redelivery after success: err %v, runs %d, want nil and 2", err, runs.Load())
		}
	})

	if opts.NonBlocking {
		t.Run("LockedClaimRetriesLater", func(t *testing.T) {
			t.Parallel()
			store := newStore(t)
			key := middleware.InboxKey{Consumer: unique(t), EventID: "e1"}
			c, ok, err := store.ClaimEvent(t.Context(), key)
			if err != nil || !ok {
				t.Fatalf("first claim: claimed %v, err %v; want true, nil", ok, err)
			}
			_, ok, err = store.ClaimEvent(t.Context(), key)
			if d, retry := ackwise.RetryAfterOf(err); ok || !retry || d <= 0 {
				t.Fatalf("claim of a locked key: claimed %v, err %v; want false and a RetryAfter error", ok, err)
			}
			if err := c.Rollback(t.Context()); err != nil {
				t.Fatalf("rollback: %v", err)
			}
			c, ok, err = store.ClaimEvent(t.Context(), key)
			if err != nil || !ok {
				t.Fatalf("claim after rollback: claimed %v, err %v; want true, nil", ok, err)
			}
			if err := c.Commit(t.Context()); err != nil {
				t.Fatalf("commit: %v", err)
			}
			if _, ok, err = store.ClaimEvent(t.Context(), key); ok || err != nil {
				t.Fatalf("claim after commit: claimed %v, err %v; want false, nil", ok, err)
			}
		})
	}
}

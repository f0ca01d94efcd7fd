package inboxtest

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
)

func versionMsg(agg string, v int64) *ackwise.Message {
	id := agg + "@" + strconv.FormatInt(v, 10)
	return &ackwise.Message{ID: id, Key: agg, Headers: ackwise.HeadersOf(ackwise.HeaderEventID, id, ackwise.HeaderAggregateVersion, strconv.FormatInt(v, 10)), Partition: -1, Offset: -1, Attempt: 1}
}

func gate(t testing.TB, store middleware.VersionStore, consumer string, h ackwise.HandlerFunc) ackwise.Handler {
	t.Helper()
	return gateCfg(t, store, middleware.VersionGateConfig{Consumer: consumer}, h)
}

func gateCfg(t testing.TB, store middleware.VersionStore, cfg middleware.VersionGateConfig, h ackwise.HandlerFunc) ackwise.Handler {
	t.Helper()
	mw, err := middleware.VersionGate(store, cfg)
	if err != nil {
		t.Fatalf("VersionGate: %v", err)
	}
	return mw(h)
}

// recordApplied is a handler that appends the version of each message it
// handles to applied (one goroutine at a time).
func recordApplied(applied *[]int64) ackwise.HandlerFunc {
	return func(ctx context.Context, msg *ackwise.Message) error {
		v, _ := middleware.AggregateVersion(msg)
		*applied = append(*applied, v)
		return nil
	}
}

// requireGapRefusal fails unless err is the gate's refusal of version v
// over the recorded version rec: permanent, wrapping ErrVersionGap and
// ErrInvalid, naming the header, the version and the recorded version.
func requireGapRefusal(t testing.TB, err error, v, rec int64) {
	t.Helper()
	if !errors.Is(err, middleware.ErrVersionGap) || !errors.Is(err, middleware.ErrInvalid) || ackwise.ClassOf(err) != ackwise.ClassPermanent {
		t.Fatalf("v%d: got %v (class %v), want a permanent error wrapping ErrVersionGap and ErrInvalid", v, err, ackwise.ClassOf(err))
	}
	for _, want := range []string{ackwise.HeaderAggregateVersion, " " + strconv.FormatInt(v, 10) + " ", "recorded version " + strconv.FormatInt(rec, 10)} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("v%d: error %q does not name %q", v, err, want)
		}
	}
}

// RunVersion runs the version gate conformance tests against the stores
// newStore returns (called once per subtest; subtests run in parallel). A
// store that is an InboxStore too is also tested nested in its own inbox
// claim.
func RunVersion(t *testing.T, newStore func(t *testing.T) middleware.VersionStore) {
	runVersionGap(t, newStore)
	t.Run("NewerOnly", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		var applied []int64
		h := gate(t, store, unique(t), recordApplied(&applied))
		for _, v := range []int64{1, 1, 3, 2, 3, 4} {
			if err := h.Handle(t.Context(), versionMsg("acct-1", v)); err != nil {
				t.Fatalf("v%d: %v", v, err)
			}
		}
		if want := []int64{1, 3, 4}; !equal(applied, want) {
			t.Fatalf("applied versions %v, want %v", applied, want)
		}
	})

	t.Run("FailureKeepsVersion", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		boom := errors.New("boom")
		var applied []int64
		fail := true
		h := gate(t, store, unique(t), func(ctx context.Context, msg *ackwise.Message) error {
			v, _ := middleware.AggregateVersion(msg)
			if v == 2 && fail {
				fail = false
				return boom
			}
			applied = append(applied, v)
			return nil
		})
		for _, step := range []struct {
			v       int64
			wantErr error
		}{{1, nil}, {2, boom}, {2, nil}, {2, nil}} {
			if err := h.Handle(t.Context(), versionMsg("acct-1", step.v)); !errors.Is(err, step.wantErr) {
				t.Fatalf("v%d: got %v, want %v", step.v, err, step.wantErr)
			}
		}
		if want := []int64{1, 2}; !equal(applied, want) {
			t.Fatalf("applied versions %v, want %v", applied, want)
		}
	})

	t.Run("FinishedWorkCommitsAfterCancel", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		var runs int
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		h := gate(t, store, unique(t), func(context.Context, *ackwise.Message) error {
			runs++
			cancel() // the engine's drain deadline passes as the handler finishes
			return nil
		})
		if err := h.Handle(ctx, versionMsg("acct-1", 1)); err != nil {
			t.Fatalf("handler returned nil but the delivery failed with %v once ctx ended; want its version committed", err)
		}
		if err := h.Handle(t.Context(), versionMsg("acct-1", 1)); err != nil {
			t.Fatalf("redelivery: %v", err)
		}
		if runs != 1 {
			t.Fatalf("handler ran %d times, want 1 (the redelivery of a committed version is stale)", runs)
		}
	})

	t.Run("AggregatesAreIndependent", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		var applied []string
		h := gate(t, store, unique(t), func(ctx context.Context, msg *ackwise.Message) error {
			applied = append(applied, msg.ID)
			return nil
		})
		for _, m := range []*ackwise.Message{versionMsg("a", 5), versionMsg("b", 1), versionMsg("a", 4), versionMsg("b", 2)} {
			if err := h.Handle(t.Context(), m); err != nil {
				t.Fatal(err)
			}
		}
		if want := []string{"a@5", "b@1", "b@2"}; len(applied) != 3 || applied[0] != want[0] || applied[1] != want[1] || applied[2] != want[2] {
			t.Fatalf("applied %v, want %v", applied, want)
		}
	})

	t.Run("ConcurrentNeverGoesBack", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		const n = 24
		var mu sync.Mutex
		var applied []int64
		h := gate(t, store, unique(t), func(ctx context.Context, msg *ackwise.Message) error {
			v, _ := middleware.AggregateVersion(msg)
			mu.Lock()
			applied = append(applied, v)
			mu.Unlock()
			return nil
		})
		start := make(chan struct{})
		var wg sync.WaitGroup
		for v := int64(1); v <= n; v++ {
			wg.Go(func() {
				<-start
				if err := h.Handle(t.Context(), versionMsg("acct", v)); err != nil {
					t.Errorf("v%d: %v", v, err)
				}
			})
		}
		close(start)
		wg.Wait()
		// Claims on one aggregate are serialized, so the order of the
		// handler calls is the commit order: it must only go forward.
		for i := 1; i < len(applied); i++ {
			if applied[i] <= applied[i-1] {
				t.Fatalf("applied %v: version %d after %d", applied, applied[i], applied[i-1])
			}
		}
		if len(applied) == 0 || applied[len(applied)-1] != n {
			t.Fatalf("applied %v, want it to end with %d", applied, n)
		}
	})
}

// runVersionGap runs the subtests of VersionGateConfig.MaxVersionGap and
// of versions below 1.
func runVersionGap(t *testing.T, newStore func(t *testing.T) middleware.VersionStore) {
	// A forged MaxInt64 was recorded, and every later real event of the
	// aggregate was acknowledged unrun as stale, for good.
	t.Run("ForgedMaxVersionIsRefused", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a claim left locked would hang
		defer cancel()
		store := newStore(t)
		var applied []int64
		h := gate(t, store, unique(t), recordApplied(&applied))
		for _, agg := range []string{"acct-old", "acct-new"} {
			rec := int64(0)
			if agg == "acct-old" {
				if err := h.Handle(ctx, versionMsg(agg, 1)); err != nil {
					t.Fatal(err)
				}
				rec = 1
			}
			requireGapRefusal(t, h.Handle(ctx, versionMsg(agg, math.MaxInt64)), math.MaxInt64, rec)
			// Nothing was recorded: the real next version applies.
			if err := h.Handle(ctx, versionMsg(agg, rec+1)); err != nil {
				t.Fatalf("%s v%d after the refusal: %v", agg, rec+1, err)
			}
		}
		if want := []int64{1, 2, 1}; !equal(applied, want) {
			t.Fatalf("applied versions %v, want %v", applied, want)
		}
	})

	t.Run("GapIsRelativeToTheRecordedVersion", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		store := newStore(t)
		var applied []int64
		h := gateCfg(t, store, middleware.VersionGateConfig{Consumer: unique(t), MaxVersionGap: 10}, recordApplied(&applied))
		for _, step := range []struct {
			v, refusedOver int64 // refusedOver: the recorded version, or -1 when applied
		}{{11, 0}, {10, -1}, {20, -1}, {31, 20}, {30, -1}, {5, -1 /* stale: acked unrun */}} {
			err := h.Handle(ctx, versionMsg("acct", step.v))
			if step.refusedOver >= 0 {
				requireGapRefusal(t, err, step.v, step.refusedOver)
			} else if err != nil {
				t.Fatalf("v%d: %v", step.v, err)
			}
		}
		if want := []int64{10, 20, 30}; !equal(applied, want) {
			t.Fatalf("applied versions %v, want %v", applied, want)
		}
	})

	// The default gap admits Unix nanosecond timestamps, as a first
	// version too, and far steps between them.
	t.Run("DefaultGapAdmitsTimestampVersions", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		var applied []int64
		h := gate(t, store, unique(t), recordApplied(&applied))
		year2100 := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
		now := time.Now().UnixNano()
		for _, v := range []int64{now, now + int64(24*time.Hour), year2100} {
			if err := h.Handle(t.Context(), versionMsg("acct", v)); err != nil {
				t.Fatalf("v%d: %v", v, err)
			}
		}
		if err := h.Handle(t.Context(), versionMsg("acct-2100", year2100)); err != nil {
			t.Fatalf("a new aggregate at v%d: %v", year2100, err)
		}
		if len(applied) != 4 {
			t.Fatalf("applied %v, want all 4", applied)
		}
	})

	t.Run("NoLimit", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		runs := 0
		h := gateCfg(t, store, middleware.VersionGateConfig{Consumer: unique(t), MaxVersionGap: middleware.NoVersionGapLimit}, func(context.Context, *ackwise.Message) error {
			runs++
			return nil
		})
		if err := h.Handle(t.Context(), versionMsg("acct", math.MaxInt64)); err != nil || runs != 1 {
			t.Fatalf("MaxInt64 without a gap limit: %v, %d runs", err, runs)
		}
	})

	t.Run("VersionsStartAtOne", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		runs := 0
		count := func(context.Context, *ackwise.Message) error { runs++; return nil }
		h := gate(t, store, unique(t), count)
		for _, v := range []int64{0, -1, math.MinInt64} {
			err := h.Handle(t.Context(), versionMsg("acct", v))
			if !errors.Is(err, middleware.ErrInvalid) || ackwise.ClassOf(err) != ackwise.ClassPermanent {
				t.Fatalf("v%d: got %v, want a permanent error wrapping ErrInvalid", v, err)
			}
		}
		// Also when a VersionFunc returns it.
		zero := gateCfg(t, store, middleware.VersionGateConfig{Consumer: unique(t), VersionFunc: func(*ackwise.Message) (int64, error) { return 0, nil }}, count)
		if err := zero.Handle(t.Context(), versionMsg("acct", 1)); !errors.Is(err, middleware.ErrInvalid) || ackwise.ClassOf(err) != ackwise.ClassPermanent {
			t.Fatalf("VersionFunc version 0: got %v, want a permanent error wrapping ErrInvalid", err)
		}
		if runs != 0 {
			t.Fatalf("the handler ran %d times", runs)
		}
	})

	// With an inbox of the same store outside it, the gate's claim is
	// nested in the inbox's transaction (a savepoint): a refusal rolls
	// back the gate's part and leaves the inbox's claim usable.
	t.Run("RefusalInsideAnInboxClaim", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		store := newStore(t)
		inboxStore, ok := store.(middleware.InboxStore)
		if !ok {
			return // not an inbox store too: nothing to nest in
		}
		consumer := unique(t)
		inbox, err := middleware.Inbox(inboxStore, middleware.InboxConfig{Consumer: consumer})
		if err != nil {
			t.Fatal(err)
		}
		gateMW, err := middleware.VersionGate(store, middleware.VersionGateConfig{Consumer: consumer, MaxVersionGap: 100})
		if err != nil {
			t.Fatal(err)
		}
		runs := 0
		h := ackwise.Chain(ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { runs++; return nil }), inbox, gateMW)
		requireGapRefusal(t, h.Handle(ctx, versionMsg("acct", 101)), 101, 0)
		for _, v := range []int64{100, 101} {
			if err := h.Handle(ctx, versionMsg("acct", v)); err != nil {
				t.Fatalf("v%d: %v", v, err)
			}
		}
		if runs != 2 {
			t.Fatalf("the handler ran %d times, want 2", runs)
		}
	})
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

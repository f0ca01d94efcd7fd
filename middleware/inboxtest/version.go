package inboxtest

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
)

func versionMsg(agg string, v int64) *ackwise.Message {
	id := agg + "@" + strconv.FormatInt(v, 10)
	return &ackwise.Message{ID: id, Key: agg, Headers: ackwise.HeadersOf(ackwise.HeaderEventID, id, ackwise.HeaderAggregateVersion, strconv.FormatInt(v, 10)), Partition: -1, Offset: -1, Attempt: 1}
}

func gate(t testing.TB, store middleware.VersionStore, consumer string, h ackwise.HandlerFunc) ackwise.Handler {
	t.Helper()
	mw, err := middleware.VersionGate(store, middleware.VersionGateConfig{Consumer: consumer})
	if err != nil {
		t.Fatalf("VersionGate: %v", err)
	}
	return mw(h)
}

// RunVersion runs the version gate conformance tests against the stores
// newStore returns (called once per subtest; subtests run in parallel).
func RunVersion(t *testing.T, newStore func(t *testing.T) middleware.VersionStore) {
	t.Run("NewerOnly", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		var applied []int64
		h := gate(t, store, unique(t), func(ctx context.Context, msg *ackwise.Message) error {
			v, _ := middleware.AggregateVersion(msg)
			applied = append(applied, v)
			return nil
		})
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

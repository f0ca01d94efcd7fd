package middleware_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/meminbox"
)

func counting(runs *atomic.Int32) ackwise.Handler {
	return ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { runs.Add(1); return nil })
}

func TestInboxConfigErrors(t *testing.T) {
	t.Parallel()
	for name, build := range map[string]func(*meminbox.Store, middleware.InboxConfig) error{
		"Inbox": func(s *meminbox.Store, cfg middleware.InboxConfig) error {
			var store middleware.InboxStore // a typed nil would not be nil
			if s != nil {
				store = s
			}
			_, err := middleware.Inbox(store, cfg)
			return err
		},
		"BatchInbox": func(s *meminbox.Store, cfg middleware.InboxConfig) error {
			var store middleware.BatchInboxStore
			if s != nil {
				store = s
			}
			_, err := middleware.BatchInbox(store, cfg)
			return err
		},
	} {
		if err := build(nil, middleware.InboxConfig{Consumer: "c"}); err == nil || !strings.Contains(err.Error(), name+" store is nil") {
			t.Errorf("%s, nil store: %v", name, err)
		}
		if err := build(meminbox.New(nil), middleware.InboxConfig{}); err == nil || !strings.Contains(err.Error(), "InboxConfig.Consumer") {
			t.Errorf("%s, empty consumer: %v", name, err)
		}
	}
}

func TestInboxMissingEventID(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	mw, _ := middleware.Inbox(meminbox.New(nil), middleware.InboxConfig{Consumer: "c"})
	err := mw(counting(&runs)).Handle(t.Context(), &ackwise.Message{Payload: []byte("x")})
	if !errors.Is(err, middleware.ErrNoEventID) || ackwise.ClassOf(err) != ackwise.ClassPermanent || runs.Load() != 0 {
		t.Fatalf("got %v (runs %d), want a permanent ErrNoEventID and no handler run", err, runs.Load())
	}
	mw, _ = middleware.Inbox(meminbox.New(nil), middleware.InboxConfig{Consumer: "c", AllowMissingKey: true})
	for range 2 {
		if err := mw(counting(&runs)).Handle(t.Context(), &ackwise.Message{}); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 2 {
		t.Fatalf("AllowMissingKey: handler ran %d times for 2 deliveries, want 2 (no dedupe)", runs.Load())
	}
}

func TestInboxKeyFunc(t *testing.T) {
	t.Parallel()
	store := meminbox.New(nil)
	var runs, dups atomic.Int32
	mw, err := middleware.Inbox(store, middleware.InboxConfig{
		Consumer: "c",
		KeyFunc: func(msg *ackwise.Message) (string, error) {
			switch msg.Headers.Get("order") {
			case "":
				return "", errors.New("no order header")
			case "throttled":
				return "", ackwise.RetryAfter(errors.New("lookup busy"), time.Second)
			}
			return "order-" + msg.Headers.Get("order"), nil
		},
		OnDuplicate: func(context.Context, *ackwise.Message) { dups.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(counting(&runs))
	for _, id := range []string{"a", "b"} { // same order, different event IDs
		if err := h.Handle(t.Context(), &ackwise.Message{ID: id, Headers: ackwise.HeadersOf("order", "7")}); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 1 || dups.Load() != 1 || !store.Handled(middleware.InboxKey{Consumer: "c", EventID: "order-7"}) {
		t.Fatalf("runs %d, duplicates %d; want 1 and 1 with key order-7", runs.Load(), dups.Load())
	}
	if err := h.Handle(t.Context(), &ackwise.Message{ID: "x"}); ackwise.ClassOf(err) != ackwise.ClassPermanent {
		t.Fatalf("KeyFunc error: %v, want permanent", err)
	}
	if err := h.Handle(t.Context(), &ackwise.Message{Headers: ackwise.HeadersOf("order", "throttled")}); ackwise.ClassOf(err) != ackwise.ClassRateLimited {
		t.Fatalf("classified KeyFunc error: %v, want its class kept", err)
	}
}

func TestInboxRollsBackOnCancelledContext(t *testing.T) {
	t.Parallel()
	store := meminbox.New(nil)
	mw, _ := middleware.Inbox(store, middleware.InboxConfig{Consumer: "c"})
	ctx, cancel := context.WithCancel(t.Context())
	h := mw(ackwise.HandlerFunc(func(ctx context.Context, _ *ackwise.Message) error {
		cancel() // the engine's shutdown deadline passes mid-handler
		return ctx.Err()
	}))
	if err := h.Handle(ctx, &ackwise.Message{ID: "e"}); !ackwise.IsShutdown(ctx, err) {
		t.Fatalf("got %v, want the cancellation", err)
	}
	// The claim was released: a redelivery claims at once (meminbox would
	// block on a pending claim until ctx's deadline).
	rctx, rcancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer rcancel()
	c, ok, err := store.ClaimEvent(rctx, middleware.InboxKey{Consumer: "c", EventID: "e"})
	if err != nil || !ok {
		t.Fatalf("claim after a cancelled attempt: %v, %v; want a fresh claim", ok, err)
	}
	_ = c.Rollback(rctx)
}

// faultyStore fails the way a real store can.
type faultyStore struct{ claimErr, commitErr error }

func (s faultyStore) ClaimEvent(context.Context, middleware.InboxKey) (middleware.Claim, bool, error) {
	if s.claimErr != nil {
		return nil, false, s.claimErr
	}
	return faultyClaim{s.commitErr}, true, nil
}

type faultyClaim struct{ commitErr error }

func (faultyClaim) Context(ctx context.Context) context.Context { return ctx }
func (c faultyClaim) Commit(context.Context) error              { return c.commitErr }
func (faultyClaim) Rollback(context.Context) error              { return nil }

func TestInboxStoreErrors(t *testing.T) {
	t.Parallel()
	down := errors.New("connection refused")
	for _, tc := range []struct {
		name  string
		store faultyStore
		class ackwise.Class
	}{
		{"claim", faultyStore{claimErr: down}, ackwise.ClassTransient},
		{"claim RetryAfter kept", faultyStore{claimErr: ackwise.RetryAfter(down, time.Second)}, ackwise.ClassRateLimited},
		{"commit", faultyStore{commitErr: down}, ackwise.ClassTransient},
	} {
		mw, _ := middleware.Inbox(tc.store, middleware.InboxConfig{Consumer: "c"})
		err := mw(returning(nil)).Handle(t.Context(), &ackwise.Message{ID: "e"})
		if !errors.Is(err, down) || ackwise.ClassOf(err) != tc.class {
			t.Errorf("%s: got %v (class %v), want the store's error as %v", tc.name, err, ackwise.ClassOf(err), tc.class)
		}
	}
}

func TestVersionGateConfigAndHeaders(t *testing.T) {
	t.Parallel()
	if _, err := middleware.VersionGate(nil, middleware.VersionGateConfig{Consumer: "c"}); err == nil {
		t.Error("nil store: no error")
	}
	if _, err := middleware.VersionGate(meminbox.New(nil), middleware.VersionGateConfig{}); err == nil || !strings.Contains(err.Error(), "VersionGateConfig.Consumer") {
		t.Errorf("empty consumer: %v", err)
	}
	var runs, stale atomic.Int32
	mw, err := middleware.VersionGate(meminbox.New(nil), middleware.VersionGateConfig{
		Consumer: "c",
		OnStale:  func(context.Context, *ackwise.Message, int64) { stale.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(counting(&runs))
	for _, m := range []*ackwise.Message{
		{Key: "a"}, // no version header
		{Key: "a", Headers: ackwise.HeadersOf(ackwise.HeaderAggregateVersion, "seven")},
		{Headers: ackwise.HeadersOf(ackwise.HeaderAggregateVersion, "1")}, // no aggregate
	} {
		err := h.Handle(t.Context(), m)
		if !errors.Is(err, middleware.ErrInvalid) || ackwise.ClassOf(err) != ackwise.ClassPermanent {
			t.Errorf("%+v: got %v, want a permanent ErrInvalid", m, err)
		}
	}
	for _, v := range []string{"2", "1"} {
		if err := h.Handle(t.Context(), &ackwise.Message{Key: "a", Headers: ackwise.HeadersOf(ackwise.HeaderAggregateVersion, v)}); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 1 || stale.Load() != 1 {
		t.Fatalf("runs %d, stale %d; want 1 and 1", runs.Load(), stale.Load())
	}
}

// ctxStore's commits fail on a done context, as a database driver's do.
type ctxStore struct{ committed *atomic.Bool }

func (s ctxStore) ClaimEvent(context.Context, middleware.InboxKey) (middleware.Claim, bool, error) {
	return ctxClaim(s), true, nil
}

type ctxClaim struct{ committed *atomic.Bool }

func (ctxClaim) Context(ctx context.Context) context.Context { return ctx }
func (ctxClaim) Rollback(context.Context) error              { return nil }
func (c ctxClaim) Commit(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.committed.Store(true)
	return nil
}

func TestInboxCommitsFinishedWorkAfterCancel(t *testing.T) {
	t.Parallel()
	var committed atomic.Bool
	mw, _ := middleware.Inbox(ctxStore{&committed}, middleware.InboxConfig{Consumer: "c"})
	ctx, cancel := context.WithCancel(t.Context())
	h := mw(ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		cancel() // shutdown arrives as the handler finishes its work
		return nil
	}))
	if err := h.Handle(ctx, &ackwise.Message{ID: "e"}); err != nil {
		t.Fatalf("got %v, want nil", err)
	}
	if !committed.Load() {
		t.Fatal("a finished handler's claim was not committed because ctx ended")
	}
}

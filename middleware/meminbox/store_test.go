package meminbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/inboxtest"
	"github.com/ackwise/ackwise/middleware/meminbox"
)

func TestInboxConformance(t *testing.T) {
	inboxtest.RunInbox(t, func(t *testing.T) middleware.InboxStore { return meminbox.New(nil) }, inboxtest.Options{})
}

func TestVersionConformance(t *testing.T) {
	inboxtest.RunVersion(t, func(t *testing.T) middleware.VersionStore { return meminbox.New(nil) })
}

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time                                    { return c.now }
func (c *fakeClock) AfterFunc(d time.Duration, f func()) ackwise.Timer { panic("unused") }

func TestPruneRemovesOnlyExpired(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s := meminbox.New(clock)
	commit := func(id string) {
		c, ok, err := s.ClaimEvent(t.Context(), middleware.InboxKey{Consumer: "c", EventID: id})
		if err != nil || !ok {
			t.Fatalf("claim %s: %v %v", id, ok, err)
		}
		if err := c.Commit(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	commit("old")
	clock.now = clock.now.Add(2 * time.Hour)
	commit("new")
	if n := s.Prune(-time.Hour); n != 0 {
		t.Fatalf("Prune(-1h) removed %d records, want 0 (a negative retention deleted everything)", n)
	}
	if n := s.Prune(time.Hour); n != 1 {
		t.Fatalf("Prune removed %d records, want 1", n)
	}
	if s.Handled(middleware.InboxKey{Consumer: "c", EventID: "old"}) {
		t.Error("expired record survived Prune")
	}
	if !s.Handled(middleware.InboxKey{Consumer: "c", EventID: "new"}) {
		t.Error("Prune removed a record younger than the retention")
	}
}

// TestEngineAppliesEachEventOnceUnderFaults runs inboxtest.RunEngine. The
// store does not roll effects back, so the handler applies its effect only
// when it succeeds; the store's promise is that the engine's duplicates,
// lost acks and crashes before the ack never run a succeeded event again.
func TestEngineAppliesEachEventOnceUnderFaults(t *testing.T) {
	t.Parallel()
	s := meminbox.New(nil)
	inboxtest.RunEngine(t, inboxtest.Engine{
		Store:   s,
		Handled: func(_ context.Context, key middleware.InboxKey) (bool, error) { return s.Handled(key), nil },
	})
}

func TestBatchConformance(t *testing.T) {
	s := meminbox.New(nil) // shared: the subtests' consumer names differ
	inboxtest.RunBatch(t, inboxtest.Batch{
		NewStore: func(*testing.T) middleware.BatchInboxStore { return s },
		Handled:  func(_ context.Context, key middleware.InboxKey) (bool, error) { return s.Handled(key), nil },
	})
}

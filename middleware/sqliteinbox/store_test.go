package sqliteinbox_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/inboxtest"
	"github.com/ackwise/ackwise/middleware/sqliteinbox"
)

type testBundle struct {
	db    *sql.DB
	store *sqliteinbox.Store
}

func setup(t testing.TB) *testBundle {
	t.Helper()
	db, err := sqliteinbox.Open(filepath.Join(t.TempDir(), "inbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store, err := sqliteinbox.New(db, sqliteinbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE effects (event_id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &testBundle{db: db, store: store}
}

func (b *testBundle) count(t testing.TB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := b.db.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func TestInboxConformance(t *testing.T) {
	b := setup(t)
	inboxtest.RunInbox(t, func(t *testing.T) middleware.InboxStore { return b.store }, inboxtest.Options{})
}

func TestVersionConformance(t *testing.T) {
	b := setup(t)
	inboxtest.RunVersion(t, func(t *testing.T) middleware.VersionStore { return b.store })
}

func msgFor(id string) *ackwise.Message {
	return &ackwise.Message{ID: id, Partition: -1, Offset: -1, Attempt: 1}
}

func effect(runs *atomic.Int32, fail func(n int32) error) ackwise.HandlerFunc {
	return func(ctx context.Context, msg *ackwise.Message) error {
		n := runs.Add(1)
		tx := sqliteinbox.Tx(ctx)
		if tx == nil {
			return errors.New("no transaction in the handler's context")
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO effects (event_id) VALUES (?)`, msg.ID); err != nil {
			return err
		}
		if fail != nil {
			return fail(n)
		}
		return nil
	}
}

func TestEffectCommitsWithRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	boom := errors.New("boom")
	var runs atomic.Int32
	mw, err := middleware.Inbox(b.store, middleware.InboxConfig{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(effect(&runs, func(n int32) error {
		if n == 1 {
			return boom
		}
		return nil
	}))
	if err := h.Handle(t.Context(), msgFor("e")); !errors.Is(err, boom) {
		t.Fatalf("got %v, want the handler's error", err)
	}
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 0 {
		t.Fatalf("%d effects after a failed attempt, want 0", n)
	}
	for range 3 {
		if err := h.Handle(t.Context(), msgFor("e")); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if ok, err := b.store.Handled(t.Context(), middleware.InboxKey{Consumer: "billing", EventID: "e"}); !ok || err != nil {
		t.Fatalf("Handled = %v, %v", ok, err)
	}
}

func TestConcurrentDeliveriesApplyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs atomic.Int32
	mw, err := middleware.Inbox(b.store, middleware.InboxConfig{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(effect(&runs, nil))
	const events, racers = 25, 4
	start := make(chan struct{})
	var wg sync.WaitGroup
	for e := range events {
		for range racers {
			wg.Go(func() {
				<-start
				if err := h.Handle(t.Context(), msgFor(string(rune('a'+e)))); err != nil {
					t.Error(err)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	if n := b.count(t, `SELECT count(*) FROM effects`); n != events {
		t.Fatalf("%d effects, want %d", n, events)
	}
}

func TestInboxAndGateShareTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in, err := middleware.Inbox(b.store, middleware.InboxConfig{Consumer: "p"})
	if err != nil {
		t.Fatal(err)
	}
	gate, err := middleware.VersionGate(b.store, middleware.VersionGateConfig{Consumer: "p"})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	var runs atomic.Int32
	h := ackwise.Chain(effect(&runs, func(n int32) error {
		if n == 1 {
			return boom
		}
		return nil
	}), in, gate)
	msg := msgFor("a@3")
	msg.Key, msg.Headers = "a", ackwise.Headers{ackwise.HeaderAggregateVersion: "3"}
	if err := h.Handle(t.Context(), msg); !errors.Is(err, boom) {
		t.Fatalf("got %v, want boom", err)
	}
	if _, ok, _ := b.store.Version(t.Context(), middleware.VersionKey{Consumer: "p", Aggregate: "a"}); ok {
		t.Fatal("version recorded after a failure")
	}
	if err := h.Handle(t.Context(), msg); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := b.store.Version(t.Context(), middleware.VersionKey{Consumer: "p", Aggregate: "a"}); v != 3 || !ok || err != nil {
		t.Fatalf("Version = %d %v %v, want 3", v, ok, err)
	}
	if ok, _ := b.store.Handled(t.Context(), middleware.InboxKey{Consumer: "p", EventID: "a@3"}); !ok {
		t.Fatal("inbox record missing")
	}
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}

func TestPruneRemovesOnlyExpired(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now()
	for id, age := range map[string]time.Duration{"old-1": 48 * time.Hour, "old-2": 25 * time.Hour, "kept-23h": 23 * time.Hour, "kept-now": 0} {
		if _, err := b.db.Exec(`INSERT INTO ackwise_inbox (consumer, event_id, processed_at) VALUES ('c', ?, ?)`, id, now.Add(-age).UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
	// More expired rows than one prune batch.
	if _, err := b.db.Exec(`WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 6000)
INSERT INTO ackwise_inbox (consumer, event_id, processed_at) SELECT 'bulk', 'e' || i, ? FROM s`, now.Add(-72*time.Hour).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	n, err := b.store.Prune(t.Context(), 24*time.Hour)
	if err != nil || n != 6002 {
		t.Fatalf("Prune = %d, %v; want 6002", n, err)
	}
	for id, want := range map[string]bool{"old-1": false, "old-2": false, "kept-23h": true, "kept-now": true} {
		if ok, _ := b.store.Handled(t.Context(), middleware.InboxKey{Consumer: "c", EventID: id}); ok != want {
			t.Errorf("after Prune(24h) Handled(%s) = %v, want %v", id, ok, want)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	db, err := sqliteinbox.Open(filepath.Join(t.TempDir(), "x.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, tc := range []struct {
		cfg  sqliteinbox.Config
		want string
	}{
		{sqliteinbox.Config{Table: "x y"}, `Config.Table "x y"`},
		{sqliteinbox.Config{VersionTable: "a.b"}, `Config.VersionTable "a.b"`},
		{sqliteinbox.Config{Table: "t", VersionTable: "T"}, `Config.VersionTable "T"`},
	} {
		if _, err := sqliteinbox.New(db, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v): %v, want an error containing %s", tc.cfg, err, tc.want)
		}
	}
	if _, err := sqliteinbox.Open(""); err == nil {
		t.Error(`Open(""): no error`)
	}
}

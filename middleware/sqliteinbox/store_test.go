package sqliteinbox_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"modernc.org/sqlite"

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
	msg.Key, msg.Headers = "a", ackwise.HeadersOf(ackwise.HeaderAggregateVersion, "3")
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
	// An in-memory database is one per pooled connection: claims on a
	// second connection found no tables.
	if db, err := sqliteinbox.Open(":memory:"); err == nil || !strings.Contains(err.Error(), `":memory:"`) {
		if db != nil {
			db.Close()
		}
		t.Errorf(`Open(":memory:"): %v, want an error naming the path`, err)
	}
}

// TestFinishedEffectKeptAfterCancel: a handler that wrote its effect and
// returned nil keeps it even when its context ends before the commit (the
// engine's drain deadline). database/sql rolls back a transaction whose
// BeginTx context ends, so the claim's transaction must not be bound to the
// handler's context.
func TestFinishedEffectKeptAfterCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs atomic.Int32
	mw, err := middleware.Inbox(b.store, middleware.InboxConfig{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	h := mw(effect(&runs, func(int32) error {
		cancel()
		return nil
	}))
	if err := h.Handle(ctx, msgFor("e")); err != nil {
		t.Fatalf("finished handler, ctx ended before the commit: %v; want nil", err)
	}
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("%d effects, want 1 (the finished work committed)", n)
	}
	if ok, err := b.store.Handled(t.Context(), middleware.InboxKey{Consumer: "billing", EventID: "e"}); !ok || err != nil {
		t.Fatalf("Handled = %v, %v; want true", ok, err)
	}
}

// TestCancelledClaimReleasesTheLock: a claim whose context is already done
// fails and leaves neither a record nor SQLite's write lock behind.
func TestCancelledClaimReleasesTheLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	key := middleware.InboxKey{Consumer: "c", EventID: "e"}
	if c, ok, err := b.store.ClaimEvent(ctx, key); err == nil || ok || c != nil {
		t.Fatalf("claim with a done context: %v, %v, %v; want an error", c, ok, err)
	}
	// The write lock is free: a claim succeeds well within the busy timeout.
	wctx, wcancel := context.WithTimeout(t.Context(), sqliteinbox.DefaultBusyTimeout/2)
	defer wcancel()
	c, ok, err := b.store.ClaimEvent(wctx, key)
	if err != nil || !ok {
		t.Fatalf("claim after a cancelled one: %v, %v; want a fresh claim", ok, err)
	}
	if err := c.Commit(wctx); err != nil {
		t.Fatal(err)
	}
}

// TestOpenAwkwardPaths: Open uses the file at exactly the path given, with
// the busy timeout and WAL, even when the path holds characters that a file:
// URI gives a meaning ("a?b.db" used to open "a" without the pragmas).
func TestOpenAwkwardPaths(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, name := range []string{"a?b.db", "100%25.db", "x#y.db", "p%q.db", "plain.db"} {
		path := filepath.Join(dir, name)
		db, err := sqliteinbox.Open(path)
		if err != nil {
			t.Fatalf("Open(%q): %v", name, err)
		}
		var busy int
		var journal string
		err = db.QueryRow(`PRAGMA busy_timeout`).Scan(&busy)
		if err == nil {
			err = db.QueryRow(`PRAGMA journal_mode`).Scan(&journal)
		}
		if err == nil {
			_, err = db.Exec(`CREATE TABLE t (x INTEGER)`)
		}
		db.Close()
		if err != nil {
			t.Fatalf("%q: %v", name, err)
		}
		if busy != int(sqliteinbox.DefaultBusyTimeout.Milliseconds()) || journal != "wal" {
			t.Errorf("%q: busy_timeout %d, journal_mode %q; want %d and wal", name, busy, journal, sqliteinbox.DefaultBusyTimeout.Milliseconds())
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%q: the database is not at the path given: %v", name, err)
		}
	}
}

// TestPruneEveryValidates: settings that would make every run fail are
// refused at once instead of becoming a job that silently never prunes.
func TestPruneEveryValidates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		interval, olderThan time.Duration
		want                string
	}{
		{0, time.Hour, "interval 0s"},
		{time.Hour, -time.Second, "olderThan -1s"},
	} {
		// The bound only stops the old behaviour from hanging the test.
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		err := b.store.PruneEvery(ctx, tc.interval, tc.olderThan, nil)
		ended := ctx.Err()
		cancel()
		if err == nil || ended != nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("PruneEvery(%v, %v): %v; want an error containing %q at once", tc.interval, tc.olderThan, err, tc.want)
		}
	}
}

// TestTwoStoresOnOneDBShareTransaction: the inbox and the version gate on two
// Store values over one *sql.DB (different tables) run in one transaction. A
// second transaction would wait for the write lock the first holds until
// the busy timeout, failing every message.
func TestTwoStoresOnOneDBShareTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gateStore, err := sqliteinbox.New(b.db, sqliteinbox.Config{Table: "inbox2", VersionTable: "versions2"})
	if err != nil {
		t.Fatal(err)
	}
	if err := gateStore.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	in, err := middleware.Inbox(b.store, middleware.InboxConfig{Consumer: "p"})
	if err != nil {
		t.Fatal(err)
	}
	gate, err := middleware.VersionGate(gateStore, middleware.VersionGateConfig{Consumer: "p"})
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
	msg.Key, msg.Headers = "a", ackwise.HeadersOf(ackwise.HeaderAggregateVersion, "3")
	// Bounded well below the busy timeout, so the old behaviour fails fast.
	ctx, cancel := context.WithTimeout(t.Context(), sqliteinbox.DefaultBusyTimeout/4)
	defer cancel()
	if err := h.Handle(ctx, msg); !errors.Is(err, boom) {
		t.Fatalf("got %v, want boom", err)
	}
	if _, ok, _ := gateStore.Version(ctx, middleware.VersionKey{Consumer: "p", Aggregate: "a"}); ok {
		t.Fatal("version recorded after a failure")
	}
	if err := h.Handle(ctx, msg); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := gateStore.Version(ctx, middleware.VersionKey{Consumer: "p", Aggregate: "a"}); v != 3 || !ok || err != nil {
		t.Fatalf("Version = %d %v %v, want 3", v, ok, err)
	}
	if ok, _ := b.store.Handled(ctx, middleware.InboxKey{Consumer: "p", EventID: "a@3"}); !ok {
		t.Fatal("inbox record missing")
	}
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}

// TestInterruptedWriteIsNotAcknowledged: a write statement interrupted by
// its context makes SQLite roll back the claim's whole transaction (record
// included), and a statement the handler runs after it commits on its own
// (see Tx). A handler that swallows the interruption and returns nil must
// not get its message acknowledged: the record is gone, so the commit fails
// and the message is retried.
func TestInterruptedWriteIsNotAcknowledged(t *testing.T) {
	t.Parallel()
	registerCancelFunc.Do(func() {
		err := sqlite.RegisterScalarFunction("ackwise_test_cancel", 0, func(*sqlite.FunctionContext, []driver.Value) (driver.Value, error) {
			if f := interruptHook.Load(); f != nil {
				(*f)()
			}
			return "junk", nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	b := setup(t) // after the registration: its connections have the function
	mw, err := middleware.Inbox(b.store, middleware.InboxConfig{Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		tx := sqliteinbox.Tx(ctx)
		qctx, cancel := context.WithCancel(ctx)
		defer cancel()
		// An endless write that cancels its own context from its first
		// row, so that the cancel comes while it runs.
		interruptHook.Store(&cancel)
		_, err := tx.ExecContext(qctx, `WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM n) INSERT INTO effects SELECT ackwise_test_cancel() FROM n`)
		if !errors.Is(err, context.Canceled) {
			return fmt.Errorf("endless write: got %v, want it interrupted", err)
		}
		// The error is swallowed; this write commits outside the claim.
		_, err = tx.ExecContext(ctx, `INSERT INTO effects (event_id) VALUES (?)`, msg.ID)
		return err
	}))
	err = h.Handle(t.Context(), msgFor("e"))
	if err == nil {
		t.Fatal("the claim's transaction was rolled back by the interruption, yet the message was acknowledged")
	}
	if c := ackwise.ClassOf(err); c != ackwise.ClassTransient {
		t.Fatalf("%v classified %v, want transient", err, c)
	}
	if ok, err := b.store.Handled(t.Context(), middleware.InboxKey{Consumer: "c", EventID: "e"}); ok || err != nil {
		t.Fatalf("Handled = %v, %v; want false (the record rolled back with the transaction)", ok, err)
	}
	// What Tx's documentation warns of: the write after the interruption
	// committed on its own, so a retry applies it again.
	if n := b.count(t, `SELECT count(*) FROM effects WHERE event_id = 'e'`); n != 1 {
		t.Fatalf("%d effects of the write after the interruption, want 1 (committed outside the claim, as Tx documents)", n)
	}
}

var (
	registerCancelFunc sync.Once
	// interruptHook is what ackwise_test_cancel() calls.
	interruptHook atomic.Pointer[context.CancelFunc]
)

// TestEngineAppliesEachEventOnceUnderFaults runs inboxtest.RunEngine: the
// engine on the memory broker with every settle and dead-letter fault, and a
// handler that writes its effect row through Tx before failing on some
// events.
func TestEngineAppliesEachEventOnceUnderFaults(t *testing.T) {
	t.Parallel()
	inboxtest.RunEngine(t, engineOf(setup(t)))
}

// TestBatchEngineAppliesEachEventOnceUnderFaults is the same with a batch
// handler under BatchInbox (inboxtest.RunEngineBatch).
func TestBatchEngineAppliesEachEventOnceUnderFaults(t *testing.T) {
	t.Parallel()
	inboxtest.RunEngineBatch(t, engineOf(setup(t)))
}

// engineOf is the inboxtest.Engine of b's store, writing an effect row
// through Tx.
func engineOf(b *testBundle) inboxtest.Engine {
	return inboxtest.Engine{
		Store:   b.store,
		Handled: b.store.Handled,
		Apply: func(ctx context.Context, msg *ackwise.Message) error {
			_, err := sqliteinbox.Tx(ctx).ExecContext(ctx, `INSERT INTO effects (event_id) VALUES (?)`, msg.ID)
			return err
		},
		Effects: func(t testing.TB, id string) int {
			return b.count(t, `SELECT count(*) FROM effects WHERE event_id = ?`, id)
		},
		Transactional: true,
	}
}

package pginbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/internal/pgtest"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/inboxtest"
	"github.com/ackwise/ackwise/middleware/pginbox"
)

func TestInboxConformance(t *testing.T) {
	eachMode(t, func(t *testing.T, mode func(*pginbox.Config)) {
		b := setup(t, mode)
		inboxtest.RunInbox(t, func(t *testing.T) middleware.InboxStore { return b.store }, inboxtest.Options{})
	})
}

func TestVersionConformance(t *testing.T) {
	b := setup(t)
	inboxtest.RunVersion(t, func(t *testing.T) middleware.VersionStore { return b.store })
}

func msgFor(id string) *ackwise.Message {
	return &ackwise.Message{ID: id, Headers: ackwise.HeadersOf(ackwise.HeaderEventID, id), Partition: -1, Offset: -1, Attempt: 1}
}

// effectHandler inserts one effect row through the inbox transaction, then
// returns what fail says.
func (b *testBundle) effectHandler(runs *atomic.Int32, fail func(n int32) error) ackwise.HandlerFunc {
	return func(ctx context.Context, msg *ackwise.Message) error {
		n := runs.Add(1)
		tx := pginbox.Tx(ctx)
		if tx == nil {
			return errors.New("no transaction in the handler's context")
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+b.schema+`.effects (event_id, amount) VALUES ($1, 10)`, msg.ID); err != nil {
			return err
		}
		if fail != nil {
			return fail(n)
		}
		return nil
	}
}

func inbox(t testing.TB, store middleware.InboxStore, consumer string, h ackwise.Handler) ackwise.Handler {
	t.Helper()
	mw, err := middleware.Inbox(store, middleware.InboxConfig{Consumer: consumer})
	if err != nil {
		t.Fatal(err)
	}
	return mw(h)
}

func TestEffectCommitsWithRecord(t *testing.T) {
	eachMode(t, func(t *testing.T, mode func(*pginbox.Config)) {
		b := setup(t, mode)
		boom := errors.New("downstream failed after the effect was written")
		var runs atomic.Int32
		h := inbox(t, b.store, "billing", b.effectHandler(&runs, func(n int32) error {
			if n == 1 {
				return boom
			}
			return nil
		}))
		msg := msgFor("topup-1")
		key := middleware.InboxKey{Consumer: "billing", EventID: "topup-1"}

		if err := h.Handle(t.Context(), msg); !errors.Is(err, boom) {
			t.Fatalf("failing attempt: got %v, want the handler's error", err)
		}
		if n := b.effects(t, "topup-1"); n != 0 {
			t.Fatalf("after a failed attempt: %d effect rows, want 0 (rolled back with the record)", n)
		}
		if ok, err := b.store.Handled(t.Context(), key); err != nil || ok {
			t.Fatalf("after a failed attempt: Handled = %v, %v; want false (no record)", ok, err)
		}

		for i := range 3 { // the retry, then two redeliveries after the commit
			if err := h.Handle(t.Context(), msg); err != nil {
				t.Fatalf("delivery %d: %v", i+2, err)
			}
		}
		if n := b.effects(t, "topup-1"); n != 1 {
			t.Fatalf("%d effect rows, want 1", n)
		}
		if ok, err := b.store.Handled(t.Context(), key); err != nil || !ok {
			t.Fatalf("Handled = %v, %v; want true", ok, err)
		}
		if n := runs.Load(); n != 2 {
			t.Fatalf("handler ran %d times, want 2 (the failure and the retry)", n)
		}
	})
}

func TestIdenticalPayloadsAreDistinctEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs atomic.Int32
	h := inbox(t, b.store, "billing", b.effectHandler(&runs, nil))
	// Two top-ups with the same payload and key but different event IDs.
	for _, id := range []string{"topup-a", "topup-b"} {
		m := msgFor(id)
		m.Key, m.Payload = "acct-1", []byte(`{"amount":10}`)
		if err := h.Handle(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM `+b.schema+`.effects`); n != 2 {
		t.Fatalf("%d effects for two events with identical payloads, want 2", n)
	}
}

// TestRacingConsumersApplyOnce runs two consumer instances (two pools, two
// Stores, one consumer name) delivering the same events at the same time, as
// a broker does after a rebalance or a lease expiry.
func TestRacingConsumersApplyOnce(t *testing.T) {
	eachMode(t, func(t *testing.T, mode func(*pginbox.Config)) {
		b := setup(t, mode)
		other, err := pginbox.New(pgtest.Connect(t, 8), b.cfg)
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		effect := b.effectHandler(&runs, nil)
		instances := []ackwise.Handler{inbox(t, b.store, "billing", effect), inbox(t, other, "billing", effect)}
		const events, perInstance = 40, 3
		start := make(chan struct{})
		var wg sync.WaitGroup
		for e := range events {
			for _, h := range instances {
				for range perInstance {
					wg.Go(func() {
						<-start
						if err := h.Handle(t.Context(), msgFor(fmt.Sprintf("ev-%d", e))); err != nil {
							t.Errorf("ev-%d: %v", e, err)
						}
					})
				}
			}
		}
		close(start)
		wg.Wait()
		if n := b.count(t, `SELECT count(*) FROM `+b.schema+`.effects`); n != events {
			t.Errorf("%d effect rows for %d events delivered %d times each, want %d", n, events, 2*perInstance, events)
		}
		if n := b.count(t, `SELECT count(DISTINCT event_id) FROM `+b.schema+`.effects`); n != events {
			t.Errorf("%d distinct events applied, want %d", n, events)
		}
		if n := runs.Load(); n != events {
			t.Errorf("handler ran %d times, want %d", n, events)
		}
	})
}

// waitForLockWait polls pg_stat_activity until a backend waits on a lock
// while running the inbox claim: the second claimer is blocked on the first
// claimer's uncommitted row. There is no signal for this but the server's
// own view.
func (b *testBundle) waitForLockWait(t *testing.T) { b.waitForLockWaiters(t, 1) }

// waitForLockWaiters waits until n claimers are blocked on row locks.
func (b *testBundle) waitForLockWaiters(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		waiting := b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`,
			`%INSERT INTO `+b.schema+`.%`)
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d claimer(s) blocked on another claim's row lock, want %d", waiting, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSecondClaimerWaitsForFirst(t *testing.T) {
	t.Parallel()
	for _, m := range claimModes {
		for _, firstFails := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/firstFails=%v", m.name, firstFails), func(t *testing.T) {
				t.Parallel()
				b := setup(t, m.opt)
				entered, release := make(chan struct{}), make(chan struct{})
				unblock := sync.OnceFunc(func() { close(release) })
				t.Cleanup(unblock) // a failing test must not leave the handler blocked
				boom := errors.New("first attempt fails")
				var runs atomic.Int32
				h := inbox(t, b.store, "billing", b.effectHandler(&runs, func(n int32) error {
					if n == 1 {
						close(entered)
						<-release
						if firstFails {
							return boom
						}
					}
					return nil
				}))
				first := make(chan error, 1)
				go func() { first <- h.Handle(t.Context(), msgFor("ev")) }()
				<-entered
				second := make(chan error, 1)
				go func() { second <- h.Handle(t.Context(), msgFor("ev")) }()
				b.waitForLockWait(t)
				if n := runs.Load(); n != 1 {
					t.Fatalf("handler ran %d times while the first claim was open, want 1", n)
				}
				unblock()
				if err := <-first; (err != nil) != firstFails {
					t.Fatalf("first delivery: %v", err)
				}
				if err := <-second; err != nil {
					t.Fatalf("second delivery: %v", err)
				}
				wantRuns := int32(1)
				if firstFails {
					wantRuns = 2
				}
				if n := runs.Load(); n != wantRuns {
					t.Fatalf("handler ran %d times, want %d", n, wantRuns)
				}
				if n := b.effects(t, "ev"); n != 1 {
					t.Fatalf("%d effect rows, want 1", n)
				}
			})
		}
	}
}

func TestPruneRemovesOnlyExpired(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	table := b.schema + ".inbox"
	// 12000 expired rows (more than two prune batches), a few around the
	// boundary, and fresh ones.
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+table+` (consumer, event_id, processed_at)
SELECT 'c', 'old-' || i, now() - interval '2 days' FROM generate_series(1, 12000) AS i`); err != nil {
		t.Fatal(err)
	}
	for id, age := range map[string]string{"expired-25h": "25 hours", "kept-23h": "23 hours", "kept-1m": "1 minute"} {
		if _, err := b.pool.Exec(ctx, `INSERT INTO `+table+` (consumer, event_id, processed_at) VALUES ('c', $1, now() - $2::interval)`, id, age); err != nil {
			t.Fatal(err)
		}
	}
	h := inbox(t, b.store, "c", ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil }))
	if err := h.Handle(ctx, msgFor("kept-now")); err != nil {
		t.Fatal(err)
	}

	n, err := b.store.Prune(ctx, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if n != 12001 {
		t.Errorf("Prune removed %d rows, want 12001", n)
	}
	var left []string
	rows, err := b.pool.Query(ctx, `SELECT event_id FROM `+table+` ORDER BY event_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		left = append(left, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(left, ","), "kept-1m,kept-23h,kept-now"; got != want {
		t.Errorf("after Prune(24h) the inbox holds %s, want %s", got, want)
	}
	if _, err := b.store.Prune(ctx, -time.Second); err == nil {
		t.Error("Prune with a negative retention: no error")
	}
}

func TestInboxAndGateShareTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in, err := middleware.Inbox(b.store, middleware.InboxConfig{Consumer: "proj"})
	if err != nil {
		t.Fatal(err)
	}
	gate, err := middleware.VersionGate(b.store, middleware.VersionGateConfig{Consumer: "proj"})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	var runs atomic.Int32
	h := ackwise.Chain(b.effectHandler(&runs, func(n int32) error {
		if n == 1 {
			return boom
		}
		return nil
	}), in, gate)
	msg := msgFor("acct-1@7")
	msg.Key = "acct-1"
	msg.Headers.Set(ackwise.HeaderAggregateVersion, "7")
	vkey := middleware.VersionKey{Consumer: "proj", Aggregate: "acct-1"}
	ikey := middleware.InboxKey{Consumer: "proj", EventID: "acct-1@7"}

	if err := h.Handle(t.Context(), msg); !errors.Is(err, boom) {
		t.Fatalf("got %v, want the handler's error", err)
	}
	if _, ok, err := b.store.Version(t.Context(), vkey); ok || err != nil {
		t.Fatalf("after a failure the version was recorded (%v, %v)", ok, err)
	}
	if ok, err := b.store.Handled(t.Context(), ikey); ok || err != nil {
		t.Fatalf("after a failure the inbox record exists (%v, %v)", ok, err)
	}
	if err := h.Handle(t.Context(), msg); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := b.store.Version(t.Context(), vkey); v != 7 || !ok || err != nil {
		t.Fatalf("Version = %d, %v, %v; want 7", v, ok, err)
	}
	if ok, err := b.store.Handled(t.Context(), ikey); !ok || err != nil {
		t.Fatalf("Handled = %v, %v; want true", ok, err)
	}
	if n := b.effects(t, "acct-1@7"); n != 1 {
		t.Fatalf("%d effect rows, want 1", n)
	}
	// Both middleware ran in one transaction: one backend, not two, per
	// message. A nested claim reuses the outer claim's connection.
	var outerPID, innerPID uint32
	probe := ackwise.Chain(ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		return pginbox.Tx(ctx).QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&innerPID)
	}), in, func(next ackwise.Handler) ackwise.Handler {
		return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
			if err := pginbox.Tx(ctx).QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&outerPID); err != nil {
				return err
			}
			return next.Handle(ctx, msg)
		})
	}, gate)
	m2 := msgFor("acct-2@1")
	m2.Key = "acct-2"
	m2.Headers.Set(ackwise.HeaderAggregateVersion, "1")
	if err := probe.Handle(t.Context(), m2); err != nil {
		t.Fatal(err)
	}
	if outerPID == 0 || outerPID != innerPID {
		t.Fatalf("inbox ran on backend %d and the gate on %d, want one transaction", outerPID, innerPID)
	}
}

func TestHandlerCannotEndTheTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if pginbox.Tx(t.Context()) != nil {
		t.Fatal("Tx outside a claim is not nil")
	}
	h := inbox(t, b.store, "c", ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		tx := pginbox.Tx(ctx)
		if err := tx.Commit(ctx); !errors.Is(err, pginbox.ErrTxOwned) {
			return fmt.Errorf("Commit: got %v, want ErrTxOwned", err)
		}
		if err := tx.Rollback(ctx); !errors.Is(err, pginbox.ErrTxOwned) {
			return fmt.Errorf("Rollback: got %v, want ErrTxOwned", err)
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+b.schema+`.effects VALUES ($1, 1)`, msg.ID)
		return err
	}))
	if err := h.Handle(t.Context(), msgFor("e")); err != nil {
		t.Fatal(err)
	}
	if n := b.effects(t, "e"); n != 1 {
		t.Fatalf("%d effect rows, want 1", n)
	}
}

func TestSwallowedStatementErrorFailsCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A handler that ignores a failed statement leaves the transaction
	// aborted; the commit must fail and the message be retried, not
	// acknowledged with no effect.
	h := inbox(t, b.store, "c", ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		_, _ = pginbox.Tx(ctx).Exec(ctx, `INSERT INTO no_such_table VALUES (1)`)
		return nil
	}))
	err := h.Handle(t.Context(), msgFor("e"))
	if err == nil {
		t.Fatal("handler swallowed a failed statement and the inbox acknowledged the message")
	}
	if ackwise.ClassOf(err) != ackwise.ClassTransient {
		t.Fatalf("class %v, want transient", ackwise.ClassOf(err))
	}
	if ok, _ := b.store.Handled(t.Context(), middleware.InboxKey{Consumer: "c", EventID: "e"}); ok {
		t.Fatal("the record committed although the transaction was aborted")
	}
}

func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := pginbox.Config{Table: strings.Trim(b.schema, `"`) + ".inbox2", VersionTable: strings.Trim(b.schema, `"`) + ".versions2"}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			s, err := pginbox.New(b.pool, cfg)
			if err == nil {
				err = s.Migrate(t.Context())
			}
			if err != nil {
				t.Errorf("Migrate: %v", err)
			}
		})
	}
	wg.Wait()
	if n := b.count(t, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = 'inbox2_processed_at_idx'`, strings.Trim(b.schema, `"`)); n != 1 {
		t.Fatalf("prune index missing after Migrate")
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	pool := pgtest.Connect(t, 1)
	for _, tc := range []struct {
		cfg  pginbox.Config
		want string // in the error; "" means valid
	}{
		{pginbox.Config{}, ""},
		{pginbox.Config{Table: "app.inbox", VersionTable: "app.versions"}, ""},
		{pginbox.Config{Table: "inbox; DROP TABLE x"}, `Config.Table "inbox; DROP TABLE x"`},
		{pginbox.Config{Table: "a.b.c"}, `Config.Table "a.b.c"`},
		{pginbox.Config{Table: "1inbox"}, `Config.Table "1inbox"`},
		{pginbox.Config{Table: strings.Repeat("x", 47)}, `Config.Table "xxx`},
		{pginbox.Config{VersionTable: `"quoted"`}, `Config.VersionTable "\"quoted\""`},
		{pginbox.Config{Table: "same", VersionTable: "SAME"}, `Config.VersionTable "SAME"`},
		{pginbox.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}, ""},
		{pginbox.Config{TxOptions: pgx.TxOptions{BeginQuery: "BEGIN"}}, `Config.TxOptions.BeginQuery "BEGIN"`},
		{pginbox.Config{TxOptions: pgx.TxOptions{AccessMode: pgx.ReadOnly}}, `Config.TxOptions.AccessMode "read only"`},
		{pginbox.Config{TxOptions: pgx.TxOptions{IsoLevel: "chaos"}}, `Config.TxOptions.IsoLevel "chaos"`},
	} {
		_, err := pginbox.New(pool, tc.cfg)
		if tc.want == "" {
			if err != nil {
				t.Errorf("New(%+v): %v", tc.cfg, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v): error %v, want one containing %s", tc.cfg, err, tc.want)
		}
	}
	if _, err := pginbox.New(nil, pginbox.Config{}); err == nil {
		t.Error("New(nil db): no error")
	}
}

func TestAwkwardEventIDs(t *testing.T) {
	eachMode(t, func(t *testing.T, mode func(*pginbox.Config)) {
		b := setup(t, mode)
		var runs atomic.Int32
		h := inbox(t, b.store, "o'brien\\", b.effectHandler(&runs, nil))
		ids := []string{`it's`, `back\slash`, `'); DROP TABLE effects; --`, `E'x\'`, "ключ-🔑", "$$", strings.Repeat("x", 2000)}
		for _, id := range ids {
			for range 2 {
				if err := h.Handle(t.Context(), msgFor(id)); err != nil {
					t.Fatalf("event %q: %v", id, err)
				}
			}
			if n := b.effects(t, id); n != 1 {
				t.Errorf("event %q: %d effects, want 1", id, n)
			}
			if ok, err := b.store.Handled(t.Context(), middleware.InboxKey{Consumer: "o'brien\\", EventID: id}); !ok || err != nil {
				t.Errorf("event %q: Handled = %v, %v", id, ok, err)
			}
		}
		if n := runs.Load(); n != int32(len(ids)) {
			t.Errorf("handler ran %d times for %d events delivered twice, want %d", n, len(ids), len(ids))
		}
		// PostgreSQL text cannot hold NUL: an error, not a claim, and a
		// permanent one (retrying cannot cure it); so is a key too long
		// for the index.
		long := make([]byte, 16<<10) // random: PostgreSQL compresses a repetitive one below the limit
		_, _ = rand.Read(long)
		for _, id := range []string{"nul\x00byte", hex.EncodeToString(long)} {
			err := h.Handle(t.Context(), msgFor(id))
			if err == nil {
				t.Errorf("event ID %.20q… was accepted", id)
			} else if c := ackwise.ClassOf(err); c != ackwise.ClassPermanent {
				t.Errorf("event ID %.20q…: %v classified %v, want permanent", id, err, c)
			}
		}
	})
}

func TestDuplicatesKeepTheirConnections(t *testing.T) {
	eachMode(t, func(t *testing.T, mode func(*pginbox.Config)) {
		b := setup(t, mode)
		var runs atomic.Int32
		h := inbox(t, b.store, "c", b.effectHandler(&runs, nil))
		if err := h.Handle(t.Context(), msgFor("dup")); err != nil {
			t.Fatal(err)
		}
		before := b.pool.Stat().NewConnsCount()
		for range 20 {
			if err := h.Handle(t.Context(), msgFor("dup")); err != nil {
				t.Fatal(err)
			}
		}
		if after := b.pool.Stat().NewConnsCount(); after != before {
			t.Fatalf("20 duplicates opened %d new connections, want 0 (the pool destroyed the ones they used)", after-before)
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want 1", n)
		}
	})
}

func TestIsolationLevel(t *testing.T) {
	eachMode(t, func(t *testing.T, mode func(*pginbox.Config)) {
		for _, iso := range []pgx.TxIsoLevel{pgx.Serializable, pgx.RepeatableRead} {
			b := setup(t, mode, func(c *pginbox.Config) { c.TxOptions.IsoLevel = iso })
			var got string
			h := inbox(t, b.store, "c", ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
				return pginbox.Tx(ctx).QueryRow(ctx, `SHOW transaction_isolation`).Scan(&got)
			}))
			if err := h.Handle(t.Context(), msgFor("e")); err != nil {
				t.Fatal(err)
			}
			if got != string(iso) {
				t.Errorf("handler ran at isolation %q, want %q", got, iso)
			}
		}
	})
}

func TestPruneEvery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	table := b.schema + ".inbox"
	if _, err := b.pool.Exec(t.Context(), `INSERT INTO `+table+` (consumer, event_id, processed_at) VALUES ('c', 'old', now() - interval '2 days'), ('c', 'new', now())`); err != nil {
		t.Fatal(err)
	}
	if err := b.store.PruneEvery(t.Context(), 0, time.Hour, nil); err == nil {
		t.Fatal("PruneEvery with a zero interval: no error")
	}
	// A negative retention fails every run: it must be refused at once, not
	// become a job that silently never prunes (the bound only stops the
	// old behaviour from hanging the test).
	vctx, vcancel := context.WithTimeout(t.Context(), time.Second)
	err := b.store.PruneEvery(vctx, time.Hour, -time.Second, nil)
	ended := vctx.Err()
	vcancel()
	if err == nil || ended != nil || !strings.Contains(err.Error(), "olderThan -1s") {
		t.Fatalf("PruneEvery with a negative olderThan: %v; want an error naming it at once", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- b.store.PruneEvery(ctx, 10*time.Millisecond, 24*time.Hour, func(err error) { t.Errorf("prune run: %v", err) })
	}()
	deadline := time.Now().Add(10 * time.Second)
	for b.count(t, `SELECT count(*) FROM `+table+` WHERE event_id = 'old'`) != 0 { // the job's effect, seen in the database
		if time.Now().After(deadline) {
			t.Fatal("the retention job never pruned the expired record")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("PruneEvery returned %v after cancel, want context.Canceled", err)
	}
	if n := b.count(t, `SELECT count(*) FROM `+table+` WHERE event_id = 'new'`); n != 1 {
		t.Fatal("the retention job removed a fresh record")
	}
}

// TestTwoStoresOnOnePoolShareTransaction: the inbox and the version gate on
// two Store values over one pool run in one transaction (one backend), so
// that they commit together and a message holds one connection, not two.
func TestTwoStoresOnOnePoolShareTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	schema := strings.Trim(b.schema, `"`)
	gateStore, err := pginbox.New(b.pool, pginbox.Config{Table: schema + ".inbox2", VersionTable: schema + ".versions2"})
	if err != nil {
		t.Fatal(err)
	}
	if err := gateStore.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	in, err := middleware.Inbox(b.store, middleware.InboxConfig{Consumer: "proj"})
	if err != nil {
		t.Fatal(err)
	}
	gate, err := middleware.VersionGate(gateStore, middleware.VersionGateConfig{Consumer: "proj"})
	if err != nil {
		t.Fatal(err)
	}
	var outerPID, innerPID uint32
	var runs atomic.Int32
	effect := b.effectHandler(&runs, func(n int32) error {
		if n == 1 {
			return errors.New("boom")
		}
		return nil
	})
	h := ackwise.Chain(ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		if err := pginbox.Tx(ctx).QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&innerPID); err != nil {
			return err
		}
		return effect(ctx, msg)
	}), in, func(next ackwise.Handler) ackwise.Handler {
		return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
			if err := pginbox.Tx(ctx).QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&outerPID); err != nil {
				return err
			}
			return next.Handle(ctx, msg)
		})
	}, gate)
	msg := msgFor("acct-1@7")
	msg.Key = "acct-1"
	msg.Headers.Set(ackwise.HeaderAggregateVersion, "7")
	if err := h.Handle(t.Context(), msg); err == nil {
		t.Fatal("first attempt: no error, want the handler's")
	}
	if outerPID == 0 || outerPID != innerPID {
		t.Fatalf("inbox ran on backend %d and the gate on %d, want one transaction", outerPID, innerPID)
	}
	if _, ok, err := gateStore.Version(t.Context(), middleware.VersionKey{Consumer: "proj", Aggregate: "acct-1"}); ok || err != nil {
		t.Fatalf("after a failure the version was recorded (%v, %v)", ok, err)
	}
	if err := h.Handle(t.Context(), msg); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := gateStore.Version(t.Context(), middleware.VersionKey{Consumer: "proj", Aggregate: "acct-1"}); v != 7 || !ok || err != nil {
		t.Fatalf("Version = %d, %v, %v; want 7", v, ok, err)
	}
	if ok, err := b.store.Handled(t.Context(), middleware.InboxKey{Consumer: "proj", EventID: "acct-1@7"}); !ok || err != nil {
		t.Fatalf("Handled = %v, %v; want true", ok, err)
	}
	if n := b.effects(t, "acct-1@7"); n != 1 {
		t.Fatalf("%d effect rows, want 1", n)
	}
}

// An aggregate ID or event ID PostgreSQL cannot store fails permanently on
// every claim path: the version gate's own claim and a claim nested in
// another claim's transaction (inbox and gate stacked), not only the
// inbox's top-level claim.
func TestUnstorableKeysArePermanentOnEveryClaimPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in, err := middleware.Inbox(b.store, middleware.InboxConfig{Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	gate, err := middleware.VersionGate(b.store, middleware.VersionGateConfig{Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h := b.effectHandler(&runs, nil)
	msg := func(id, agg string) *ackwise.Message {
		m := msgFor(id)
		m.Key = agg
		m.Headers.Set(ackwise.HeaderAggregateVersion, "1")
		return m
	}
	for _, tc := range []struct {
		name string
		h    ackwise.Handler
		msg  *ackwise.Message
	}{
		{"gate alone, NUL aggregate", gate(h), msg("e1", "agg\x00nul")},
		{"gate inside inbox, NUL aggregate", in(gate(h)), msg("e2", "agg\x00nul")},
		{"inbox inside gate, NUL event ID", gate(in(h)), msg("e\x00nul", "agg-3")},
		{"gate alone, invalid UTF-8 aggregate", gate(h), msg("e4", "agg\xff")},
	} {
		err := tc.h.Handle(t.Context(), tc.msg)
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
		} else if c := ackwise.ClassOf(err); c != ackwise.ClassPermanent {
			t.Errorf("%s: %v classified %v, want permanent", tc.name, err, c)
		}
	}
	if n := runs.Load(); n != 0 {
		t.Errorf("handler ran %d times for unstorable keys, want 0", n)
	}
}

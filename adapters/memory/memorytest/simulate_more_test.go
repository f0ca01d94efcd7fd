package memorytest_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/sqliteinbox"
)

// inboxFaults are every fault the inbox must absorb: all but a lost reply,
// whose effect a dependency made outside the inbox's transaction
// (middleware.IdempotencyKey is for that).
var inboxFaults = memorytest.FaultRates{CrashBeforeAck: 0.05, CrashAfterAck: 0.05, LoseAck: 0.05, Duplicate: 0.1, Reorder: 0.3, Rebalance: 0.05, Outage: 0.03, CrashInHandler: 0.05}

// TestSimulateSeveralWorkers: with handlers running side by side a failure
// states how often its seed reproduces.
func TestSimulateSeveralWorkers(t *testing.T) {
	t.Parallel()
	for _, mode := range []memorytest.SimMode{memorytest.SimQueue, memorytest.SimLog} {
		t.Run(mode.String(), func(t *testing.T) {
			msg := simulateFailure(t, memorytest.Simulation[*shop]{
				Workload: orders(),
				Init:     newShop,
				Setup:    chargeThenAck,
				Check:    chargedOnce,
				Seeds:    300,
				Workers:  4,
				Mode:     mode,
				Faults:   crashesOnly,
			})
			if !strings.Contains(msg, "charged 2 times") || !strings.Contains(msg, "failed again in") {
				t.Fatalf("want a double charge and how often it reproduces, got:\n%s", msg)
			}
			t.Log(msg)
		})
	}
}

// ledgerDB is the durable state of the SQLite scenario: a database file of
// its own per run, holding the inbox and the charges.
type ledgerDB struct {
	db    *sql.DB
	store *sqliteinbox.Store
}

var dbFiles atomic.Int64

func TestSimulateSQLiteInbox(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	open := func(env *memorytest.SimEnv) *ledgerDB {
		// A file per run: shrinking replays a seed, and must start empty.
		db, err := sqliteinbox.Open(filepath.Join(dir, fmt.Sprintf("seed-%d-%d.db", env.Seed(), dbFiles.Add(1))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		// One connection, and no fsync: the file is a test's, and a
		// simulated crash does not lose what SQLite wrote.
		db.SetMaxOpenConns(1)
		if _, err := db.Exec(`PRAGMA synchronous = OFF`); err != nil {
			t.Fatal(err)
		}
		store, err := sqliteinbox.New(db, sqliteinbox.Config{})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, `CREATE TABLE charges (id TEXT NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		return &ledgerDB{db: db, store: store}
	}
	setup := func(env *memorytest.SimEnv, l *ledgerDB) ackwise.Handler {
		inbox, err := middleware.Inbox(l.store, middleware.InboxConfig{Consumer: "billing"})
		if err != nil {
			t.Fatal(err)
		}
		return ackwise.Chain(ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
			if err := env.Call(ctx, "card-check", func() error { return nil }); err != nil {
				return err
			}
			if _, err := sqliteinbox.Tx(ctx).ExecContext(ctx, `INSERT INTO charges (id) VALUES (?)`, msg.ID); err != nil {
				return err
			}
			// A crash here (SimCrashInHandler) rolls the charge back with
			// the inbox record: one transaction.
			return env.Call(ctx, "receipts", func() error { return nil })
		}), inbox)
	}
	check := func(env *memorytest.SimEnv, l *ledgerDB) error {
		defer l.db.Close()
		for _, m := range env.Messages() {
			var n int
			if err := l.db.QueryRow(`SELECT COUNT(*) FROM charges WHERE id = ?`, m.ID).Scan(&n); err != nil {
				return err
			}
			if n > 1 || (n == 0 && m.Outcome == memorytest.SimAcked) {
				return fmt.Errorf("%s (%s) charged %d times", m.ID, m.Outcome, n)
			}
		}
		return nil
	}
	for _, mode := range []memorytest.SimMode{memorytest.SimQueue, memorytest.SimLog} {
		memorytest.Simulate(t, memorytest.Simulation[*ledgerDB]{
			Workload: orders(), Init: open, Setup: setup, Check: check,
			Seeds: 40, Mode: mode, Faults: inboxFaults,
		})
	}
}

// hundredOrders is a 100-message workload over 20 keys.
func hundredOrders() []*ackwise.Message {
	msgs := make([]*ackwise.Message, 100)
	for i := range msgs {
		msgs[i] = memorytest.Msg(fmt.Sprintf("m%d", i+1), fmt.Sprintf("cust-%d", i%20), "charge")
	}
	return msgs
}

// BenchmarkSimulate1000Seeds runs 1,000 seeds of a 100-message workload
// through the inbox, every fault on: one op is the whole run.
func BenchmarkSimulate1000Seeds(b *testing.B) {
	for _, mode := range []memorytest.SimMode{memorytest.SimQueue, memorytest.SimLog} {
		b.Run(mode.String(), func(b *testing.B) {
			sim := memorytest.Simulation[*shop]{
				Workload: hundredOrders(),
				Init:     newShop,
				Setup:    withInbox,
				Check:    chargedOnce,
				Seeds:    1000,
				Mode:     mode,
				Faults:   inboxFaults,
			}
			for b.Loop() {
				memorytest.Simulate(b, sim)
			}
		})
	}
}

// TestSimulateCrashInsideTheHandler: the same handler as the SQLite test's,
// its charge kept in memory beside meminbox instead of in the inbox's
// transaction: a crash after the charge and before the inbox commits
// leaves the charge without its record, and the redelivery charges again.
func TestSimulateCrashInsideTheHandler(t *testing.T) {
	t.Parallel()
	requireFound(t, memorytest.Simulation[*shop]{
		Workload: orders(),
		Init:     newShop,
		Setup: func(env *memorytest.SimEnv, s *shop) ackwise.Handler {
			inbox, err := middleware.Inbox(s.inbox, middleware.InboxConfig{Consumer: "billing"})
			if err != nil {
				t.Fatal(err)
			}
			return ackwise.Chain(ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
				s.charge(msg.ID) // not in the inbox's transaction: meminbox has none
				return env.Call(ctx, "receipts", func() error { return nil })
			}), inbox)
		},
		Check:  chargedOnce,
		Seeds:  1000,
		Faults: memorytest.FaultRates{CrashInHandler: 0.05},
	}, 1, "crash-in-handler")
}

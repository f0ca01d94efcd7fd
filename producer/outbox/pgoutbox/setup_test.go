package pgoutbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/internal/pgtest"
	"github.com/ackwise/ackwise/producer/outbox/outboxtest"
	"github.com/ackwise/ackwise/producer/outbox/pgoutbox"
)

func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

type testBundle struct {
	pool   *pgxpool.Pool
	schema string // unquoted
	store  *pgoutbox.Store
}

// setup creates a schema of its own with the outbox table, and drops it
// when the test ends.
func setup(t testing.TB, cfg pgoutbox.Config) *testBundle {
	t.Helper()
	pool := pgtest.Connect(t, 12)
	name := randomName("ackwise_pgoutbox_")
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+name); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), `DROP SCHEMA `+name+` CASCADE`); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	cfg.Table = name + ".outbox"
	store, err := pgoutbox.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &testBundle{pool: pool, schema: name, store: store}
}

// add adds msgs in a transaction of its own, committed or rolled back.
func (b *testBundle) add(ctx context.Context, commit bool, msgs ...*ackwise.Message) error {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit it is a no-op
	if err := b.store.Add(ctx, tx, msgs...); err != nil {
		return err
	}
	if !commit {
		return tx.Rollback(ctx)
	}
	return tx.Commit(ctx)
}

// table is the outbox table's quoted name.
func (b *testBundle) table() string { return pgx.Identifier{b.schema, "outbox"}.Sanitize() }

func (b *testBundle) count(t testing.TB, where string) int64 {
	t.Helper()
	var n int64
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+b.table()+` WHERE `+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// addSQL is add through database/sql (pgx's stdlib driver) and AddSQL.
func (b *testBundle) addSQL(ctx context.Context, commit bool, msgs ...*ackwise.Message) error {
	db := stdlib.OpenDBFromPool(b.pool)
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	if err := b.store.AddSQL(ctx, tx, msgs...); err != nil {
		return err
	}
	if !commit {
		return tx.Rollback()
	}
	return tx.Commit()
}

func harness(cfg pgoutbox.Config, stdTx bool) outboxtest.Harness {
	return outboxtest.Harness{New: func(t *testing.T) *outboxtest.Backend {
		b := setup(t, cfg)
		add := b.add
		if stdTx {
			add = b.addSQL
		}
		return &outboxtest.Backend{
			Store: b.store,
			Add:   add,
			SentRows: func(ctx context.Context) (int64, error) {
				return b.count(t, `sent_at IS NOT NULL`), nil
			},
			Corrupt: func(ctx context.Context, eventID string) error {
				_, err := b.pool.Exec(ctx, `UPDATE `+b.table()+` SET headers = '\x05ff'::bytea WHERE event_id = $1`, eventID)
				return err
			},
			LastError: func(ctx context.Context, eventID string) (string, error) {
				var s *string
				err := b.pool.QueryRow(ctx, `SELECT last_error FROM `+b.table()+` WHERE event_id = $1`, eventID).Scan(&s)
				if s == nil {
					return "", err
				}
				return *s, err
			},
		}
	}}
}

func TestConformance(t *testing.T) {
	t.Run("Notify", func(t *testing.T) { t.Parallel(); outboxtest.Run(t, harness(pgoutbox.Config{}, false)) })
	t.Run("PollOnly", func(t *testing.T) { t.Parallel(); outboxtest.Run(t, harness(pgoutbox.Config{NoNotify: true}, false)) })
	t.Run("DatabaseSQL", func(t *testing.T) { t.Parallel(); outboxtest.Run(t, harness(pgoutbox.Config{}, true)) })
}

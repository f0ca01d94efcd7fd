package sqliteoutbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware/sqliteinbox"
	"github.com/ackwise/ackwise/producer/outbox/outboxtest"
	"github.com/ackwise/ackwise/producer/outbox/sqliteoutbox"
)

// setup opens a database file of the test's own with the outbox table.
func setup(t *testing.T) (*sql.DB, *sqliteoutbox.Store) {
	t.Helper()
	db, err := sqliteinbox.Open(filepath.Join(t.TempDir(), "outbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	store, err := sqliteoutbox.New(db, sqliteoutbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return db, store
}

func TestConformance(t *testing.T) {
	outboxtest.Run(t, outboxtest.Harness{New: func(t *testing.T) *outboxtest.Backend {
		db, store := setup(t)
		return &outboxtest.Backend{
			Store: store,
			Add: func(ctx context.Context, commit bool, msgs ...*ackwise.Message) error {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
				if err := store.Add(ctx, tx, msgs...); err != nil {
					return err
				}
				if !commit {
					return tx.Rollback()
				}
				return tx.Commit()
			},
			SentRows: func(ctx context.Context) (int64, error) {
				var n int64
				err := db.QueryRowContext(ctx, `SELECT count(*) FROM ackwise_outbox WHERE sent_at IS NOT NULL`).Scan(&n)
				return n, err
			},
			Corrupt: func(ctx context.Context, eventID string) error {
				_, err := db.ExecContext(ctx, `UPDATE ackwise_outbox SET headers = X'05ff' WHERE event_id = ?`, eventID)
				return err
			},
			LastError: func(ctx context.Context, eventID string) (string, error) {
				var s sql.NullString
				err := db.QueryRowContext(ctx, `SELECT last_error FROM ackwise_outbox WHERE event_id = ?`, eventID).Scan(&s)
				return s.String, err
			},
		}
	}})
}

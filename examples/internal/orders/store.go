package orders

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/pginbox"
	"github.com/ackwise/ackwise/middleware/sqliteinbox"
)

// Store is where shipments are recorded, beside the inbox that makes each
// order ship once: PostgreSQL (pginbox) or SQLite (sqliteinbox). The
// shipments table has no unique key on purpose: only the inbox stands
// between a redelivery and a second shipment, and Shipped shows it.
type Store struct {
	// Inbox is the idempotency middleware, for consumer.Config.Inbox.
	Inbox ackwise.Middleware

	ship       func(ctx context.Context, o Order) error
	count      func(ctx context.Context, idPrefix string) (orders, rows int, err error)
	prune      func(ctx context.Context, interval, olderThan time.Duration, onError func(error)) error
	close      func()
	duplicates atomic.Int64
}

// OpenPostgres opens the store on PostgreSQL at dsn, in schema (created if
// missing, with its tables: shipments, ackwise_inbox and
// ackwise_versions), for the consumer named consumer. The pool holds up to
// conns connections: each message being handled holds one for its inbox
// transaction, so give it the consumer's concurrency and a few more.
func OpenPostgres(ctx context.Context, dsn, schema, consumer string, conns int32, log *slog.Logger, mp metric.MeterProvider) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres DSN: %w", err)
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres at %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	// pginbox.New checks the names (letters, digits, _), which makes them
	// safe to write into the statements below.
	inbox, err := pginbox.New(pool, pginbox.Config{Table: schema + ".ackwise_inbox", VersionTable: schema + ".ackwise_versions"})
	if err == nil {
		_, err = pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+schema)
	}
	if err == nil {
		_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+schema+`.shipments (
			order_id text NOT NULL, customer text NOT NULL, cents bigint NOT NULL,
			shipped_at timestamptz NOT NULL DEFAULT now())`)
	}
	if err == nil {
		err = inbox.Migrate(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	s := &Store{
		ship: func(ctx context.Context, o Order) error {
			_, err := pginbox.Tx(ctx).Exec(ctx, `INSERT INTO `+schema+`.shipments (order_id, customer, cents) VALUES ($1, $2, $3)`, o.ID, o.Customer, o.Cents)
			return err
		},
		count: func(ctx context.Context, prefix string) (int, int, error) {
			var orders, rows int
			err := pool.QueryRow(ctx, `SELECT count(DISTINCT order_id), count(*) FROM `+schema+`.shipments WHERE starts_with(order_id, $1)`, prefix).Scan(&orders, &rows)
			return orders, rows, err
		},
		prune: inbox.PruneEvery,
		close: pool.Close,
	}
	return s, s.withInbox(inbox, consumer, log, mp)
}

// OpenSQLite opens the store on the SQLite file at path (created if
// missing), for the consumer named consumer: no server needed, one writer
// at a time.
func OpenSQLite(ctx context.Context, path, consumer string, log *slog.Logger, mp metric.MeterProvider) (*Store, error) {
	db, err := sqliteinbox.Open(path)
	if err != nil {
		return nil, err
	}
	inbox, err := sqliteinbox.New(db, sqliteinbox.Config{})
	if err == nil {
		err = inbox.Migrate(ctx)
	}
	if err == nil {
		_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS shipments (
			order_id TEXT NOT NULL, customer TEXT NOT NULL, cents INTEGER NOT NULL,
			shipped_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)`)
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	s := &Store{
		ship: func(ctx context.Context, o Order) error {
			_, err := sqliteinbox.Tx(ctx).ExecContext(ctx, `INSERT INTO shipments (order_id, customer, cents) VALUES (?, ?, ?)`, o.ID, o.Customer, o.Cents)
			return err
		},
		count: func(ctx context.Context, prefix string) (int, int, error) {
			var orders, rows int
			err := db.QueryRowContext(ctx, `SELECT count(DISTINCT order_id), count(*) FROM shipments WHERE substr(order_id, 1, length(?1)) = ?1`, prefix).Scan(&orders, &rows)
			return orders, rows, err
		},
		prune: inbox.PruneEvery,
		close: func() { _ = db.Close() },
	}
	return s, s.withInbox(inbox, consumer, log, mp)
}

// withInbox puts store behind the inbox middleware; mp (nil: none) gets its
// duplicates counter (ackwise.consumer.inbox.duplicates).
func (s *Store) withInbox(store middleware.InboxStore, consumer string, log *slog.Logger, mp metric.MeterProvider) error {
	var err error
	s.Inbox, err = middleware.Inbox(store, middleware.InboxConfig{
		Consumer:      consumer,
		OnDuplicate:   func(context.Context, *ackwise.Message) { s.duplicates.Add(1) },
		Logger:        log,
		MeterProvider: mp,
	})
	if err != nil {
		s.close()
	}
	return err
}

// Shipped counts the orders whose ID starts with idPrefix that shipped, and
// the shipment rows written for them: more rows than orders would be an
// order shipped twice.
func (s *Store) Shipped(ctx context.Context, idPrefix string) (orders, rows int, err error) {
	return s.count(ctx, idPrefix)
}

// Duplicates is the number of redeliveries the inbox absorbed (acked
// without running the handler) since the store opened.
func (s *Store) Duplicates() int64 { return s.duplicates.Load() }

// PruneEvery removes inbox records older than olderThan, at once and then
// every interval, until ctx ends; errors go to onError. Run it in a
// goroutine of its own. Keep records longer than any redelivery or redrive
// can come (docs/idempotency.md, "Sizing retention").
func (s *Store) PruneEvery(ctx context.Context, interval, olderThan time.Duration, onError func(error)) error {
	err := s.prune(ctx, interval, olderThan, onError)
	if errors.Is(err, ctx.Err()) {
		return nil
	}
	return err
}

// Close closes the database.
func (s *Store) Close() { s.close() }

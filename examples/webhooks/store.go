package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware/sqliteinbox"
	"github.com/ackwise/ackwise/producer"
	"github.com/ackwise/ackwise/producer/outbox"
	"github.com/ackwise/ackwise/producer/outbox/pgoutbox"
	"github.com/ackwise/ackwise/producer/outbox/sqliteoutbox"
)

// billing is the application's database: invoices, deliveries and the
// outbox, on SQLite (a file of its own) or PostgreSQL (a schema). Both go
// through database/sql, so the code that pays and delivers is one.
type billing struct {
	db                   *sql.DB
	outbox               outbox.Store
	add                  func(ctx context.Context, tx *sql.Tx, msgs ...*ackwise.Message) error
	invoices, deliveries string // table names, quoted
	sqlite               bool
	close                func()
}

// openBilling opens the billing database: SQLite in a temporary directory
// when dsn is "", else the PostgreSQL database dsn, its tables in schema
// (created when missing).
func openBilling(ctx context.Context, dsn, schema string) (*billing, error) {
	if dsn == "" {
		return openSQLite(ctx)
	}
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return nil, fmt.Errorf("-db: want a postgres:// URL, or nothing for SQLite")
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("-db: %w", err)
	}
	b := &billing{close: pool.Close}
	if err := b.initPostgres(ctx, pool, schema); err != nil {
		pool.Close()
		return nil, err
	}
	return b, nil
}

func (b *billing) initPostgres(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{schema}.Sanitize()); err != nil {
		return fmt.Errorf("create schema %s: %w", schema, err)
	}
	ob, err := pgoutbox.New(pool, pgoutbox.Config{Table: schema + ".outbox"})
	if err != nil {
		return err
	}
	if err := ob.Migrate(ctx); err != nil {
		return err
	}
	b.db = stdlib.OpenDBFromPool(pool)
	prev := b.close
	b.close = func() { b.db.Close(); prev() }
	b.outbox, b.add = ob, ob.AddSQL
	b.invoices = pgx.Identifier{schema, "invoices"}.Sanitize()
	b.deliveries = pgx.Identifier{schema, "deliveries"}.Sanitize()
	return b.createTables(ctx)
}

func openSQLite(ctx context.Context) (*billing, error) {
	dir, err := os.MkdirTemp("", "webhooks-")
	if err != nil {
		return nil, err
	}
	db, err := sqliteinbox.Open(filepath.Join(dir, "billing.db"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	b := &billing{db: db, invoices: "invoices", deliveries: "deliveries", sqlite: true,
		close: func() { db.Close(); os.RemoveAll(dir) }}
	ob, err := sqliteoutbox.New(db, sqliteoutbox.Config{})
	if err == nil {
		err = ob.Migrate(ctx)
	}
	if err == nil {
		b.outbox, b.add = ob, ob.Add
		err = b.createTables(ctx)
	}
	if err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *billing) createTables(ctx context.Context) error {
	for _, ddl := range []string{
		`CREATE TABLE IF NOT EXISTS ` + b.invoices + ` (id TEXT PRIMARY KEY, customer TEXT NOT NULL, status TEXT NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS ` + b.deliveries + ` (event_id TEXT PRIMARY KEY, customer TEXT NOT NULL, delivered_at BIGINT NOT NULL)`,
	} {
		if _, err := b.db.ExecContext(ctx, ddl); err != nil {
			return err
		}
	}
	return nil
}

// q rewrites a statement's $n placeholders into SQLite's ?n.
func (b *billing) q(s string) string {
	if b.sqlite {
		return strings.ReplaceAll(s, "$", "?")
	}
	return s
}

// pay marks the invoice paid and adds its event to the outbox, in one
// transaction; a declined card rolls both back. It returns the event ID,
// or "" when the payment was declined.
func (b *billing) pay(ctx context.Context, invoice, customer string, declined bool) (string, error) {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.ExecContext(ctx, b.q(`INSERT INTO `+b.invoices+` (id, customer, status) VALUES ($1, $2, 'paid')`), invoice, customer); err != nil {
		return "", err
	}
	msg := &ackwise.Message{Key: customer}
	ev := event{Type: "invoice.paid", InvoiceID: invoice, CustomerID: customer, PaidAt: time.Now().UTC()}
	// The event ID goes into the body too, so it is made here rather
	// than by Add.
	msg.ID = producer.NewEventID()
	ev.EventID = msg.ID
	if msg.Payload, err = json.Marshal(ev); err != nil {
		return "", err
	}
	if err := b.add(ctx, tx, msg); err != nil {
		return "", err
	}
	if declined {
		return "", tx.Rollback()
	}
	return msg.ID, tx.Commit()
}

// delivered says whether the event was delivered already.
func (b *billing) delivered(ctx context.Context, eventID string) (bool, error) {
	var n int
	err := b.db.QueryRowContext(ctx, b.q(`SELECT count(*) FROM `+b.deliveries+` WHERE event_id = $1`), eventID).Scan(&n)
	return n > 0, err
}

// recordDelivery records the event's delivery.
func (b *billing) recordDelivery(ctx context.Context, eventID, customer string, at time.Time) error {
	_, err := b.db.ExecContext(ctx, b.q(`INSERT INTO `+b.deliveries+` (event_id, customer, delivered_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`),
		eventID, customer, at.UnixMilli())
	return err
}

// Package pgschema applies the DDL of ackwise's PostgreSQL stores.
package pgschema

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Migrate runs ddl (idempotent statements) in one transaction, serialized
// with other callers of the same lockName (several instances starting at
// once) by an advisory transaction lock. Its errors start with prefix.
func Migrate(ctx context.Context, db *pgxpool.Pool, prefix, lockName, ddl string) error {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return fmt.Errorf("%s: migrate: %w", prefix, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, lockName); err != nil {
		return fmt.Errorf("%s: migrate: %w", prefix, err)
	}
	if _, err := tx.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("%s: migrate: %w", prefix, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("%s: migrate: %w", prefix, err)
	}
	return nil
}

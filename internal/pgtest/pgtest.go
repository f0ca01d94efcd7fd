// Package pgtest finds the PostgreSQL server tests run against and opens
// pools on it, failing the test (skipping it under -short) when the server
// cannot be reached.
package pgtest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// URL is where tests find PostgreSQL: ACKWISE_TEST_POSTGRES, or the
// machine's trust-auth server.
func URL() string {
	if u := os.Getenv("ACKWISE_TEST_POSTGRES"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// Connect opens a pool of up to maxConns connections, closed when t ends.
func Connect(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		t.Fatalf("ACKWISE_TEST_POSTGRES: %v", err)
	}
	cfg.MaxConns = maxConns
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if testing.Short() {
			t.Skipf("PostgreSQL unreachable with -short: %v", err)
		}
		t.Fatalf("PostgreSQL at %s unreachable (start it, or set ACKWISE_TEST_POSTGRES): %v", cfg.ConnConfig.ConnString(), err)
	}
	t.Cleanup(pool.Close)
	return pool
}

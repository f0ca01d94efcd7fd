package pginbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackwise/ackwise/internal/pgtest"
	"github.com/ackwise/ackwise/middleware/pginbox"
)

type testBundle struct {
	pool   *pgxpool.Pool
	schema string // quoted
	store  *pginbox.Store
	cfg    pginbox.Config
}

func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// setup creates a schema of its own with the inbox tables and an effects
// table, and drops it when the test ends.
func setup(t testing.TB, opts ...func(*pginbox.Config)) *testBundle {
	t.Helper()
	pool := pgtest.Connect(t, 16)
	name := randomName("ackwise_pginbox_")
	schema := pgx.Identifier{name}.Sanitize()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	cfg := pginbox.Config{Table: name + ".inbox", VersionTable: name + ".versions"}
	for _, o := range opts {
		o(&cfg)
	}
	store, err := pginbox.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.effects (event_id text NOT NULL, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &testBundle{pool: pool, schema: schema, store: store, cfg: cfg}
}

func (b *testBundle) count(t testing.TB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func (b *testBundle) effects(t testing.TB, eventID string) int {
	return b.count(t, `SELECT count(*) FROM `+b.schema+`.effects WHERE event_id = $1`, eventID)
}

// claimModes are the two ways pginbox claims a key; the tests that exercise
// the claim run under both.
var claimModes = []struct {
	name string
	opt  func(*pginbox.Config)
}{
	{"OnConflict", func(*pginbox.Config) {}},
	{"OneRoundTrip", func(c *pginbox.Config) { c.OneRoundTripClaim = true }},
}

// eachMode runs f as a parallel subtest per claim mode.
func eachMode(t *testing.T, f func(t *testing.T, mode func(*pginbox.Config))) {
	for _, m := range claimModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			f(t, m.opt)
		})
	}
}

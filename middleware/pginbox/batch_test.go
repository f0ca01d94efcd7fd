package pginbox_test

import (
	"context"
	"crypto/rand"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/internal/pgtest"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/inboxtest"
	"github.com/ackwise/ackwise/middleware/pginbox"
)

// batchEffects writes one effect row per message with one INSERT through
// the claim's transaction.
func (b *testBundle) batchEffects(ctx context.Context, msgs []*ackwise.Message) error {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	_, err := pginbox.Tx(ctx).Exec(ctx, `INSERT INTO `+b.schema+`.effects (event_id, amount) SELECT unnest($1::text[]), 1`, ids)
	return err
}

func TestBatchConformance(t *testing.T) {
	b := setup(t)
	inboxtest.RunBatch(t, inboxtest.Batch{
		NewStore: func(*testing.T) middleware.BatchInboxStore { return b.store },
		Handled:  b.store.Handled,
		Apply:    b.batchEffects,
		Effects:  b.effects,
		Pending: func(ctx context.Context, id string) (int, error) {
			var n int
			err := pginbox.Tx(ctx).QueryRow(ctx, `SELECT count(*) FROM `+b.schema+`.effects WHERE event_id = $1`, id).Scan(&n)
			return n, err
		},
	})
}

// statementCounter is a pgx QueryTracer that counts the statements sent
// that contain a substring.
type statementCounter struct {
	mu     sync.Mutex
	substr string
	n      int
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, c.substr) {
		c.mu.Lock()
		c.n++
		c.mu.Unlock()
	}
	return ctx
}

func (*statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// TestClaimEventsIsOneStatement counts, with a pgx tracer, the inbox
// INSERTs a batch claim of 50 keys sends: one.
func TestClaimEventsIsOneStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	tracer := &statementCounter{substr: "INSERT INTO " + b.schema + `."inbox"`}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := pginbox.New(pool, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]middleware.InboxKey, 50)
	for i := range keys {
		keys[i] = middleware.InboxKey{Consumer: "billing", EventID: randomName("e")}
	}
	claimed := make([]bool, len(keys))
	c, err := store.ClaimEvents(t.Context(), keys, claimed)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := tracer.count(); n != 1 {
		t.Fatalf("a claim of %d keys sent %d inbox INSERTs, want 1", len(keys), n)
	}
	for i, ok := range claimed {
		if !ok {
			t.Fatalf("claimed[%d] = false for a new key", i)
		}
	}
	// Claimed again, with 10 new keys: only the new ones are claimed.
	more := append(keys[:40:40], make([]middleware.InboxKey, 10)...)
	for i := 40; i < 50; i++ {
		more[i] = middleware.InboxKey{Consumer: "billing", EventID: randomName("f")}
	}
	c, err = store.ClaimEvents(t.Context(), more, claimed)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Rollback(t.Context()) //nolint:errcheck
	for i, ok := range claimed {
		if ok != (i >= 40) {
			t.Fatalf("claimed[%d] = %v, want %v (handled already: false)", i, ok, i >= 40)
		}
	}
}

// TestBatchUnstorableKeyFailsOnlyItsMessage: an event ID PostgreSQL cannot
// store fails the batch claim's one statement; the inbox finds its message,
// which fails permanently, and the others commit.
func TestBatchUnstorableKeyFailsOnlyItsMessage(t *testing.T) {
	t.Parallel()
	for _, bad := range []struct{ name, id string }{
		{"NUL byte", "bad\x00id"},
		// A producer's 16 KiB event ID that does not compress: over
		// the index's row size limit.
		{"oversized", randomText(16 << 10)},
	} {
		t.Run(bad.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			mw, err := middleware.BatchInbox(b.store, middleware.InboxConfig{Consumer: "billing"})
			if err != nil {
				t.Fatal(err)
			}
			h := mw(ackwise.BatchHandlerFunc(b.batchEffects))
			msgs := []*ackwise.Message{msgFor("ok-1"), msgFor(bad.id), msgFor("ok-2")}
			errs := make([]error, len(msgs))
			ackwise.BatchOutcomes(h.HandleBatch(t.Context(), msgs), errs)
			if errs[0] != nil || errs[2] != nil {
				t.Fatalf("storable events failed: %v, %v", errs[0], errs[2])
			}
			if errs[1] == nil || ackwise.ClassOf(errs[1]) != ackwise.ClassPermanent {
				t.Fatalf("event ID (%s): %.200v, want a permanent error", bad.name, errs[1])
			}
			if b.effects(t, "ok-1") != 1 || b.effects(t, "ok-2") != 1 {
				t.Fatal("the storable events' effects did not commit")
			}
		})
	}
}

// randomText returns at least n bytes of random base32 text, which does
// not compress.
func randomText(n int) string {
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(rand.Text())
	}
	return b.String()
}

// TestBatchNestedInAnotherClaim: a batch claim inside another claim's
// transaction on the same pool runs in a savepoint of it.
func TestBatchNestedInAnotherClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	outer, ok, err := b.store.ClaimEvent(t.Context(), middleware.InboxKey{Consumer: "outer", EventID: "o"})
	if err != nil || !ok {
		t.Fatalf("outer claim: %v, %v", ok, err)
	}
	ctx := outer.Context(t.Context())
	claimed := make([]bool, 2)
	c, err := b.store.ClaimEvents(ctx, []middleware.InboxKey{{Consumer: "billing", EventID: "a"}, {Consumer: "billing", EventID: "b"}}, claimed)
	if err != nil || !claimed[0] || !claimed[1] {
		t.Fatalf("nested batch claim: %v, %v", claimed, err)
	}
	if err := c.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, _ := b.store.Handled(t.Context(), middleware.InboxKey{Consumer: "billing", EventID: "a"}); ok {
		t.Fatal("a nested claim committed before its enclosing transaction")
	}
	if err := outer.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if ok, _ := b.store.Handled(t.Context(), middleware.InboxKey{Consumer: "billing", EventID: "a"}); ok {
		t.Fatal("a nested claim survived its enclosing transaction's rollback")
	}
}

// TestClaimEventsLocksInKeyOrder: a batch claim takes its keys' locks in
// the order given. Claim A holds k2; batch G (k1, k2, k3) inserts k1 and
// waits on k2; claim B of k1 then waits on G, and finds k1 handled once G
// commits. (Inserted in another order, G would wait on k2 before locking
// k1, and B would claim k1.)
func TestClaimEventsLocksInKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := func(id string) middleware.InboxKey { return middleware.InboxKey{Consumer: "billing", EventID: id} }
	a, ok, err := b.store.ClaimEvent(t.Context(), key("k2"))
	if err != nil || !ok {
		t.Fatalf("claim A: %v, %v", ok, err)
	}
	// A failing test ends every claim (t.Context's end stops the blocked
	// ones), or the pool would wait for their connections forever.
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		open = []middleware.Claim{a}
	)
	t.Cleanup(func() {
		wg.Wait()
		for _, c := range open {
			_ = c.Rollback(context.Background()) // after a Commit: an error, and nothing done
		}
	})
	type result struct {
		c       middleware.Claim
		claimed []bool
		err     error
	}
	claimAsync := func(ids ...string) chan result {
		ch := make(chan result, 1)
		wg.Go(func() {
			keys := make([]middleware.InboxKey, len(ids))
			for i, id := range ids {
				keys[i] = key(id)
			}
			r := result{claimed: make([]bool, len(ids))}
			r.c, r.err = b.store.ClaimEvents(t.Context(), keys, r.claimed)
			if r.c != nil {
				mu.Lock()
				open = append(open, r.c)
				mu.Unlock()
			}
			ch <- r
		})
		return ch
	}
	g := claimAsync("k1", "k2", "k3")
	b.waitForLockWaiters(t, 1)
	bc := claimAsync("k1")
	b.waitForLockWaiters(t, 2)
	if err := a.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	gr := <-g
	if gr.err != nil || !slices.Equal(gr.claimed, []bool{true, true, true}) {
		t.Fatalf("batch G: %v, %v; want every key claimed once A rolled back", gr.claimed, gr.err)
	}
	if err := gr.c.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	br := <-bc
	if br.err != nil || br.claimed[0] {
		t.Fatalf("claim B of k1: %v, %v; want it to have waited for G and found k1 handled", br.claimed, br.err)
	}
	_ = br.c.Rollback(t.Context())
}

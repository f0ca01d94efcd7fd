package sqliteinbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/inboxtest"
	"github.com/ackwise/ackwise/middleware/sqliteinbox"
)

// batchEffects writes one effect row per message with one multi-row
// INSERT through the claim's transaction.
func batchEffects(ctx context.Context, msgs []*ackwise.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	args := make([]any, len(msgs))
	for i, m := range msgs {
		args[i] = m.ID
	}
	q := `INSERT INTO effects (event_id) VALUES (?)` + strings.Repeat(", (?)", len(msgs)-1)
	_, err := sqliteinbox.Tx(ctx).ExecContext(ctx, q, args...)
	return err
}

func TestBatchConformance(t *testing.T) {
	b := setup(t)
	inboxtest.RunBatch(t, inboxtest.Batch{
		NewStore: func(*testing.T) middleware.BatchInboxStore { return b.store },
		Handled:  b.store.Handled,
		Apply:    batchEffects,
		Effects: func(t testing.TB, id string) int {
			return b.count(t, `SELECT count(*) FROM effects WHERE event_id = ?`, id)
		},
		Pending: func(ctx context.Context, id string) (int, error) {
			var n int
			err := sqliteinbox.Tx(ctx).QueryRowContext(ctx, `SELECT count(*) FROM effects WHERE event_id = ?`, id).Scan(&n)
			return n, err
		},
	})
}

// TestClaimEventsBeyondOneStatement claims more keys than one INSERT holds
// (the statements are chunked under SQLite's variable limit): every key is
// claimed once, and a second claim finds each handled.
func TestClaimEventsBeyondOneStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys := make([]middleware.InboxKey, 701)
	for i := range keys {
		keys[i] = middleware.InboxKey{Consumer: "billing", EventID: fmt.Sprintf("e%04d", i)}
	}
	claimed := make([]bool, len(keys))
	c, err := b.store.ClaimEvents(t.Context(), keys[:500], claimed[:500])
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	c, err = b.store.ClaimEvents(t.Context(), keys, claimed)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	for i, ok := range claimed {
		if ok != (i >= 500) {
			t.Fatalf("claimed[%d] = %v, want %v", i, ok, i >= 500)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM ackwise_inbox`); n != len(keys) {
		t.Fatalf("%d inbox records, want %d", n, len(keys))
	}
}

// Package pginbox is the PostgreSQL store of the idempotency inbox and the
// version gate (package middleware), on github.com/jackc/pgx/v5.
//
// A claim begins a transaction on the pool and inserts the inbox record with
// INSERT … ON CONFLICT DO NOTHING; the handler writes its effects through
// [Tx](ctx), the same transaction, and the middleware commits record and
// effects together when the handler returns nil, or rolls both back. Two
// consumers racing on one event: the second INSERT waits on the primary key
// until the first transaction ends, then either finds the record (and acks
// without running the handler) or, if the first rolled back, claims it.
//
//	pool, _ := pgxpool.New(ctx, url)
//	store, err := pginbox.New(pool, pginbox.Config{})
//	err = store.Migrate(ctx)
//	inbox, err := middleware.Inbox(store, middleware.InboxConfig{Consumer: "billing"})
//	handler := ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
//		_, err := pginbox.Tx(ctx).Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, amount, id)
//		return err
//	})
//
// Each claim holds one pooled connection, in a transaction, while its handler
// runs: size the pool (pgxpool MaxConns) to at least the consumer's
// concurrency, and larger if handlers also take connections of their own
// from it (otherwise every connection can be held by a claim whose handler
// waits for one). A message costs BEGIN, the record's INSERT, the handler's
// statements and COMMIT; [Config].OneRoundTripClaim folds BEGIN into the
// INSERT to save a round trip (worth it when the database is across a
// network), at the price of an ERROR line in the server log per duplicate.
//
// [middleware.BatchInbox] claims a whole batch with [Store.ClaimEvents]:
// BEGIN, then one INSERT … SELECT FROM unnest(…) ON CONFLICT DO NOTHING
// RETURNING for every key of the batch (two round trips per batch, whatever
// its size), and the batch handler writes every message's effect through
// the same [Tx], ideally with one multi-row INSERT or CopyFrom.
//
// A claim fails with a permanent error ([ackwise.Permanent]) for an event ID
// or aggregate ID PostgreSQL cannot store (a NUL byte, an invalid character, too long for
// the index): retrying cannot cure it, so the message is dead-lettered at
// once. Other failures are transient.
//
// Old records are removed by [Store.Prune] run from a periodic job; a BRIN
// index on processed_at (records arrive in time order) keeps it cheap
// without slowing inserts. The table is deliberately not partitioned by
// time: PostgreSQL cannot enforce a primary key of (consumer, event_id)
// across time partitions, and that uniqueness is what makes racing claims
// apply an event once.
package pginbox

// Package pgoutbox is the PostgreSQL store of the transactional outbox
// (package outbox), on github.com/jackc/pgx/v5.
//
//	pool, _ := pgxpool.New(ctx, url)
//	store, err := pgoutbox.New(pool, pgoutbox.Config{})
//	err = store.Migrate(ctx)
//	// in the application's transaction:
//	tx, _ := pool.Begin(ctx)
//	_, err = tx.Exec(ctx, `UPDATE invoices SET paid = true WHERE id = $1`, id)
//	err = store.Add(ctx, tx, &ackwise.Message{Key: customer, Payload: event})
//	err = tx.Commit(ctx)
//	// elsewhere, in one process or several:
//	relay, err := outbox.NewRelay(store, sink, outbox.Config{})
//	err = relay.Run(ctx)
//
// Add writes all its messages with one INSERT … SELECT FROM unnest(…); a
// statement-level trigger on the table sends a NOTIFY on [Store.Channel]
// when the transaction commits (none when it rolls back), which wakes the
// relays at once. NOTIFY takes a server-wide lock at commit;
// Config.NoNotify leaves the trigger out and relays then poll.
//
// Claims are one UPDATE, by primary key, of the ids a SELECT … FOR UPDATE
// SKIP LOCKED found heading their key (each the first unsent id of its key
// in the (key, id) index), with a lease (claimed_by, lease_until): relays
// skip each other's rows instead of waiting, and a crashed relay's rows are
// claimed again once its lease runs out. Partial indexes over the unsent
// rows keep claims cheap however many sent rows are kept for the
// retention; the relay prunes them in batches. Run ANALYZE on a table
// filled in bulk right after it was created: without statistics
// PostgreSQL plans the head probe as a walk of the (id) index, and a claim
// costs more the more rows are ahead of it (docs/outbox.md).
package pgoutbox

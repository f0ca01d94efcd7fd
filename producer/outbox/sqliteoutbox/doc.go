// Package sqliteoutbox is the SQLite store of the transactional outbox
// (package outbox), the embedded default for examples and single-node
// services, on modernc.org/sqlite (pure Go).
//
//	db, _ := sqliteinbox.Open("app.db") // WAL, busy timeout, immediate transactions
//	store, err := sqliteoutbox.New(db, sqliteoutbox.Config{})
//	err = store.Migrate(ctx)
//	tx, _ := db.BeginTx(ctx, nil)
//	_, err = tx.ExecContext(ctx, `UPDATE invoices SET paid = 1 WHERE id = ?`, id)
//	err = store.Add(ctx, tx, &ackwise.Message{Key: customer, Payload: event})
//	err = tx.Commit()
//	relay, err := outbox.NewRelay(store, sink, outbox.Config{PollInterval: 50 * time.Millisecond})
//
// SQLite has no notifications: relays poll (outbox.Config PollInterval).
// Claims are one UPDATE … RETURNING of the rows that head their key, with
// a lease; SQLite's one writer serializes claims, so several relays on one
// file never claim a row twice. Times are the writers' clocks in Unix
// milliseconds.
package sqliteoutbox

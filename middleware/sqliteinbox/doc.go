// Package sqliteinbox is the SQLite store of the idempotency inbox and the
// version gate (package middleware), on modernc.org/sqlite (pure Go, no cgo):
// the embedded default for examples and single-node services.
//
// As with pginbox, the inbox record is inserted in a transaction the handler
// writes its effects through ([Tx]), and commits with them or not at all.
// SQLite allows one writer at a time, so claims are serialized: expect
// hundreds to a few thousand messages per second, not the throughput of a
// server database. The write lock is held for the whole handler (the claim
// commits with the effects), so with several workers a claim waits for the
// other handlers to finish; one that waits longer than the busy timeout
// fails as a transient error and spends an attempt. Keep handlers short, or
// run one worker per SQLite file, or use pginbox.
//
// [middleware.BatchInbox] ([Store.ClaimEvents]) claims a whole batch in one
// transaction, with one multi-row INSERT … RETURNING per 300 keys: one
// write lock and one commit per batch instead of one per message.
//
//	db, err := sqliteinbox.Open("app.db")
//	store, err := sqliteinbox.New(db, sqliteinbox.Config{})
//	err = store.Migrate(ctx)
//	inbox, err := middleware.Inbox(store, middleware.InboxConfig{Consumer: "billing"})
//	handler := ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
//		_, err := sqliteinbox.Tx(ctx).ExecContext(ctx, `UPDATE accounts SET balance = balance + ? WHERE id = ?`, amount, id)
//		return err
//	})
package sqliteinbox

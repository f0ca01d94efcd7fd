// Package outbox is the transactional outbox: an event leaves the service
// exactly when the database write it describes commits.
//
// The application adds messages to an outbox table inside its own
// transaction (pgoutbox.Store.Add with a pgx.Tx, or AddSQL with a *sql.Tx;
// sqliteoutbox.Store.Add with a *sql.Tx). A rolled-back transaction leaves
// no row, so nothing is published; a committed one leaves rows that a
// [Relay] publishes. Each row keeps the message whole: its event ID (a
// UUIDv7 unless the message has one), key, headers with the trace context
// of the caller's ctx, and payload.
//
// The relay claims batches of rows, publishes them through a
// producer.Publisher on any adapters.Sink (the publisher retries the
// messages that failed, with the same event IDs), and marks each row sent
// only once the broker confirmed it. It never keeps a "highest id
// published" watermark: ids are assigned at insert and commit out of order,
// so a watermark would skip a row that committed late. What it guarantees:
//
//   - At least once. A row is marked sent only after its confirm; a relay
//     that dies between the two leaves its claim to run out (Config.Lease),
//     and the row is published again with the same event ID, which the
//     consumer's inbox (middleware.Inbox) absorbs.
//   - Per-key order. Only the head of a key (its lowest unsent, unparked
//     row) is ever claimed, so one row per key is in flight, and rows of one
//     key are published in id order; other keys go on in parallel. Rows with
//     an empty key are not ordered. The order is that of ids among committed
//     rows: two transactions that add rows of one key concurrently commit in
//     either order (serialize writers of one key, as a row lock on the
//     aggregate does, to make id order their order).
//   - Several relays at once. Claims use FOR UPDATE SKIP LOCKED on
//     PostgreSQL (SQLite's single writer serializes them) and a lease
//     column: relays never wait for each other and never claim a row
//     another holds, and a crashed relay's claim expires.
//   - Poison rows are parked. A row the broker refuses for good
//     (ackwise.Permanent), or one out of Config.RowRetry attempts, is set
//     aside with its error and counted; the next row of its key follows.
//     Other failures (an outage) release the row to be claimed again after
//     a backoff, its key waiting with it; nothing is lost. A row the store
//     cannot read (its stored headers do not decode) comes back from the
//     claim with Row.Err and is parked with that error, unpublished; it
//     does not fail the claim of the rows beside it.
//   - Drain. When Run's ctx ends, the relay stops claiming, lets the
//     batches in flight finish for up to Config.DrainTimeout, marks what
//     was confirmed and releases the rest for the next relay.
//
// The relay wakes on the store's notifications (PostgreSQL LISTEN/NOTIFY,
// from a trigger on the table) and polls every Config.PollInterval; on
// SQLite it polls. It prunes sent rows after Config.Retention. docs/outbox.md
// is the guide.
package outbox

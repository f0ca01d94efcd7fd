// Package redisinbox is the Redis store of the idempotency inbox (package
// middleware), on github.com/redis/go-redis/v9, for guarding calls to
// external systems (a payment API, an e-mail service) where there is no
// database transaction to put an inbox record in.
//
// It is not transactional with the handler's effect. Its semantics are
// mark-after-success with a short in-progress lock:
//
//  1. Claim: SET key "p:<token>" NX PX LockTTL. If the key was free the
//     handler runs. If it holds the done mark, the message is acknowledged
//     without running the handler. If another delivery holds the lock, the
//     claim fails with ErrInProgress marked RetryAfter(remaining lock time):
//     the message is retried later, never acknowledged while the other
//     attempt might still fail.
//  2. Handler returned nil: SET key "d" PX Retention (the done mark).
//  3. Handler failed or panicked: the lock is deleted (if still ours), so the
//     retry runs the handler again.
//
// Failure windows, each ending in the handler running twice for one event:
//
//   - the process dies (or Redis cannot be reached) after the external call
//     succeeded and before the done mark is written: after LockTTL, a
//     redelivery runs the handler again;
//   - the handler runs longer than LockTTL: a redelivery can run concurrently
//     (keep a middleware.Timeout below LockTTL);
//   - Redis loses the key (no persistence, failover with asynchronous
//     replication, eviction under maxmemory — use noeviction).
//
// Close all three by also passing middleware.IdempotencyKey to the external
// API: the inbox then saves the calls, and the API's own deduplication makes
// the rare second call harmless. For effects in a database, use pginbox or
// sqliteinbox, whose record commits in the effect's transaction.
//
// The version gate has no Redis store: it needs the version and the effect in
// one transaction.
package redisinbox

// Package outboxtest is the conformance suite of outbox stores (package
// outbox): a store's tests call [Run] with a [Harness] that makes fresh
// tables on the store's real database, and the suite runs relays on them
// into the in-memory broker: whole messages (IDs, keys and headers of any
// bytes, the caller's trace), a rolled-back transaction publishing
// nothing, two and four relays at once publishing no row twice with every
// key in order and never two rows of a key in flight, a broker outage
// growing the backlog and draining it with nothing lost, a poison row
// parked without blocking its key, a row whose stored headers do not
// decode parked with its error (the harness corrupts it in the table),
// drain on shutdown releasing claims, and pruning. pgoutbox and sqliteoutbox run it.
package outboxtest

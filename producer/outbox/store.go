package outbox

import (
	"context"
	"time"

	"github.com/ackwise/ackwise"
)

// Row is one claimed outbox row.
type Row struct {
	// ID is the row's id: the order rows of one key are published in.
	ID int64
	// Message is the stored message: its event ID (Message.ID), key,
	// headers and payload.
	Message *ackwise.Message
	// CreatedAt is when the row was added.
	CreatedAt time.Time
	// Attempts counts the claims of the row, this one included.
	Attempts int
	// Err, when not nil, says the stored row could not be read (its
	// headers do not decode): Message then holds its event ID, key and
	// payload without headers, and the relay parks the row with Err as the
	// reason instead of publishing it. One unreadable row never fails a
	// whole claim.
	Err error
}

// Stats is what a store reports of its table.
type Stats struct {
	// Backlog is the number of rows neither sent nor parked.
	Backlog int64
	// Oldest is when the oldest row of the backlog was added; zero when
	// the backlog is empty.
	Oldest time.Time
	// Parked is the number of parked rows.
	Parked int64
}

// Store is an outbox table as the [Relay] sees it. The stores of this
// module are pgoutbox (PostgreSQL) and sqliteoutbox (SQLite); their Add
// writes rows in the caller's transaction. A Store is safe for concurrent
// use, and several relays (in one process or many) may use stores on the
// same table at once: claims are what keep them apart.
type Store interface {
	// Claim claims up to limit rows for owner until lease from now and
	// returns them in id order. A row is claimable when it is neither
	// sent nor parked, no live claim holds it, and no earlier row of its
	// key is unsent and unparked (it is its key's head): so one row per key
	// is ever claimed, and rows of one key are claimed in id order. Rows
	// with an empty key are not ordered with each other.
	Claim(ctx context.Context, owner string, limit int, lease time.Duration) ([]Row, error)
	// MarkSent marks the rows sent (whoever holds their claim: a confirmed
	// row is published) and ends their claims.
	MarkSent(ctx context.Context, ids []int64) error
	// Release ends owner's claim of the rows and makes them claimable
	// again after delay, recording lastErr (empty: none) on each.
	Release(ctx context.Context, owner string, ids []int64, delay time.Duration, lastErr string) error
	// Park sets owner's claimed row aside with reason: it is not claimed
	// again, and the next row of its key becomes the head.
	Park(ctx context.Context, owner string, id int64, reason string) error
	// Prune deletes up to limit rows sent more than olderThan ago and
	// returns how many it deleted.
	Prune(ctx context.Context, olderThan time.Duration, limit int) (int64, error)
	// Stats reports the backlog, the age of its oldest row and the parked
	// rows.
	Stats(ctx context.Context) (Stats, error)
	// Listen calls wake each time rows may have been added, until ctx is
	// done, and returns ctx's error; a store without notifications returns
	// nil at once (the relay then polls alone). wake must be cheap and
	// must not block.
	Listen(ctx context.Context, wake func()) error
}

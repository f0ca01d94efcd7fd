package sqliteoutbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/producer/outbox"
	"github.com/ackwise/ackwise/producer/outbox/internal/row"
)

// DefaultTable is the outbox table's default name.
const DefaultTable = "ackwise_outbox"

// addChunk bounds the rows of one INSERT (5 variables each; SQLite allows
// 32766 variables per statement).
const addChunk = 1000

// Config configures [New]. The zero value means the documented defaults.
type Config struct {
	// Table is the outbox table; it must match [A-Za-z_][A-Za-z0-9_]* and
	// be at most 46 bytes. Default DefaultTable.
	Table string
}

// Store is the SQLite outbox: [Store.Add] writes rows in the caller's
// transaction, and it implements [outbox.Store] for the relay, which finds
// rows by polling (SQLite has no notifications). It is safe for concurrent
// use. Open the database with sqliteinbox.Open, or with the same settings
// (WAL, a busy timeout, _txlock=immediate), so that relays and writers
// queue for SQLite's one write lock instead of failing. Times are Unix
// milliseconds of the writer's clock.
type Store struct {
	db    *sql.DB
	table string // quoted
	name  string

	claimSQL, sentSQL, releaseSQL, parkSQL, unparkSQL, pruneSQL, statsSQL string
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,45}$`)

// New returns a Store over db. It validates cfg (an error names the field
// and the value) but does not touch the database; call [Store.Migrate]
// first.
func New(db *sql.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqliteoutbox: db is nil")
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if !identRE.MatchString(cfg.Table) {
		return nil, fmt.Errorf("sqliteoutbox: Config.Table %q must match [A-Za-z_][A-Za-z0-9_]* and be at most 46 bytes", cfg.Table)
	}
	t := `"` + cfg.Table + `"`
	s := &Store{db: db, table: t, name: cfg.Table}
	s.claimSQL = `UPDATE ` + t + ` SET claimed_by = ?1, lease_until = ?2 + ?3, attempts = attempts + 1
WHERE id IN (
	SELECT h.id FROM ` + t + ` h
	WHERE h.sent_at IS NULL AND h.parked_at IS NULL
		AND (h.lease_until IS NULL OR h.lease_until <= ?2)
		AND (length(h.key) = 0 OR NOT EXISTS (
			SELECT 1 FROM ` + t + ` p
			WHERE p.key = h.key AND p.id < h.id AND p.sent_at IS NULL AND p.parked_at IS NULL))
	ORDER BY h.id
	LIMIT ?4)
RETURNING id, event_id, key, headers, payload, created_at, attempts`
	s.sentSQL = `UPDATE ` + t + ` SET sent_at = ?1, claimed_by = NULL, lease_until = NULL WHERE id IN (SELECT value FROM json_each(?2)) AND sent_at IS NULL`
	s.releaseSQL = `UPDATE ` + t + ` SET claimed_by = NULL, lease_until = ?3, last_error = COALESCE(NULLIF(?4, ''), last_error)
WHERE id IN (SELECT value FROM json_each(?2)) AND claimed_by = ?1 AND sent_at IS NULL AND parked_at IS NULL`
	s.parkSQL = `UPDATE ` + t + ` SET parked_at = ?3, claimed_by = NULL, lease_until = NULL, last_error = ?4
WHERE id = ?2 AND claimed_by = ?1 AND sent_at IS NULL AND parked_at IS NULL`
	s.unparkSQL = `UPDATE ` + t + ` SET parked_at = NULL, attempts = 0, lease_until = NULL WHERE id IN (SELECT value FROM json_each(?1)) AND parked_at IS NOT NULL`
	s.pruneSQL = `DELETE FROM ` + t + ` WHERE id IN (SELECT id FROM ` + t + ` WHERE sent_at < ?1 LIMIT ?2)`
	s.statsSQL = `SELECT count(*) FILTER (WHERE parked_at IS NULL), min(created_at) FILTER (WHERE parked_at IS NULL),
	count(*) FILTER (WHERE parked_at IS NOT NULL)
FROM ` + t + ` WHERE sent_at IS NULL`
	return s, nil
}

// SchemaSQL returns the DDL [Store.Migrate] runs.
func (s *Store) SchemaSQL() string {
	idx := func(suffix string) string { return `"` + s.name + suffix + `"` }
	return `CREATE TABLE IF NOT EXISTS ` + s.table + ` (
	id          INTEGER PRIMARY KEY AUTOINCREMENT,
	event_id    TEXT    NOT NULL,
	key         BLOB    NOT NULL,
	headers     BLOB,
	payload     BLOB    NOT NULL,
	created_at  INTEGER NOT NULL,
	attempts    INTEGER NOT NULL DEFAULT 0,
	claimed_by  TEXT,
	lease_until INTEGER,
	sent_at     INTEGER,
	parked_at   INTEGER,
	last_error  TEXT
);
CREATE INDEX IF NOT EXISTS ` + idx("_pending_idx") + ` ON ` + s.table + ` (id) WHERE sent_at IS NULL AND parked_at IS NULL;
CREATE INDEX IF NOT EXISTS ` + idx("_key_idx") + ` ON ` + s.table + ` (key, id) WHERE sent_at IS NULL AND parked_at IS NULL;
CREATE INDEX IF NOT EXISTS ` + idx("_sent_idx") + ` ON ` + s.table + ` (sent_at) WHERE sent_at IS NOT NULL;`
}

// Migrate creates the outbox table and its indexes if they do not exist.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, s.SchemaSQL()); err != nil {
		return fmt.Errorf("sqliteoutbox: migrate: %w", err)
	}
	return nil
}

// Add writes msgs to the outbox in tx, the caller's transaction: they are
// relayed if and only if tx commits, in the order given (per key). Each
// row keeps the message whole: its event ID (a new UUIDv7, set into
// msg.ID, when it has none), key, headers (the trace context of ctx
// written in, as producer.InjectTrace does) and payload. It sends one
// INSERT per 1,000 messages.
func (s *Store) Add(ctx context.Context, tx *sql.Tx, msgs ...*ackwise.Message) error {
	if tx == nil {
		return errors.New("sqliteoutbox: Add: tx is nil")
	}
	now := time.Now().UnixMilli()
	for chunk := range slices.Chunk(msgs, addChunk) {
		var q strings.Builder
		q.WriteString(`INSERT INTO ` + s.table + ` (event_id, key, headers, payload, created_at) VALUES `)
		args := make([]any, 0, 5*len(chunk))
		for i, m := range chunk {
			h, err := row.Prepare(ctx, m)
			if err != nil {
				return fmt.Errorf("sqliteoutbox: Add: %w", err)
			}
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString("(?, ?, ?, ?, ?)")
			payload := m.Payload
			if payload == nil {
				payload = []byte{}
			}
			args = append(args, m.ID, []byte(m.Key), row.EncodeHeaders(h), payload, now)
		}
		if _, err := tx.ExecContext(ctx, q.String(), args...); err != nil {
			return fmt.Errorf("sqliteoutbox: add: %w", err)
		}
	}
	return nil
}

// Claim implements [outbox.Store] with one UPDATE … RETURNING of the heads
// of their keys; SQLite's write lock serializes concurrent claims.
func (s *Store) Claim(ctx context.Context, owner string, limit int, lease time.Duration) ([]outbox.Row, error) {
	rows, err := s.db.QueryContext(ctx, s.claimSQL, owner, time.Now().UnixMilli(), lease.Milliseconds(), limit)
	if err != nil {
		return nil, fmt.Errorf("sqliteoutbox: claim: %w", err)
	}
	defer rows.Close()
	out, err := row.ReadClaimed(rows, time.UnixMilli)
	if err != nil {
		return nil, fmt.Errorf("sqliteoutbox: claim: %w", err)
	}
	return out, nil
}

// idList renders ids as a JSON array, for json_each.
func idList(ids []int64) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, id)
	}
	b.WriteByte(']')
	return b.String()
}

// MarkSent implements [outbox.Store].
func (s *Store) MarkSent(ctx context.Context, ids []int64) error {
	if _, err := s.db.ExecContext(ctx, s.sentSQL, time.Now().UnixMilli(), idList(ids)); err != nil {
		return fmt.Errorf("sqliteoutbox: mark sent: %w", err)
	}
	return nil
}

// Release implements [outbox.Store].
func (s *Store) Release(ctx context.Context, owner string, ids []int64, delay time.Duration, lastErr string) error {
	if _, err := s.db.ExecContext(ctx, s.releaseSQL, owner, idList(ids), time.Now().Add(delay).UnixMilli(), lastErr); err != nil {
		return fmt.Errorf("sqliteoutbox: release: %w", err)
	}
	return nil
}

// Park implements [outbox.Store].
func (s *Store) Park(ctx context.Context, owner string, id int64, reason string) error {
	if _, err := s.db.ExecContext(ctx, s.parkSQL, owner, id, time.Now().UnixMilli(), reason); err != nil {
		return fmt.Errorf("sqliteoutbox: park: %w", err)
	}
	return nil
}

// Unpark makes parked rows claimable again, with their attempts reset,
// and returns how many it changed. An unparked row is published after
// rows of its key that followed it were (it left its key's order when it
// was parked).
func (s *Store) Unpark(ctx context.Context, ids ...int64) (int64, error) {
	res, err := s.db.ExecContext(ctx, s.unparkSQL, idList(ids))
	if err != nil {
		return 0, fmt.Errorf("sqliteoutbox: unpark: %w", err)
	}
	return res.RowsAffected()
}

// Prune implements [outbox.Store].
func (s *Store) Prune(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	res, err := s.db.ExecContext(ctx, s.pruneSQL, time.Now().Add(-olderThan).UnixMilli(), limit)
	if err != nil {
		return 0, fmt.Errorf("sqliteoutbox: prune: %w", err)
	}
	return res.RowsAffected()
}

// Stats implements [outbox.Store].
func (s *Store) Stats(ctx context.Context) (outbox.Stats, error) {
	var st outbox.Stats
	var oldest sql.NullInt64
	if err := s.db.QueryRowContext(ctx, s.statsSQL).Scan(&st.Backlog, &oldest, &st.Parked); err != nil {
		return st, fmt.Errorf("sqliteoutbox: stats: %w", err)
	}
	if oldest.Valid {
		st.Oldest = time.UnixMilli(oldest.Int64)
	}
	return st, nil
}

// Listen implements [outbox.Store]: SQLite has no notifications, so it
// returns nil at once and the relay polls (outbox.Config PollInterval).
func (s *Store) Listen(context.Context, func()) error { return nil }

package pgoutbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgxlisten"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/internal/pgschema"
	"github.com/ackwise/ackwise/producer/outbox"
	"github.com/ackwise/ackwise/producer/outbox/internal/row"
)

// DefaultTable is the outbox table's default name.
const DefaultTable = "ackwise_outbox"

// listenReconnectDelay is how long the listener waits before it
// reconnects after losing its connection (the relay polls meanwhile).
const listenReconnectDelay = 5 * time.Second

// Config configures [New]. The zero value means the documented defaults.
type Config struct {
	// Table is the outbox table, optionally schema-qualified ("app.outbox").
	// Each part must match [A-Za-z_][A-Za-z0-9_]* and be at most 46 bytes.
	// Default DefaultTable.
	Table string
	// NoNotify leaves out the trigger that notifies relays (NOTIFY) when
	// rows are added: relays then find rows by polling alone (outbox.Config
	// PollInterval). NOTIFY serializes the commits of the transactions that
	// notify on a server-wide lock; at very high rates of small
	// transactions, polling may cost less. Default false: notify. Listen
	// still listens either way.
	NoNotify bool
}

// Store is the PostgreSQL outbox: [Store.Add] writes rows in the caller's
// transaction, and it implements [outbox.Store] for the relay. It is safe
// for concurrent use.
type Store struct {
	db       *pgxpool.Pool
	table    string // quoted
	schema   string // quoted schema prefix with dot, or ""
	name     string // unqualified table name
	channel  string
	lockName string
	notify   bool

	addSQL, claimSQL, sentSQL, releaseSQL, parkSQL, pruneSQL, statsSQL, unparkSQL string
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,45}$`)

// New returns a Store over the pool db. It validates cfg (an error names the
// field and the value) but does not touch the database; call
// [Store.Migrate] or apply [Store.SchemaSQL] with your migration tool
// first.
func New(db *pgxpool.Pool, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("pgoutbox: db is nil")
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	parts := strings.Split(cfg.Table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("pgoutbox: Config.Table %q: at most one dot (schema.table)", cfg.Table)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) {
			return nil, fmt.Errorf("pgoutbox: Config.Table %q: each part must match [A-Za-z_][A-Za-z0-9_]* and be at most 46 bytes", cfg.Table)
		}
	}
	h := fnv.New64a()
	h.Write([]byte(cfg.Table))
	s := &Store{
		db:       db,
		table:    pgx.Identifier(parts).Sanitize(),
		name:     parts[len(parts)-1],
		channel:  fmt.Sprintf("ackwise_outbox_%016x", h.Sum64()),
		lockName: "ackwise-outbox:" + cfg.Table,
		notify:   !cfg.NoNotify,
	}
	if len(parts) == 2 {
		s.schema = pgx.Identifier{parts[0]}.Sanitize() + "."
	}
	t := s.table
	s.addSQL = `INSERT INTO ` + t + ` (event_id, key, headers, payload)
SELECT e, k, h, p FROM unnest($1::text[], $2::bytea[], $3::bytea[], $4::bytea[]) WITH ORDINALITY AS u(e, k, h, p, n) ORDER BY n`
	// The claim locks the heads it takes (FOR UPDATE SKIP LOCKED) in a
	// sub-select and updates them by id. A row is its key's head when it
	// is the first pending row of the key in the key index: one probe of
	// (key, id), whatever the planner knows of the table (a NOT EXISTS of
	// an earlier row was planned, on a table without statistics, as a walk
	// of the id index per row).
	s.claimSQL = `UPDATE ` + t + ` AS o SET claimed_by = $1, lease_until = now() + $2::bigint * interval '1 microsecond', attempts = o.attempts + 1
WHERE o.id = ANY(ARRAY(
	SELECT h.id FROM ` + t + ` h
	WHERE h.sent_at IS NULL AND h.parked_at IS NULL
		AND (h.lease_until IS NULL OR h.lease_until <= now())
		AND (h.key = '' OR h.id = (
			SELECT p.id FROM ` + t + ` p
			WHERE p.key = h.key AND p.sent_at IS NULL AND p.parked_at IS NULL
			ORDER BY p.key, p.id
			LIMIT 1))
	ORDER BY h.id
	LIMIT $3
	FOR UPDATE SKIP LOCKED
))
RETURNING o.id, o.event_id, o.key, o.headers, o.payload, o.created_at, o.attempts`
	s.sentSQL = `UPDATE ` + t + ` SET sent_at = now(), claimed_by = NULL, lease_until = NULL WHERE id = ANY($1) AND sent_at IS NULL`
	s.releaseSQL = `UPDATE ` + t + ` SET claimed_by = NULL, lease_until = now() + $3::bigint * interval '1 microsecond',
	last_error = COALESCE(NULLIF($4, ''), last_error)
WHERE id = ANY($2) AND claimed_by = $1 AND sent_at IS NULL AND parked_at IS NULL`
	s.parkSQL = `UPDATE ` + t + ` SET parked_at = now(), claimed_by = NULL, lease_until = NULL, last_error = $3
WHERE id = $2 AND claimed_by = $1 AND sent_at IS NULL AND parked_at IS NULL`
	s.unparkSQL = `UPDATE ` + t + ` SET parked_at = NULL, attempts = 0, lease_until = NULL WHERE id = ANY($1) AND parked_at IS NOT NULL`
	s.pruneSQL = `DELETE FROM ` + t + ` WHERE id = ANY(ARRAY(
SELECT id FROM ` + t + ` WHERE sent_at < now() - $1::bigint * interval '1 microsecond' LIMIT $2))`
	s.statsSQL = `SELECT count(*) FILTER (WHERE parked_at IS NULL), min(created_at) FILTER (WHERE parked_at IS NULL),
	count(*) FILTER (WHERE parked_at IS NOT NULL)
FROM ` + t + ` WHERE sent_at IS NULL`
	return s, nil
}

// Channel returns the NOTIFY channel of the table's trigger, which Listen
// listens on.
func (s *Store) Channel() string { return s.channel }

// SchemaSQL returns the DDL [Store.Migrate] runs, for migration tools. It is
// idempotent.
func (s *Store) SchemaSQL() string {
	idx := func(suffix string) string { return pgx.Identifier{s.name + suffix}.Sanitize() }
	ddl := `CREATE TABLE IF NOT EXISTS ` + s.table + ` (
	id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	event_id    text        NOT NULL,
	key         bytea       NOT NULL DEFAULT '',
	headers     bytea,
	payload     bytea       NOT NULL,
	created_at  timestamptz NOT NULL DEFAULT now(),
	attempts    integer     NOT NULL DEFAULT 0,
	claimed_by  text,
	lease_until timestamptz,
	sent_at     timestamptz,
	parked_at   timestamptz,
	last_error  text
);
CREATE INDEX IF NOT EXISTS ` + idx("_pending_idx") + ` ON ` + s.table + ` (id) WHERE sent_at IS NULL AND parked_at IS NULL;
CREATE INDEX IF NOT EXISTS ` + idx("_key_idx") + ` ON ` + s.table + ` (key, id) WHERE sent_at IS NULL AND parked_at IS NULL;
CREATE INDEX IF NOT EXISTS ` + idx("_sent_idx") + ` ON ` + s.table + ` (sent_at) WHERE sent_at IS NOT NULL;
`
	fn := s.schema + pgx.Identifier{s.name + "_notify"}.Sanitize()
	trg := pgx.Identifier{s.name + "_notify"}.Sanitize()
	if !s.notify {
		return ddl + `DROP TRIGGER IF EXISTS ` + trg + ` ON ` + s.table + `;
`
	}
	return ddl + `CREATE OR REPLACE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
	PERFORM pg_notify('` + s.channel + `', '');
	RETURN NULL;
END
$fn$;
CREATE OR REPLACE TRIGGER ` + trg + ` AFTER INSERT ON ` + s.table + ` FOR EACH STATEMENT EXECUTE FUNCTION ` + fn + `();
`
}

// Migrate creates the outbox table, its indexes and (unless
// Config.NoNotify) its notify trigger, if they do not exist. Concurrent
// calls are serialized with an advisory lock. The schema, if qualified,
// must exist.
func (s *Store) Migrate(ctx context.Context) error {
	return pgschema.Migrate(ctx, s.db, "pgoutbox", s.lockName, s.SchemaSQL())
}

// Add writes msgs to the outbox in tx, the caller's transaction: they are
// relayed if and only if tx commits, in the order given (per key). Each
// row keeps the message whole: its event ID (a new UUIDv7, set into
// msg.ID, when it has none), key, headers (the trace context of ctx
// written in, as producer.InjectTrace does) and payload. Add sends one
// statement for all of msgs. A key or header may hold any bytes; an event
// ID must be valid UTF-8 without NUL bytes.
func (s *Store) Add(ctx context.Context, tx pgx.Tx, msgs ...*ackwise.Message) error {
	if tx == nil {
		return errors.New("pgoutbox: Add: tx is nil")
	}
	args, err := s.addArgs(ctx, msgs)
	if err != nil || args == nil {
		return err
	}
	if _, err := tx.Exec(ctx, s.addSQL, args...); err != nil {
		return fmt.Errorf("pgoutbox: add: %w", err)
	}
	return nil
}

// AddSQL is Add for a database/sql transaction on PostgreSQL (through the
// driver github.com/jackc/pgx/v5/stdlib).
func (s *Store) AddSQL(ctx context.Context, tx *sql.Tx, msgs ...*ackwise.Message) error {
	if tx == nil {
		return errors.New("pgoutbox: AddSQL: tx is nil")
	}
	args, err := s.addArgs(ctx, msgs)
	if err != nil || args == nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, s.addSQL, args...); err != nil {
		return fmt.Errorf("pgoutbox: add: %w", err)
	}
	return nil
}

// addArgs returns the arrays of Add's statement, nil for no messages.
func (s *Store) addArgs(ctx context.Context, msgs []*ackwise.Message) ([]any, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	ids := make([]string, len(msgs))
	keys := make([][]byte, len(msgs))
	headers := make([][]byte, len(msgs))
	payloads := make([][]byte, len(msgs))
	for i, m := range msgs {
		h, err := row.Prepare(ctx, m)
		if err != nil {
			return nil, fmt.Errorf("pgoutbox: Add: message %d: %w", i, err)
		}
		ids[i] = m.ID
		keys[i] = []byte(m.Key)
		headers[i] = row.EncodeHeaders(h)
		payloads[i] = m.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
	}
	return []any{ids, keys, headers, payloads}, nil
}

// Claim implements [outbox.Store] with one UPDATE over a SELECT … FOR
// UPDATE SKIP LOCKED of the heads of their keys, so concurrent relays
// claim disjoint rows without waiting for each other.
func (s *Store) Claim(ctx context.Context, owner string, limit int, lease time.Duration) ([]outbox.Row, error) {
	rows, err := s.db.Query(ctx, s.claimSQL, owner, lease.Microseconds(), limit)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: claim: %w", err)
	}
	defer rows.Close()
	out, err := row.ReadClaimed(rows, func(t time.Time) time.Time { return t })
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: claim: %w", err)
	}
	return out, nil
}

// MarkSent implements [outbox.Store].
func (s *Store) MarkSent(ctx context.Context, ids []int64) error {
	if _, err := s.db.Exec(ctx, s.sentSQL, ids); err != nil {
		return fmt.Errorf("pgoutbox: mark sent: %w", err)
	}
	return nil
}

// Release implements [outbox.Store].
func (s *Store) Release(ctx context.Context, owner string, ids []int64, delay time.Duration, lastErr string) error {
	if _, err := s.db.Exec(ctx, s.releaseSQL, owner, ids, delay.Microseconds(), pgText(lastErr)); err != nil {
		return fmt.Errorf("pgoutbox: release: %w", err)
	}
	return nil
}

// Park implements [outbox.Store].
func (s *Store) Park(ctx context.Context, owner string, id int64, reason string) error {
	if _, err := s.db.Exec(ctx, s.parkSQL, owner, id, pgText(reason)); err != nil {
		return fmt.Errorf("pgoutbox: park: %w", err)
	}
	return nil
}

// Unpark makes parked rows claimable again, with their attempts reset,
// and returns how many it changed. An unparked row is published after
// rows of its key that followed it were (it left its key's order when it
// was parked).
func (s *Store) Unpark(ctx context.Context, ids ...int64) (int64, error) {
	tag, err := s.db.Exec(ctx, s.unparkSQL, ids)
	if err != nil {
		return 0, fmt.Errorf("pgoutbox: unpark: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Prune implements [outbox.Store].
func (s *Store) Prune(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	tag, err := s.db.Exec(ctx, s.pruneSQL, olderThan.Microseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("pgoutbox: prune: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Stats implements [outbox.Store]. It counts the unsent rows (a scan of
// the pending index): call it at a metrics interval, not per message.
func (s *Store) Stats(ctx context.Context) (outbox.Stats, error) {
	var st outbox.Stats
	var oldest *time.Time
	if err := s.db.QueryRow(ctx, s.statsSQL).Scan(&st.Backlog, &oldest, &st.Parked); err != nil {
		return st, fmt.Errorf("pgoutbox: stats: %w", err)
	}
	if oldest != nil {
		st.Oldest = *oldest
	}
	return st, nil
}

// Listen implements [outbox.Store]: it listens on [Store.Channel] on a
// connection of its own (not one of the pool's; github.com/jackc/pgxlisten
// reconnects it after a loss, every 5s while the server is away) and calls
// wake on each notification, and once LISTEN runs after each
// (re)connection, since rows may have been added while it did not listen.
func (s *Store) Listen(ctx context.Context, wake func()) error {
	connCfg := s.db.Config().ConnConfig.Copy()
	l := &pgxlisten.Listener{
		Connect:        func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, connCfg) },
		ReconnectDelay: listenReconnectDelay,
	}
	l.Handle(s.channel, waker(wake))
	return l.Listen(ctx)
}

// waker wakes the relay on a notification, and on the backlog pgxlisten
// offers once LISTEN runs.
type waker func()

func (w waker) HandleNotification(context.Context, *pgconn.Notification, *pgx.Conn) error {
	w()
	return nil
}

func (w waker) HandleBacklog(context.Context, string, *pgx.Conn) error {
	w()
	return nil
}

// pgText makes an error text storable in a text column: valid UTF-8
// without NUL bytes.
func pgText(s string) string { return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "") }

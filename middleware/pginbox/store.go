package pginbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/internal/pgschema"
	"github.com/ackwise/ackwise/middleware"
)

// Default table names.
const (
	DefaultTable        = "ackwise_inbox"
	DefaultVersionTable = "ackwise_versions"
)

// DefaultPruneBatch is the number of rows one DELETE of [Store.Prune]
// removes; the batches keep each transaction and its locks short.
const DefaultPruneBatch = 5000

// ErrTxOwned is returned by Commit and Rollback on the transaction [Tx]
// hands to a handler: the inbox commits it when the handler returns nil and
// rolls it back when the handler fails.
var ErrTxOwned = errors.New("pginbox: the transaction belongs to the inbox; return nil to commit it or an error to roll it back")

// Config configures [New]. The zero value means the documented defaults.
type Config struct {
	// Table is the inbox table, optionally schema-qualified ("app.inbox").
	// Each part must match [A-Za-z_][A-Za-z0-9_]* and be at most 46 bytes (so
	// that derived index names fit PostgreSQL's 63). Default DefaultTable.
	Table string
	// VersionTable is the version gate's table, with the same rules. Default
	// DefaultVersionTable.
	VersionTable string
	// TxOptions are the options of the transaction each claim opens. The
	// default, read committed, is what the claim needs: a second claimer of a
	// key waits on the unique index until the first commits or rolls back and
	// then sees the outcome. Under repeatable read or serializable, the second
	// claimer fails with a serialization error instead (retried as transient).
	// BeginQuery is not supported (the store writes its own BEGIN).
	TxOptions pgx.TxOptions
	// OneRoundTripClaim sends BEGIN and the inbox INSERT as one query,
	// saving a round trip per message (see the benchmarks). The INSERT then
	// has no ON CONFLICT clause: a duplicate is detected from its unique
	// violation, which PostgreSQL writes to its log as an ERROR line, one per
	// duplicate delivery; a replay of a million events is a million lines.
	// Default false: BEGIN, then INSERT … ON CONFLICT DO NOTHING, which logs
	// nothing. The locking and the outcome are the same either way.
	OneRoundTripClaim bool
}

// Store is the PostgreSQL inbox ([middleware.InboxStore]) and version store
// ([middleware.VersionStore]). It is safe for concurrent use. Each claim
// holds one connection of the pool, in a transaction, for as long as its
// handler runs: size the pool to at least the consumer's concurrency.
type Store struct {
	db           *pgxpool.Pool
	opts         pgx.TxOptions
	oneRoundTrip bool
	beginSQL     string
	table        string // quoted
	versionTable string // quoted
	indexName    string // quoted
	lockName     string

	claimSQL     string
	claimManySQL string
	claimPrefix  string // BEGIN; INSERT … VALUES (, for the pipelined claim
	versionSQL   string
	lockVerSQL   string
	pruneSQL     string
	handledSQL   string
	getVerSQL    string
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,45}$`)

// parseTable validates a possibly schema-qualified table name and returns its
// parts.
func parseTable(field, name string) (pgx.Identifier, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("pginbox: Config.%s %q: at most one dot (schema.table)", field, name)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) {
			return nil, fmt.Errorf("pginbox: Config.%s %q: each part must match [A-Za-z_][A-Za-z0-9_]* and be at most 46 bytes", field, name)
		}
	}
	return pgx.Identifier(parts), nil
}

// New returns a Store over the pool db. It validates cfg (an error names the
// field and the value) but does not touch the database; call [Store.Migrate]
// or apply [Store.SchemaSQL] with your migration tool first.
func New(db *pgxpool.Pool, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("pginbox: db is nil")
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if cfg.VersionTable == "" {
		cfg.VersionTable = DefaultVersionTable
	}
	t, err := parseTable("Table", cfg.Table)
	if err != nil {
		return nil, err
	}
	vt, err := parseTable("VersionTable", cfg.VersionTable)
	if err != nil {
		return nil, err
	}
	if strings.EqualFold(cfg.Table, cfg.VersionTable) {
		return nil, fmt.Errorf("pginbox: Config.VersionTable %q is the same as Config.Table", cfg.VersionTable)
	}
	beginSQL, err := beginSQL(cfg.TxOptions)
	if err != nil {
		return nil, err
	}
	s := &Store{
		db:           db,
		opts:         cfg.TxOptions,
		oneRoundTrip: cfg.OneRoundTripClaim,
		beginSQL:     beginSQL,
		table:        t.Sanitize(),
		versionTable: vt.Sanitize(),
		indexName:    pgx.Identifier{t[len(t)-1] + "_processed_at_idx"}.Sanitize(),
		lockName:     "ackwise-inbox:" + cfg.Table,
	}
	s.claimSQL = `INSERT INTO ` + s.table + ` (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`
	// WITH ORDINALITY … ORDER BY keeps the caller's (sorted) order, in
	// which the INSERT takes its locks.
	s.claimManySQL = `INSERT INTO ` + s.table + ` (consumer, event_id)
SELECT k.consumer, k.event_id FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(consumer, event_id, n) ORDER BY k.n
ON CONFLICT DO NOTHING RETURNING consumer, event_id`
	s.claimPrefix = beginSQL + `; INSERT INTO ` + s.table + ` (consumer, event_id) VALUES (`
	s.versionSQL = `INSERT INTO ` + s.versionTable + ` AS cur (consumer, aggregate, version) VALUES ($1, $2, $3)
ON CONFLICT (consumer, aggregate) DO UPDATE SET version = EXCLUDED.version, updated_at = now()
WHERE cur.version < EXCLUDED.version`
	s.lockVerSQL = `SELECT version FROM ` + s.versionTable + ` WHERE consumer = $1 AND aggregate = $2 FOR UPDATE`
	s.pruneSQL = `DELETE FROM ` + s.table + ` WHERE ctid = ANY(ARRAY(
SELECT ctid FROM ` + s.table + ` WHERE processed_at < now() - $1::bigint * interval '1 microsecond' LIMIT $2))`
	s.handledSQL = `SELECT EXISTS (SELECT 1 FROM ` + s.table + ` WHERE consumer = $1 AND event_id = $2)`
	s.getVerSQL = `SELECT version FROM ` + s.versionTable + ` WHERE consumer = $1 AND aggregate = $2`
	return s, nil
}

// SchemaSQL returns the DDL [Store.Migrate] runs, for migration tools. It is
// idempotent (CREATE … IF NOT EXISTS).
func (s *Store) SchemaSQL() string {
	return `CREATE TABLE IF NOT EXISTS ` + s.table + ` (
	consumer     text        NOT NULL,
	event_id     text        NOT NULL,
	processed_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, event_id)
);
CREATE INDEX IF NOT EXISTS ` + s.indexName + ` ON ` + s.table + ` USING brin (processed_at);
CREATE TABLE IF NOT EXISTS ` + s.versionTable + ` (
	consumer   text        NOT NULL,
	aggregate  text        NOT NULL,
	version    bigint      NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, aggregate)
);`
}

// Migrate creates the inbox and version tables and the BRIN index Prune uses, if
// they do not exist. Concurrent calls (several instances starting at once)
// are serialized with an advisory lock. The schema, if qualified, must exist.
func (s *Store) Migrate(ctx context.Context) error {
	return pgschema.Migrate(ctx, s.db, "pginbox", s.lockName, s.SchemaSQL())
}

type ctxKey struct{}

// txState is what a claim puts into the handler's context.
type txState struct {
	store *Store
	tx    pgx.Tx
}

// Tx returns the transaction of the inbox (or version gate) claim the
// handler runs in, or nil when ctx carries none. Write the handler's effects
// through it: they commit with the inbox record when the handler returns nil
// and roll back with it when the handler fails. Its Commit and Rollback
// return [ErrTxOwned]; its Begin opens a savepoint as usual. Like any pgx.Tx
// it must not be used from two goroutines at once.
func Tx(ctx context.Context) pgx.Tx {
	st, _ := ctx.Value(ctxKey{}).(*txState)
	if st == nil {
		return nil
	}
	return ownedTx{st.tx}
}

// ownedTx is the transaction as the handler sees it: everything but ending
// it.
type ownedTx struct{ pgx.Tx }

func (ownedTx) Commit(context.Context) error   { return ErrTxOwned }
func (ownedTx) Rollback(context.Context) error { return ErrTxOwned }

// ClaimEvent implements [middleware.InboxStore]. It begins a transaction
// and inserts (consumer, event ID) with INSERT … ON CONFLICT DO NOTHING (see
// Config.OneRoundTripClaim for the alternative); a committed record with the
// same key makes it return claimed=false, and a concurrent claimer of the key
// waits on the primary key until this transaction ends.
//
// Nested in the transaction of another claim on the same pool (the version
// gate outside the inbox), it runs INSERT … ON CONFLICT DO NOTHING in a
// savepoint.
func (s *Store) ClaimEvent(ctx context.Context, key middleware.InboxKey) (middleware.Claim, bool, error) {
	if st := s.enclosing(ctx); st != nil {
		return s.claimNested(ctx, st.tx, s.claimSQL, key.Consumer, key.EventID)
	}
	return s.claimTop(ctx, key)
}

var _ middleware.BatchInboxStore = (*Store)(nil)

// ClaimEvents implements [middleware.BatchInboxStore]. It begins a
// transaction and inserts every key with one statement, INSERT … SELECT
// FROM unnest(…) ON CONFLICT DO NOTHING RETURNING, which reports the keys
// it inserted: two round trips (BEGIN, then the INSERT) whatever the number
// of keys. OneRoundTripClaim does not apply: a BEGIN sent with the INSERT
// would hide the RETURNING rows. The rows are inserted (and their locks
// taken) in the order of keys, so callers that sort keys cannot deadlock
// each other; a concurrent claimer of a key waits on the primary key until
// the transaction holding it ends, as with ClaimEvent.
//
// Nested in the transaction of another claim on the same pool, it runs the
// INSERT in a savepoint. A key PostgreSQL cannot store fails the whole
// statement with a permanent error (see [middleware.BatchInbox] for how the
// middleware finds the key).
func (s *Store) ClaimEvents(ctx context.Context, keys []middleware.InboxKey, claimed []bool) (middleware.Claim, error) {
	if len(claimed) != len(keys) {
		return nil, fmt.Errorf("pginbox: ClaimEvents: %d claimed flags for %d keys", len(claimed), len(keys))
	}
	var c *claim
	if st := s.enclosing(ctx); st != nil {
		tx, err := st.tx.Begin(ctx)
		if err != nil {
			return nil, fmt.Errorf("pginbox: savepoint: %w", err)
		}
		c = &claim{store: s, tx: tx}
	} else {
		conn, err := s.db.Acquire(ctx)
		if err != nil {
			return nil, fmt.Errorf("pginbox: acquire: %w", err)
		}
		tx, err := conn.BeginTx(ctx, s.opts)
		if err != nil {
			conn.Release()
			return nil, fmt.Errorf("pginbox: begin: %w", err)
		}
		c = &claim{store: s, tx: tx, conn: conn}
	}
	if err := s.claimMany(ctx, c.tx, keys, claimed); err != nil {
		_ = c.Rollback(context.WithoutCancel(ctx))
		clear(claimed)
		return nil, claimError("claim", err)
	}
	return c, nil
}

// claimMany inserts keys in tx and sets claimed[i] for each key inserted.
func (s *Store) claimMany(ctx context.Context, tx pgx.Tx, keys []middleware.InboxKey, claimed []bool) error {
	clear(claimed)
	if len(keys) == 0 {
		return nil
	}
	consumers := make([]string, len(keys))
	ids := make([]string, len(keys))
	at := make(map[middleware.InboxKey]int, len(keys))
	for i, k := range keys {
		consumers[i], ids[i] = k.Consumer, k.EventID
		at[k] = i
	}
	rows, err := tx.Query(ctx, s.claimManySQL, consumers, ids)
	if err != nil {
		return err
	}
	var k middleware.InboxKey
	_, err = pgx.ForEachRow(rows, []any{&k.Consumer, &k.EventID}, func() error {
		if i, ok := at[k]; ok {
			claimed[i] = true
		}
		return nil
	})
	return err
}

// ClaimVersion implements [middleware.VersionStore]. In one round trip (a
// pipelined batch) it reads the recorded version with SELECT … FOR UPDATE,
// which locks the aggregate's row (waiting for a concurrent claim to end,
// and then reading what it committed), and runs an upsert that writes
// version only where it is newer than the stored one; a concurrent claim
// on the aggregate waits on the row lock until this one ends. Nested in
// the transaction of another claim on the same pool, it runs in a
// savepoint.
func (s *Store) ClaimVersion(ctx context.Context, key middleware.VersionKey, version int64) (middleware.Claim, int64, bool, error) {
	if st := s.enclosing(ctx); st != nil {
		tx, err := st.tx.Begin(ctx)
		if err != nil {
			return nil, 0, false, fmt.Errorf("pginbox: savepoint: %w", err)
		}
		recorded, newer, err := s.claimVersionIn(ctx, tx, key, version)
		if err != nil || !newer {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			if err != nil {
				return nil, 0, false, claimError("claim version", err)
			}
			return nil, recorded, false, nil
		}
		return &claim{store: s, tx: tx}, recorded, true, nil
	}
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return nil, 0, false, fmt.Errorf("pginbox: acquire: %w", err)
	}
	tx, err := conn.BeginTx(ctx, s.opts)
	if err != nil {
		conn.Release()
		return nil, 0, false, fmt.Errorf("pginbox: begin: %w", err)
	}
	c := &claim{store: s, tx: tx, conn: conn}
	recorded, newer, err := s.claimVersionIn(ctx, tx, key, version)
	if err != nil || !newer {
		_ = c.Rollback(context.WithoutCancel(ctx))
		if err != nil {
			return nil, 0, false, claimError("claim version", err)
		}
		return nil, recorded, false, nil
	}
	return c, recorded, true, nil
}

// claimVersionIn reads the recorded version of key (0 when none) with a row
// lock and upserts version in tx, in one pipelined batch; newer reports
// whether the upsert wrote it.
func (s *Store) claimVersionIn(ctx context.Context, tx pgx.Tx, key middleware.VersionKey, version int64) (recorded int64, newer bool, err error) {
	b := &pgx.Batch{}
	b.Queue(s.lockVerSQL, key.Consumer, key.Aggregate)
	b.Queue(s.versionSQL, key.Consumer, key.Aggregate, version)
	br := tx.SendBatch(ctx, b)
	err = br.QueryRow().Scan(&recorded)
	if errors.Is(err, pgx.ErrNoRows) {
		recorded, err = 0, nil
	}
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, false, err
	}
	return recorded, tag.RowsAffected() > 0, nil
}

// claimTop claims key in a new transaction on a connection of its own.
//
// With OneRoundTripClaim it sends BEGIN and the record's INSERT as one
// simple-protocol query (pgx's TxOptions.BeginQuery), saving the round trip a
// separate BEGIN costs. The values are then inlined as string literals
// escaped by pgconn (which refuses unless standard_conforming_strings is on
// and the encoding UTF-8; the parameterized claim is used then). Because a
// begin query returns no row count, that INSERT has no ON CONFLICT clause: a
// committed record shows as a unique violation (23505), which ends the claim
// as a duplicate. The locking is that of ON CONFLICT DO NOTHING — a
// concurrent claimer waits on the primary key for the first transaction's
// outcome.
func (s *Store) claimTop(ctx context.Context, key middleware.InboxKey) (middleware.Claim, bool, error) {
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("pginbox: acquire: %w", err)
	}
	if s.oneRoundTrip && !strings.ContainsRune(key.Consumer+key.EventID, 0) {
		pg := conn.Conn().PgConn()
		consumer, err1 := pg.EscapeString(key.Consumer)
		eventID, err2 := pg.EscapeString(key.EventID)
		if err1 == nil && err2 == nil {
			opts := s.opts
			opts.BeginQuery = s.claimPrefix + `'` + consumer + `', '` + eventID + `')`
			tx, err := conn.BeginTx(ctx, opts)
			if err != nil {
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && pgErr.Code == "23505" { // unique_violation: handled before
					// End the aborted transaction so the connection returns
					// to the pool instead of being destroyed by Release.
					_, _ = conn.Exec(context.WithoutCancel(ctx), "rollback")
					conn.Release()
					return nil, false, nil
				}
				conn.Release()
				return nil, false, claimError("claim", err)
			}
			return &claim{store: s, tx: tx, conn: conn}, true, nil
		}
	}
	tx, err := conn.BeginTx(ctx, s.opts)
	if err != nil {
		conn.Release()
		return nil, false, fmt.Errorf("pginbox: begin: %w", err)
	}
	c := &claim{store: s, tx: tx, conn: conn}
	tag, err := tx.Exec(ctx, s.claimSQL, key.Consumer, key.EventID)
	if err != nil || tag.RowsAffected() == 0 {
		_ = c.Rollback(context.WithoutCancel(ctx))
		if err != nil {
			return nil, false, claimError("claim", err)
		}
		return nil, false, nil
	}
	return c, true, nil
}

// claimError wraps a failed claim (inbox or version, top-level or nested). A
// key PostgreSQL can never store (a NUL byte or an invalid character in it,
// or one too long for the index) is a permanent error: retrying cannot cure
// it, so the message goes to the dead letters at once instead of after every
// attempt.
func claimError(what string, err error) error {
	err = fmt.Errorf("pginbox: %s: %w", what, err)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "22021", // character_not_in_repertoire (a NUL byte, invalid UTF-8)
			"22P05", // untranslatable_character
			"54000": // program_limit_exceeded (index row size)
			return ackwise.Permanent(err)
		}
	}
	return err
}

// enclosing returns the claim ctx carries when it is on s's pool: a claim
// nested in it joins its transaction (a savepoint) instead of taking a
// second connection, so that the inbox and the version gate stacked on one
// pool commit together, whether they use one Store or two.
func (s *Store) enclosing(ctx context.Context) *txState {
	if st, _ := ctx.Value(ctxKey{}).(*txState); st != nil && st.store.db == s.db {
		return st
	}
	return nil
}

// claimNested runs a claim in a savepoint of an enclosing claim's
// transaction (the inbox and the version gate stacked on one pool share one
// transaction).
func (s *Store) claimNested(ctx context.Context, outer pgx.Tx, sql string, args ...any) (middleware.Claim, bool, error) {
	tx, err := outer.Begin(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("pginbox: savepoint: %w", err)
	}
	tag, err := tx.Exec(ctx, sql, args...)
	if err != nil || tag.RowsAffected() == 0 {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		if err != nil {
			return nil, false, claimError("claim", err)
		}
		return nil, false, nil
	}
	return &claim{store: s, tx: tx}, true, nil
}

// beginSQL renders the BEGIN statement of opts.
func beginSQL(opts pgx.TxOptions) (string, error) {
	if opts.BeginQuery != "" {
		return "", fmt.Errorf("pginbox: Config.TxOptions.BeginQuery %q is not supported", opts.BeginQuery)
	}
	q := "BEGIN"
	switch opts.IsoLevel {
	case "":
	case pgx.Serializable, pgx.RepeatableRead, pgx.ReadCommitted, pgx.ReadUncommitted:
		q += " ISOLATION LEVEL " + strings.ToUpper(string(opts.IsoLevel))
	default:
		return "", fmt.Errorf("pginbox: Config.TxOptions.IsoLevel %q is unknown", opts.IsoLevel)
	}
	switch opts.AccessMode {
	case "", pgx.ReadWrite:
	case pgx.ReadOnly:
		return "", errors.New(`pginbox: Config.TxOptions.AccessMode "read only" cannot insert inbox records`)
	default:
		return "", fmt.Errorf("pginbox: Config.TxOptions.AccessMode %q is unknown", opts.AccessMode)
	}
	switch opts.DeferrableMode {
	case "":
	case pgx.Deferrable, pgx.NotDeferrable:
		q += " " + strings.ToUpper(string(opts.DeferrableMode))
	default:
		return "", fmt.Errorf("pginbox: Config.TxOptions.DeferrableMode %q is unknown", opts.DeferrableMode)
	}
	return q, nil
}

// claim is an open claim. conn is the pooled connection of a top-level
// claim (nil for a savepoint), released once the transaction ends.
type claim struct {
	store *Store
	tx    pgx.Tx
	conn  *pgxpool.Conn
}

func (c *claim) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, ctxKey{}, &txState{store: c.store, tx: c.tx})
}

func (c *claim) Commit(ctx context.Context) error {
	err := c.tx.Commit(ctx)
	c.release()
	return err
}

func (c *claim) Rollback(ctx context.Context) error {
	err := c.tx.Rollback(ctx)
	c.release()
	return err
}

func (c *claim) release() {
	if c.conn != nil {
		c.conn.Release() // destroys the connection if the transaction did not end cleanly
		c.conn = nil
	}
}

// Prune deletes the inbox records committed more than olderThan ago (by the
// database's clock), in batches of DefaultPruneBatch rows, and returns how
// many it deleted. Run it periodically (a retention job); see the package
// documentation of middleware for sizing olderThan. Version records are
// never pruned: forgetting an aggregate's version would let a stale event
// apply.
func (s *Store) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("pginbox: Prune olderThan %v is negative", olderThan)
	}
	return middleware.PruneInBatches(DefaultPruneBatch, func() (int64, error) {
		tag, err := s.db.Exec(ctx, s.pruneSQL, olderThan.Microseconds(), DefaultPruneBatch)
		if err != nil {
			return 0, fmt.Errorf("pginbox: prune: %w", err)
		}
		return tag.RowsAffected(), nil
	})
}

// PruneEvery is a retention job: it calls [Store.Prune](ctx, olderThan)
// at once and then every interval until ctx is done, and returns ctx's
// error. A failed run is passed to onError (nil ignores it) and does not stop
// the job. Start it in a goroutine of its own; running it in several
// instances at once is safe. An interval of zero or less, or a negative
// olderThan, is an error returned at once.
func (s *Store) PruneEvery(ctx context.Context, interval, olderThan time.Duration, onError func(error)) error {
	err := middleware.PruneEvery(ctx, interval, olderThan, s.Prune, onError)
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("pginbox: %w", err)
	}
	return err
}

// Handled reports whether key has a committed inbox record.
func (s *Store) Handled(ctx context.Context, key middleware.InboxKey) (bool, error) {
	var ok bool
	if err := s.db.QueryRow(ctx, s.handledSQL, key.Consumer, key.EventID).Scan(&ok); err != nil {
		return false, fmt.Errorf("pginbox: handled: %w", err)
	}
	return ok, nil
}

// Version returns the last version committed for key, and false when there
// is none.
func (s *Store) Version(ctx context.Context, key middleware.VersionKey) (int64, bool, error) {
	var v int64
	err := s.db.QueryRow(ctx, s.getVerSQL, key.Consumer, key.Aggregate).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("pginbox: version: %w", err)
	}
	return v, true, nil
}

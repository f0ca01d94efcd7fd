package sqliteinbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/ackwise/ackwise/middleware"
)

// Default table names.
const (
	DefaultTable        = "ackwise_inbox"
	DefaultVersionTable = "ackwise_versions"
)

// DefaultBusyTimeout is how long [Open] lets a transaction wait for
// SQLite's single write lock before failing with SQLITE_BUSY (a transient
// error: the message is retried).
const DefaultBusyTimeout = 10 * time.Second

// DefaultPruneBatch is the number of rows one DELETE of [Store.Prune]
// removes.
const DefaultPruneBatch = 5000

// Open opens the SQLite database file at path (created if missing) with the
// settings the inbox wants: WAL journal, a busy timeout of
// DefaultBusyTimeout, and transactions that take the write lock at BEGIN
// (_txlock=immediate), so claimers queue for the lock instead of failing on
// upgrade; every transaction on the returned *sql.DB does so, including the
// application's own. Pass the result to [New]. The driver is
// modernc.org/sqlite (pure Go, no cgo). ":memory:" is refused: every
// pooled connection would open an empty database of its own.
func Open(path string) (*sql.DB, error) {
	if path == "" {
		return nil, errors.New(`sqliteinbox: Open path is ""`)
	}
	if path == ":memory:" {
		// Each connection of the *sql.DB pool would get a database of its
		// own: the tables Migrate made on one are missing on the others.
		return nil, errors.New(`sqliteinbox: Open path ":memory:" is not supported (each pooled connection would be a separate empty database); use a file, e.g. in t.TempDir(), or meminbox`)
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", DefaultBusyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Set("_txlock", "immediate")
	// The path is a file: URI's path: escape what would end it or be
	// decoded ("a?b.db" would open "a" without the pragmas).
	db, err := sql.Open("sqlite", "file:"+uriPathEscaper.Replace(path)+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("sqliteinbox: open %q: %w", path, err)
	}
	return db, nil
}

// uriPathEscaper escapes the characters that SQLite's URI filenames (and
// the driver's parameter parsing) give a meaning: the percent escape
// itself, the query and the fragment.
var uriPathEscaper = strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23")

// errClosedClaim is returned by a second Commit or Rollback of one claim.
var errClosedClaim = errors.New("sqliteinbox: claim already ended")

// Config configures [New]. The zero value means the documented defaults.
type Config struct {
	// Table is the inbox table; it must match [A-Za-z_][A-Za-z0-9_]* and be
	// at most 46 bytes. Default DefaultTable.
	Table string
	// VersionTable is the version gate's table, with the same rules. Default
	// DefaultVersionTable.
	VersionTable string
}

// Store is the SQLite inbox ([middleware.InboxStore]) and version store
// ([middleware.VersionStore]), the embedded default for examples and
// single-node services. It is safe for concurrent use. SQLite has one writer
// at a time, and each claim holds the write lock from its INSERT until its
// handler returns: handlers run one at a time however many workers the
// consumer has, and a handler that writes through the *sql.DB instead of
// [Tx] waits for its own claim's lock (until the busy timeout).
type Store struct {
	db           *sql.DB
	table        string
	versionTable string

	claimSQL   string
	versionSQL string
	lockVerSQL string
	pruneSQL   string
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,45}$`)

// New returns a Store over db (best opened with [Open]). It validates cfg
// (an error names the field and the value) but does not touch the database;
// call [Store.Migrate] first.
func New(db *sql.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqliteinbox: db is nil")
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if cfg.VersionTable == "" {
		cfg.VersionTable = DefaultVersionTable
	}
	if !identRE.MatchString(cfg.Table) {
		return nil, fmt.Errorf("sqliteinbox: Config.Table %q must match [A-Za-z_][A-Za-z0-9_]* and be at most 46 bytes", cfg.Table)
	}
	if !identRE.MatchString(cfg.VersionTable) {
		return nil, fmt.Errorf("sqliteinbox: Config.VersionTable %q must match [A-Za-z_][A-Za-z0-9_]* and be at most 46 bytes", cfg.VersionTable)
	}
	if strings.EqualFold(cfg.Table, cfg.VersionTable) {
		return nil, fmt.Errorf("sqliteinbox: Config.VersionTable %q is the same as Config.Table", cfg.VersionTable)
	}
	s := &Store{db: db, table: `"` + cfg.Table + `"`, versionTable: `"` + cfg.VersionTable + `"`}
	s.claimSQL = `INSERT INTO ` + s.table + ` (consumer, event_id, processed_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING`
	s.versionSQL = `INSERT INTO ` + s.versionTable + ` AS cur (consumer, aggregate, version, updated_at) VALUES (?, ?, ?, ?)
ON CONFLICT (consumer, aggregate) DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at
WHERE cur.version < excluded.version`
	s.lockVerSQL = `UPDATE ` + s.versionTable + ` SET version = version WHERE consumer = ? AND aggregate = ? RETURNING version`
	s.pruneSQL = `DELETE FROM ` + s.table + ` WHERE (consumer, event_id) IN (SELECT consumer, event_id FROM ` + s.table + ` WHERE processed_at < ? LIMIT ?)`
	return s, nil
}

// SchemaSQL returns the DDL [Store.Migrate] runs. Times are Unix
// milliseconds.
func (s *Store) SchemaSQL() string {
	idx := `"` + strings.Trim(s.table, `"`) + `_processed_at_idx"`
	return `CREATE TABLE IF NOT EXISTS ` + s.table + ` (
	consumer     TEXT    NOT NULL,
	event_id     TEXT    NOT NULL,
	processed_at INTEGER NOT NULL,
	PRIMARY KEY (consumer, event_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ` + idx + ` ON ` + s.table + ` (processed_at);
CREATE TABLE IF NOT EXISTS ` + s.versionTable + ` (
	consumer   TEXT    NOT NULL,
	aggregate  TEXT    NOT NULL,
	version    INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (consumer, aggregate)
) WITHOUT ROWID;`
}

// Migrate creates the inbox and version tables if they do not exist.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, s.SchemaSQL()); err != nil {
		return fmt.Errorf("sqliteinbox: migrate: %w", err)
	}
	return nil
}

type ctxKey struct{}

type txState struct {
	store *Store
	tx    *sql.Tx
}

// Tx returns the transaction of the inbox (or version gate) claim the
// handler runs in, or nil when ctx carries none. Write the handler's effects
// through it: they commit with the inbox record when the handler returns nil
// and roll back with it when the handler fails. The handler must not call
// its Commit or Rollback (the inbox does), and must not use it from two
// goroutines at once.
//
// A handler must return the error of every statement it runs through the
// transaction, above all a context error: a write statement interrupted
// because its context ended makes SQLite roll back the whole transaction,
// inbox record included, and the statements the handler runs after it then
// commit each on its own, outside any transaction. The inbox's commit then
// fails and the message is retried, but those effects have committed already
// and the retry applies them again. (PostgreSQL refuses every statement in a
// failed transaction; SQLite does not.)
func Tx(ctx context.Context) *sql.Tx {
	st, _ := ctx.Value(ctxKey{}).(*txState)
	if st == nil {
		return nil
	}
	return st.tx
}

// ClaimEvent implements [middleware.InboxStore] with INSERT … ON CONFLICT DO
// NOTHING in a new transaction (or a savepoint of an enclosing claim on the
// same *sql.DB, whichever Store made it). Concurrent claimers queue on
// SQLite's write lock.
func (s *Store) ClaimEvent(ctx context.Context, key middleware.InboxKey) (middleware.Claim, bool, error) {
	return s.claim(ctx, func(ctx context.Context, tx *sql.Tx) (bool, error) {
		return insert(ctx, tx, s.claimSQL, key.Consumer, key.EventID, time.Now().UnixMilli())
	})
}

var _ middleware.BatchInboxStore = (*Store)(nil)

// claimRows is the number of keys one INSERT of [Store.ClaimEvents] holds:
// 3 variables a row keeps it under 999, the variable limit of SQLite builds
// before 3.32 (later ones allow 32766).
const claimRows = 300

// ClaimEvents implements [middleware.BatchInboxStore] with one INSERT …
// VALUES (…), (…) ON CONFLICT DO NOTHING RETURNING per claimRows (300)
// keys, in one transaction (or a savepoint of an enclosing claim, as
// ClaimEvent). Concurrent claimers queue on SQLite's write lock, taken at
// BEGIN, so no two batch claims interleave.
func (s *Store) ClaimEvents(ctx context.Context, keys []middleware.InboxKey, claimed []bool) (middleware.Claim, error) {
	if len(claimed) != len(keys) {
		return nil, fmt.Errorf("sqliteinbox: ClaimEvents: %d claimed flags for %d keys", len(claimed), len(keys))
	}
	clear(claimed)
	c, _, err := s.claim(ctx, func(ctx context.Context, tx *sql.Tx) (bool, error) {
		return true, s.claimMany(ctx, tx, keys, claimed)
	})
	if err != nil {
		clear(claimed)
	}
	return c, err
}

// claimMany inserts keys in tx, claimRows a statement, and sets claimed[i]
// for each key inserted.
func (s *Store) claimMany(ctx context.Context, tx *sql.Tx, keys []middleware.InboxKey, claimed []bool) error {
	at := make(map[middleware.InboxKey]int, len(keys))
	for i, k := range keys {
		at[k] = i
	}
	now := time.Now().UnixMilli()
	var q strings.Builder
	args := make([]any, 0, 3*min(len(keys), claimRows))
	for chunk := range slices.Chunk(keys, claimRows) {
		q.Reset()
		q.WriteString(`INSERT INTO ` + s.table + ` (consumer, event_id, processed_at) VALUES `)
		args = args[:0]
		for i, k := range chunk {
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString("(?, ?, ?)")
			args = append(args, k.Consumer, k.EventID, now)
		}
		q.WriteString(` ON CONFLICT DO NOTHING RETURNING consumer, event_id`)
		rows, err := tx.QueryContext(ctx, q.String(), args...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var k middleware.InboxKey
			if err := rows.Scan(&k.Consumer, &k.EventID); err != nil {
				rows.Close()
				return err
			}
			if i, ok := at[k]; ok {
				claimed[i] = true
			}
		}
		if err := rows.Close(); err != nil {
			return err
		}
		if err := rows.Err(); err != nil {
			return err
		}
	}
	return nil
}

// ClaimVersion implements [middleware.VersionStore] with an upsert that
// writes version only where it is newer than the stored one. Before it, in
// the same transaction, it reads the recorded version with a no-op UPDATE …
// RETURNING, which takes the write lock (a SELECT would take a read
// snapshot, and the upsert after it would fail with SQLITE_BUSY if another
// connection wrote in between, on a database whose transactions begin
// deferred).
func (s *Store) ClaimVersion(ctx context.Context, key middleware.VersionKey, version int64) (middleware.Claim, int64, bool, error) {
	var recorded int64
	c, newer, err := s.claim(ctx, func(ctx context.Context, tx *sql.Tx) (bool, error) {
		err := tx.QueryRowContext(ctx, s.lockVerSQL, key.Consumer, key.Aggregate).Scan(&recorded)
		if errors.Is(err, sql.ErrNoRows) {
			recorded, err = 0, nil
		}
		if err != nil {
			return false, err
		}
		return insert(ctx, tx, s.versionSQL, key.Consumer, key.Aggregate, version, time.Now().UnixMilli())
	})
	return c, recorded, newer, err
}

// insert runs query, an INSERT, in tx and reports whether it affected a row.
func insert(ctx context.Context, tx *sql.Tx, query string, args ...any) (bool, error) {
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

// claim opens a claim: a transaction (or a savepoint of the enclosing
// claim's), in which it runs body; the claim is kept when body reports true,
// and rolled back when it reports false or fails.
func (s *Store) claim(ctx context.Context, body func(context.Context, *sql.Tx) (bool, error)) (middleware.Claim, bool, error) {
	c := &claim{store: s}
	// stop detaches the transaction from ctx once the claim is made; it
	// reports false when ctx ended first (the transaction is then being
	// rolled back).
	stop := func() bool { return true }
	// A claim on the same *sql.DB joins the enclosing claim's transaction:
	// a second transaction would wait for the write lock the first holds,
	// until the busy timeout.
	if st, _ := ctx.Value(ctxKey{}).(*txState); st != nil && st.store.db == s.db {
		c.tx, c.savepoint = st.tx, true
		if _, err := c.tx.ExecContext(ctx, `SAVEPOINT ackwise_claim`); err != nil {
			return nil, false, fmt.Errorf("sqliteinbox: savepoint: %w", err)
		}
	} else {
		// database/sql rolls a transaction back when the context passed to
		// BeginTx ends, and its Commit fails from then on. The claim must
		// outlive ctx (the middleware commits a finished handler's work
		// even when the handler's context ended meanwhile), so the
		// transaction gets a context of its own, cancelled by ctx only
		// until the claim is made: ctx still bounds the wait for the write
		// lock.
		txCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		stop = context.AfterFunc(ctx, cancel)
		c.cancel = cancel
		tx, err := s.db.BeginTx(txCtx, nil)
		if err != nil {
			stop()
			cancel()
			return nil, false, fmt.Errorf("sqliteinbox: begin: %w", err)
		}
		c.tx = tx
	}
	keep, err := body(ctx, c.tx)
	if !stop() && err == nil {
		err = context.Cause(ctx)
	}
	if err != nil || !keep {
		_ = c.Rollback(context.WithoutCancel(ctx))
		if err != nil {
			return nil, false, fmt.Errorf("sqliteinbox: claim: %w", err)
		}
		return nil, false, nil
	}
	return c, true, nil
}

type claim struct {
	store     *Store
	tx        *sql.Tx
	cancel    context.CancelFunc // of a top-level claim's transaction context
	savepoint bool
	ended     bool
}

func (c *claim) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, ctxKey{}, &txState{store: c.store, tx: c.tx})
}

func (c *claim) Commit(ctx context.Context) error {
	if c.ended {
		return errClosedClaim
	}
	c.ended = true
	if c.savepoint {
		_, err := c.tx.ExecContext(ctx, `RELEASE ackwise_claim`)
		return err
	}
	// ctx bounds the COMMIT: the driver ends a COMMIT waiting for a lock
	// when the transaction's context ends.
	stop := context.AfterFunc(ctx, c.cancel)
	defer stop()
	defer c.cancel()
	return c.tx.Commit()
}

func (c *claim) Rollback(ctx context.Context) error {
	if c.ended {
		return errClosedClaim
	}
	c.ended = true
	if c.savepoint {
		if _, err := c.tx.ExecContext(ctx, `ROLLBACK TO ackwise_claim`); err != nil {
			return err
		}
		_, err := c.tx.ExecContext(ctx, `RELEASE ackwise_claim`)
		return err
	}
	defer c.cancel()
	return c.tx.Rollback()
}

// Prune deletes the inbox records committed more than olderThan ago (by
// this process's clock), in batches of DefaultPruneBatch, and returns how
// many it deleted. Version records are never pruned.
func (s *Store) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("sqliteinbox: Prune olderThan %v is negative", olderThan)
	}
	cutoff := time.Now().Add(-olderThan).UnixMilli()
	return middleware.PruneInBatches(DefaultPruneBatch, func() (int64, error) {
		res, err := s.db.ExecContext(ctx, s.pruneSQL, cutoff, DefaultPruneBatch)
		if err != nil {
			return 0, fmt.Errorf("sqliteinbox: prune: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, fmt.Errorf("sqliteinbox: prune: %w", err)
		}
		return n, nil
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
		return fmt.Errorf("sqliteinbox: %w", err)
	}
	return err
}

// Handled reports whether key has a committed inbox record.
func (s *Store) Handled(ctx context.Context, key middleware.InboxKey) (bool, error) {
	var ok bool
	err := s.db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.table+` WHERE consumer = ? AND event_id = ?)`,
		key.Consumer, key.EventID).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("sqliteinbox: handled: %w", err)
	}
	return ok, nil
}

// Version returns the last version committed for key, and false when there
// is none.
func (s *Store) Version(ctx context.Context, key middleware.VersionKey) (int64, bool, error) {
	var v int64
	err := s.db.QueryRowContext(ctx, `SELECT version FROM `+s.versionTable+` WHERE consumer = ? AND aggregate = ?`,
		key.Consumer, key.Aggregate).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("sqliteinbox: version: %w", err)
	}
	return v, true, nil
}

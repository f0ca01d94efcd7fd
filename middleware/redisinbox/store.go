package redisinbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
)

// Defaults of [Config].
const (
	DefaultPrefix    = "ackwise:inbox:"
	DefaultLockTTL   = 5 * time.Minute
	DefaultRetention = 7 * 24 * time.Hour
)

// ErrInProgress is returned (wrapped, marked [ackwise.RetryAfter] with the
// lock's remaining time) by ClaimEvent when another delivery of the event
// holds the in-progress lock: the message is retried once the lock's
// remaining time has passed (it is not woken when the other delivery ends
// earlier); the retry then finds the done record, a free key, or a new lock.
var ErrInProgress = errors.New("redisinbox: event is being handled by another delivery")

// doneValue marks a handled event; an in-progress lock is "p:" + token.
const doneValue = "d"

// Config configures [New]. The zero value means the documented defaults.
type Config struct {
	// Prefix starts every key the store writes. Default DefaultPrefix.
	Prefix string
	// LockTTL is how long a claim's in-progress lock lives. It must be longer
	// than the handler's longest run (set a middleware.Timeout below it):
	// a lock that expires while its handler still runs lets a redelivery run
	// the handler concurrently. Default DefaultLockTTL.
	LockTTL time.Duration
	// Retention is how long a handled event is remembered; it must cover the
	// broker's longest redelivery window plus any replay window (see the
	// middleware package documentation). Default DefaultRetention.
	Retention time.Duration
}

// Store is the Redis inbox ([middleware.InboxStore]): SET NX with a TTL. It
// is not transactional with the handler's effect, which is why it is meant
// for guarding calls to external systems, not database writes; see the
// package documentation for its exact semantics and failure windows. A Store
// is safe for concurrent use.
type Store struct {
	rdb       redis.UniversalClient
	prefix    string
	lockTTL   time.Duration
	retention time.Duration
}

// New returns a Store over rdb. Invalid settings return an error naming the
// field and the value.
func New(rdb redis.UniversalClient, cfg Config) (*Store, error) {
	if rdb == nil {
		return nil, errors.New("redisinbox: client is nil")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.LockTTL == 0 {
		cfg.LockTTL = DefaultLockTTL
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.LockTTL < time.Millisecond {
		return nil, fmt.Errorf("redisinbox: Config.LockTTL %v must be at least 1ms", cfg.LockTTL)
	}
	if cfg.Retention < time.Millisecond {
		return nil, fmt.Errorf("redisinbox: Config.Retention %v must be at least 1ms", cfg.Retention)
	}
	return &Store{rdb: rdb, prefix: cfg.Prefix, lockTTL: cfg.LockTTL, retention: cfg.Retention}, nil
}

// Key returns the Redis key of an inbox key: the prefix, then the consumer
// name length-prefixed (so no consumer name or event ID can collide with
// another), then the event ID.
func (s *Store) Key(key middleware.InboxKey) string {
	return s.prefix + strconv.Itoa(len(key.Consumer)) + ":" + key.Consumer + ":" + key.EventID
}

// claimScript sets the in-progress lock if the key is free; else it reports
// whether the event is done or locked (with the lock's remaining ms).
var claimScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, 0} end
local v = redis.call('GET', KEYS[1])
if v == ARGV[3] then return {0, 0} end
return {2, redis.call('PTTL', KEYS[1])}
`)

// releaseScript deletes the key only if it still holds this claim's lock.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// ClaimEvent implements [middleware.InboxStore]. It sets an in-progress lock
// (SET NX PX LockTTL) and returns claimed=true; a done record returns
// claimed=false; a lock held by another delivery returns [ErrInProgress]
// marked RetryAfter. It never waits.
func (s *Store) ClaimEvent(ctx context.Context, key middleware.InboxKey) (middleware.Claim, bool, error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	lock := "p:" + hex.EncodeToString(b[:])
	k := s.Key(key)
	res, err := claimScript.Run(ctx, s.rdb, []string{k}, lock, s.lockTTL.Milliseconds(), doneValue).Int64Slice()
	if err != nil {
		return nil, false, fmt.Errorf("redisinbox: claim: %w", err)
	}
	if len(res) != 2 {
		return nil, false, fmt.Errorf("redisinbox: claim: unexpected reply %v", res)
	}
	switch res[0] {
	case 1:
		return &claim{s: s, key: k, lock: lock}, true, nil
	case 0:
		return nil, false, nil
	default:
		wait := time.Duration(res[1]) * time.Millisecond
		if wait <= 0 {
			wait = time.Millisecond
		}
		return nil, false, ackwise.RetryAfter(fmt.Errorf("%w (lock expires in %v)", ErrInProgress, wait), wait)
	}
}

// Handled reports whether key has a done record.
func (s *Store) Handled(ctx context.Context, key middleware.InboxKey) (bool, error) {
	v, err := s.rdb.Get(ctx, s.Key(key)).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("redisinbox: handled: %w", err)
	}
	return v == doneValue, nil
}

type claim struct {
	s    *Store
	key  string
	lock string
}

func (c *claim) Context(ctx context.Context) context.Context { return ctx }

// Commit replaces the lock with the done record for Retention. It writes
// even if the lock expired meanwhile: the handler's effect happened.
func (c *claim) Commit(ctx context.Context) error {
	if err := c.s.rdb.Set(ctx, c.key, doneValue, c.s.retention).Err(); err != nil {
		return fmt.Errorf("redisinbox: mark done: %w", err)
	}
	return nil
}

// Rollback deletes the lock if it is still this claim's, so a retry can
// claim the event at once.
func (c *claim) Rollback(ctx context.Context) error {
	if err := releaseScript.Run(ctx, c.s.rdb, []string{c.key}, c.lock).Err(); err != nil {
		return fmt.Errorf("redisinbox: release: %w", err)
	}
	return nil
}

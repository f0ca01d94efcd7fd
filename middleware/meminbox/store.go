package meminbox

import (
	"context"
	"sync"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
)

// Store is an in-memory inbox and version store. The zero value is not
// usable; call New. A Store is safe for concurrent use.
type Store struct {
	clock ackwise.Clock

	mu       sync.Mutex
	events   map[middleware.InboxKey]time.Time
	versions map[middleware.VersionKey]int64
	pending  map[any]chan struct{} // InboxKey or VersionKey → closed when its claim ends
}

// New returns an empty Store. A nil clock means ackwise.SystemClock; it
// stamps records for [Store.Prune].
func New(clock ackwise.Clock) *Store {
	if clock == nil {
		clock = ackwise.SystemClock
	}
	return &Store{
		clock:    clock,
		events:   make(map[middleware.InboxKey]time.Time),
		versions: make(map[middleware.VersionKey]int64),
		pending:  make(map[any]chan struct{}),
	}
}

// lockKey waits until no claim on k is pending and, when ok(k) holds under
// the lock, marks k pending and returns true.
func (s *Store) lockKey(ctx context.Context, k any, ok func() bool) (bool, error) {
	for {
		s.mu.Lock()
		if ch := s.pending[k]; ch != nil {
			s.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return false, ctx.Err()
			}
		}
		if !ok() {
			s.mu.Unlock()
			return false, nil
		}
		s.pending[k] = make(chan struct{})
		s.mu.Unlock()
		return true, nil
	}
}

// unlockKeys ends the pending claims on keys, running apply under the lock
// first. It must be called with s.mu not held.
func (s *Store) unlockKeys(keys []any, apply func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if apply != nil {
		apply()
	}
	for _, k := range keys {
		close(s.pending[k])
		delete(s.pending, k)
	}
}

// ClaimEvent implements [middleware.InboxStore]. A second claim on a key
// waits until the first ends.
func (s *Store) ClaimEvent(ctx context.Context, key middleware.InboxKey) (middleware.Claim, bool, error) {
	ok, err := s.lockKey(ctx, key, func() bool { _, done := s.events[key]; return !done })
	if err != nil || !ok {
		return nil, false, err
	}
	return &claim{s: s, keys: []any{key}, commit: func() { s.events[key] = s.clock.Now() }}, true, nil
}

var _ middleware.BatchInboxStore = (*Store)(nil)

// ClaimEvents implements [middleware.BatchInboxStore]: it claims the keys
// one after another, in the caller's order, each waiting as ClaimEvent does
// while another claim holds it. If ctx ends meanwhile it releases the keys
// it claimed and returns ctx's error.
func (s *Store) ClaimEvents(ctx context.Context, keys []middleware.InboxKey, claimed []bool) (middleware.Claim, error) {
	c := &claim{s: s, commit: func() {}}
	var held []any
	for i, key := range keys {
		ok, err := s.lockKey(ctx, key, func() bool { _, done := s.events[key]; return !done })
		if err != nil {
			c.keys = held
			_ = c.Rollback(ctx)
			clear(claimed)
			return nil, err
		}
		claimed[i] = ok
		if ok {
			held = append(held, key)
		}
	}
	c.keys = held
	c.commit = func() {
		now := s.clock.Now()
		for _, k := range held {
			s.events[k.(middleware.InboxKey)] = now
		}
	}
	return c, nil
}

// ClaimVersion implements [middleware.VersionStore].
func (s *Store) ClaimVersion(ctx context.Context, key middleware.VersionKey, version int64) (middleware.Claim, int64, bool, error) {
	var recorded int64
	ok, err := s.lockKey(ctx, key, func() bool {
		v, seen := s.versions[key]
		recorded = v // 0 when unseen
		return !seen || v < version
	})
	if err != nil || !ok {
		return nil, recorded, false, err
	}
	return &claim{s: s, keys: []any{key}, commit: func() { s.versions[key] = version }}, recorded, true, nil
}

// Handled reports whether key has a committed record.
func (s *Store) Handled(key middleware.InboxKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.events[key]
	return ok
}

// Version returns the last version committed for key and whether there is
// one.
func (s *Store) Version(key middleware.VersionKey) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.versions[key]
	return v, ok
}

// Prune deletes the inbox records committed more than olderThan ago and
// returns how many it deleted. Versions are never pruned. A negative
// olderThan deletes nothing (the SQL stores refuse it).
func (s *Store) Prune(olderThan time.Duration) int {
	if olderThan < 0 {
		return 0
	}
	cutoff := s.clock.Now().Add(-olderThan)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, at := range s.events {
		if at.Before(cutoff) {
			delete(s.events, k)
			n++
		}
	}
	return n
}

type claim struct {
	s      *Store
	keys   []any
	commit func()
	ended  bool
}

func (c *claim) Context(ctx context.Context) context.Context { return ctx }

func (c *claim) Commit(context.Context) error {
	if c.ended {
		return nil
	}
	c.ended = true
	c.s.unlockKeys(c.keys, c.commit)
	return nil
}

func (c *claim) Rollback(context.Context) error {
	if c.ended {
		return nil
	}
	c.ended = true
	c.s.unlockKeys(c.keys, nil)
	return nil
}

package middleware_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/meminbox"
)

// batchStore is a BatchInboxStore whose claims fail the way a real store's
// can: claimErr (given the keys) fails ClaimEvents, commitErr every commit.
// It claims every key and counts its calls, commits and rollbacks.
type batchStore struct {
	faultyStore
	claimErr              func(keys []middleware.InboxKey) error
	claims, ends, commits atomic.Int32
	lastKeys              []middleware.InboxKey
}

func (s *batchStore) ClaimEvents(_ context.Context, keys []middleware.InboxKey, claimed []bool) (middleware.Claim, error) {
	s.claims.Add(1)
	s.lastKeys = slices.Clone(keys)
	if s.claimErr != nil {
		if err := s.claimErr(keys); err != nil {
			return nil, err
		}
	}
	for i := range claimed {
		claimed[i] = true
	}
	return &batchClaim{s}, nil
}

type batchClaim struct{ s *batchStore }

func (*batchClaim) Context(ctx context.Context) context.Context { return ctx }
func (c *batchClaim) Commit(ctx context.Context) error {
	c.s.ends.Add(1)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if c.s.commitErr != nil {
		return c.s.commitErr
	}
	c.s.commits.Add(1)
	return nil
}
func (c *batchClaim) Rollback(context.Context) error { c.s.ends.Add(1); return nil }

func batchOf(ids ...string) []*ackwise.Message {
	msgs := make([]*ackwise.Message, len(ids))
	for i, id := range ids {
		msgs[i] = &ackwise.Message{ID: id}
	}
	return msgs
}

func outcomes(err error, n int) []error {
	errs := make([]error, n)
	ackwise.BatchOutcomes(err, errs)
	return errs
}

func TestBatchInboxCommitError(t *testing.T) {
	t.Parallel()
	down := errors.New("connection reset during COMMIT")
	s := &batchStore{faultyStore: faultyStore{commitErr: down}}
	mw, _ := middleware.BatchInbox(s, middleware.InboxConfig{Consumer: "c"})
	msgs := batchOf("a", "b", "a")
	msgs = append(msgs, &ackwise.Message{}) // no event ID: fails on its own
	err := mw(ackwise.BatchHandlerFunc(func(context.Context, []*ackwise.Message) error { return nil })).HandleBatch(t.Context(), msgs)
	errs := outcomes(err, len(msgs))
	for i := range 3 {
		if !errors.Is(errs[i], down) || !strings.Contains(errs[i].Error(), "batch inbox commit") || ackwise.ClassOf(errs[i]) != ackwise.ClassTransient {
			t.Fatalf("message %d: %v, want the commit error, transient", i, errs[i])
		}
	}
	if !errors.Is(errs[3], middleware.ErrNoEventID) {
		t.Fatalf("message without an ID: %v, want ErrNoEventID", errs[3])
	}
	if s.claims.Load() != 1 || s.ends.Load() != 1 {
		t.Fatalf("%d claims, %d ends; want 1 and 1", s.claims.Load(), s.ends.Load())
	}
}

func TestBatchInboxClaimError(t *testing.T) {
	t.Parallel()
	down := errors.New("connection refused")
	s := &batchStore{claimErr: func([]middleware.InboxKey) error { return down }}
	mw, _ := middleware.BatchInbox(s, middleware.InboxConfig{Consumer: "c"})
	var calls atomic.Int32
	h := mw(ackwise.BatchHandlerFunc(func(context.Context, []*ackwise.Message) error { calls.Add(1); return nil }))
	errs := outcomes(h.HandleBatch(t.Context(), batchOf("a", "b")), 2)
	for i, err := range errs {
		if !errors.Is(err, down) || ackwise.ClassOf(err) != ackwise.ClassTransient {
			t.Fatalf("message %d: %v, want the claim error, transient", i, err)
		}
	}
	if calls.Load() != 0 || s.claims.Load() != 1 {
		t.Fatalf("handler called %d times after %d claims; want 0 after 1 (a transient error is not isolated)", calls.Load(), s.claims.Load())
	}
}

// TestBatchInboxIsolatesUnstorableKey: a permanent claim error of many keys
// is traced to the key that causes it by claiming each alone; only its
// message fails.
func TestBatchInboxIsolatesUnstorableKey(t *testing.T) {
	t.Parallel()
	tooLong := ackwise.Permanent(errors.New("index row size exceeds maximum"))
	s := &batchStore{claimErr: func(keys []middleware.InboxKey) error {
		for _, k := range keys {
			if k.EventID == "huge" {
				return tooLong
			}
		}
		return nil
	}}
	mw, _ := middleware.BatchInbox(s, middleware.InboxConfig{Consumer: "c"})
	var seen []string
	h := mw(ackwise.BatchHandlerFunc(func(_ context.Context, msgs []*ackwise.Message) error {
		for _, m := range msgs {
			seen = append(seen, m.ID)
		}
		return nil
	}))
	errs := outcomes(h.HandleBatch(t.Context(), batchOf("a", "huge", "b")), 3)
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], tooLong) || ackwise.ClassOf(errs[1]) != ackwise.ClassPermanent {
		t.Fatalf("outcomes %v; want nil, the permanent error, nil", errs)
	}
	if !slices.Equal(seen, []string{"a", "b"}) || s.commits.Load() != 1 {
		t.Fatalf("handler saw %v, %d commits; want [a b] committed once", seen, s.commits.Load())
	}
	// The batch claim, one probe per key, the claim without the bad key.
	if n := s.claims.Load(); n != 5 {
		t.Fatalf("%d claims, want 5", n)
	}
	if s.ends.Load() != 3 {
		t.Fatalf("%d claims ended, want 3 (two probes and the batch)", s.ends.Load())
	}
}

// TestBatchInboxLeavesCallersSliceAlone: the batch the handler sees is the
// inbox's own, and the caller's slice keeps its order and contents.
func TestBatchInboxLeavesCallersSliceAlone(t *testing.T) {
	t.Parallel()
	mw, _ := middleware.BatchInbox(meminbox.New(nil), middleware.InboxConfig{Consumer: "c"})
	msgs := batchOf("c", "a", "b", "a")
	orig := slices.Clone(msgs)
	round := 0
	h := mw(ackwise.BatchHandlerFunc(func(_ context.Context, batch []*ackwise.Message) error {
		round++
		if round == 1 {
			be := ackwise.NewBatchError(len(batch))
			be.Set(0, errors.New("first fails"))
			return be.Err()
		}
		return nil
	}))
	errs := outcomes(h.HandleBatch(t.Context(), msgs), len(msgs))
	if !slices.Equal(msgs, orig) {
		t.Fatal("the inbox changed the caller's slice")
	}
	// Sorted, "a" ran first and failed: its copy shares its outcome.
	if errs[1] == nil || errs[3] == nil || errs[0] != nil || errs[2] != nil || round != 2 {
		t.Fatalf("outcomes %v after %d rounds; want a and its copy failed, b and c committed in round 2", errs, round)
	}
}

func TestBatchInboxCommitsFinishedWorkAfterCancel(t *testing.T) {
	t.Parallel()
	s := &batchStore{}
	mw, _ := middleware.BatchInbox(s, middleware.InboxConfig{Consumer: "c"})
	ctx, cancel := context.WithCancel(t.Context())
	h := mw(ackwise.BatchHandlerFunc(func(context.Context, []*ackwise.Message) error {
		cancel()
		return nil
	}))
	if err := h.HandleBatch(ctx, batchOf("a")); err != nil || s.commits.Load() != 1 {
		t.Fatalf("got %v, %d commits; want nil and 1", err, s.commits.Load())
	}
}

// TestBatchInboxRoundsBounded: a handler that fails one message a round
// takes one round per message, and the inbox stops when none is left.
func TestBatchInboxRoundsBounded(t *testing.T) {
	t.Parallel()
	s := &batchStore{}
	mw, _ := middleware.BatchInbox(s, middleware.InboxConfig{Consumer: "c"})
	var rounds atomic.Int32
	h := mw(ackwise.BatchHandlerFunc(func(_ context.Context, batch []*ackwise.Message) error {
		rounds.Add(1)
		be := ackwise.NewBatchError(len(batch))
		be.Set(len(batch)-1, ackwise.RetryAfter(errors.New("busy"), time.Second))
		return be.Err()
	}))
	errs := outcomes(h.HandleBatch(t.Context(), batchOf("a", "b", "c", "d")), 4)
	for i, err := range errs {
		if ackwise.ClassOf(err) != ackwise.ClassRateLimited {
			t.Fatalf("message %d: %v, want its own RetryAfter error", i, err)
		}
	}
	if rounds.Load() != 4 || s.commits.Load() != 0 || s.ends.Load() != 4 {
		t.Fatalf("%d rounds, %d commits, %d ends; want 4, 0, 4", rounds.Load(), s.commits.Load(), s.ends.Load())
	}
}

// TestBatchInboxClaimsSortedKeys: the keys reach the store once each and
// sorted, whatever the batch's order, so that two batches with common
// events lock them in one order.
func TestBatchInboxClaimsSortedKeys(t *testing.T) {
	t.Parallel()
	s := &batchStore{}
	mw, _ := middleware.BatchInbox(s, middleware.InboxConfig{Consumer: "c"})
	h := mw(ackwise.BatchHandlerFunc(func(context.Context, []*ackwise.Message) error { return nil }))
	if err := h.HandleBatch(t.Context(), batchOf("k3", "k1", "k2", "k1", "k0")); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, k := range s.lastKeys {
		got = append(got, k.EventID)
	}
	if want := []string{"k0", "k1", "k2", "k3"}; !slices.Equal(got, want) {
		t.Fatalf("claimed %v, want %v (distinct, sorted)", got, want)
	}
}

package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
)

// Batch describes the store [RunBatch] drives and the effect its handler
// applies.
type Batch struct {
	// NewStore returns the store under test. It is called once per
	// subtest; subtests run in parallel and use unique consumer names and
	// event IDs.
	NewStore func(t *testing.T) middleware.BatchInboxStore
	// Handled reports whether key has a committed inbox record.
	Handled func(ctx context.Context, key middleware.InboxKey) (bool, error)
	// Apply writes one effect per message of msgs (keyed by Message.ID)
	// through the claim's transaction, which ctx carries. Nil (with Effects
	// and Pending nil): the suite keeps the effects in memory and commits or
	// discards them with the claim, as a transaction would (meminbox).
	Apply func(ctx context.Context, msgs []*ackwise.Message) error
	// Effects returns how many effects of eventID have committed.
	Effects func(t testing.TB, eventID string) int
	// Pending returns how many effects of eventID the claim's transaction
	// in ctx sees: the committed ones and its own uncommitted writes.
	Pending func(ctx context.Context, eventID string) (int, error)
}

// RunBatch runs the conformance tests of a [middleware.BatchInboxStore]
// under [middleware.BatchInbox]: duplicates within a batch and across
// batches apply once; a failed message rolls back the effects of the
// others, which commit on the re-run without it; a batch that fails (or
// panics) as a whole commits nothing; key errors fail only their message;
// concurrent batches with the same keys in different orders apply each
// event once and do not deadlock.
func RunBatch(t *testing.T, e Batch) {
	t.Helper()
	if e.Apply == nil && e.Effects == nil && e.Pending == nil {
		mem := &memEffects{committed: map[string]int{}}
		newStore := e.NewStore
		e.NewStore = func(t *testing.T) middleware.BatchInboxStore { return memTxStore{newStore(t), mem} }
		e.Apply, e.Effects, e.Pending = mem.apply, mem.effects, mem.pending
	}
	if e.NewStore == nil || e.Handled == nil || e.Apply == nil || e.Effects == nil || e.Pending == nil {
		t.Fatal("inboxtest.Batch: NewStore and Handled are required, and Apply, Effects and Pending all or none")
	}

	t.Run("DuplicatesRunOnce", func(t *testing.T) {
		t.Parallel()
		r := newBatchRun(t, e, middleware.InboxConfig{})
		var seen [][]string
		h := r.wrap(func(ctx context.Context, msgs []*ackwise.Message) error {
			seen = append(seen, r.names(msgs))
			return e.Apply(ctx, msgs)
		})
		r.want(t, "first batch", h, r.batch("a", "b", "a", "c"), nil, nil, nil, nil)
		r.want(t, "second batch", h, r.batch("c", "d", "b"), nil, nil, nil)
		if want := [][]string{{"a", "b", "c"}, {"d"}}; !slices.EqualFunc(seen, want, slices.Equal) {
			t.Fatalf("handler saw %v, want %v (each event once)", seen, want)
		}
		r.effects(t, map[string]int{"a": 1, "b": 1, "c": 1, "d": 1})
		if n := r.dups.Load(); n != 3 {
			t.Fatalf("OnDuplicate called %d times, want 3 (a's copy, then c and b)", n)
		}
	})

	t.Run("FailedMessageRerunsTheOthers", func(t *testing.T) {
		t.Parallel()
		r := newBatchRun(t, e, middleware.InboxConfig{})
		boom := errors.New("b failed after the batch wrote its effects")
		var seen [][]string
		h := r.wrap(func(ctx context.Context, msgs []*ackwise.Message) error {
			seen = append(seen, r.names(msgs))
			for _, m := range msgs {
				n, err := e.Pending(ctx, m.ID)
				if err != nil {
					return err
				}
				if n != 0 {
					return fmt.Errorf("the transaction sees %d effects of %s from an earlier round, want 0 (rolled back)", n, r.name(m))
				}
			}
			if err := e.Apply(ctx, msgs); err != nil {
				return err
			}
			be := ackwise.NewBatchError(len(msgs))
			for i, m := range msgs {
				if r.name(m) == "b" && len(seen) == 1 {
					be.Set(i, boom)
				}
			}
			return be.Err()
		})
		r.want(t, "batch", h, r.batch("a", "b", "c", "b"), nil, boom, nil, boom)
		if want := [][]string{{"a", "b", "c"}, {"a", "c"}}; !slices.EqualFunc(seen, want, slices.Equal) {
			t.Fatalf("handler saw %v, want %v (the failed round, then the others)", seen, want)
		}
		r.effects(t, map[string]int{"a": 1, "b": 0, "c": 1})
		r.handled(t, map[string]bool{"a": true, "b": false, "c": true})
		r.want(t, "redelivery of b", h, r.batch("b", "a"), nil, nil)
		r.effects(t, map[string]int{"a": 1, "b": 1, "c": 1})
	})

	t.Run("WholeBatchFailureCommitsNothing", func(t *testing.T) {
		t.Parallel()
		r := newBatchRun(t, e, middleware.InboxConfig{})
		down := errors.New("warehouse down")
		var calls atomic.Int32
		h := r.wrap(func(ctx context.Context, msgs []*ackwise.Message) error {
			calls.Add(1)
			if err := e.Apply(ctx, msgs); err != nil {
				return err
			}
			return down
		})
		r.want(t, "batch", h, r.batch("a", "b", "c"), down, down, down)
		if n := calls.Load(); n != 1 {
			t.Fatalf("handler called %d times, want 1 (no message left to re-run)", n)
		}
		r.effects(t, map[string]int{"a": 0, "b": 0, "c": 0})
		r.handled(t, map[string]bool{"a": false, "b": false, "c": false})
	})

	t.Run("PanicCommitsNothing", func(t *testing.T) {
		t.Parallel()
		r := newBatchRun(t, e, middleware.InboxConfig{})
		var calls atomic.Int32
		h := r.wrap(func(ctx context.Context, msgs []*ackwise.Message) error {
			if err := e.Apply(ctx, msgs); err != nil {
				return err
			}
			if calls.Add(1) == 1 {
				panic("handler bug")
			}
			return nil
		})
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("the handler's panic did not reach the caller")
				}
			}()
			_ = h.HandleBatch(t.Context(), r.batch("a", "b"))
		}()
		r.effects(t, map[string]int{"a": 0, "b": 0})
		// The claim was released: the retry claims the keys again.
		r.want(t, "retry", h, r.batch("a", "b"), nil, nil)
		r.effects(t, map[string]int{"a": 1, "b": 1})
	})

	t.Run("KeyErrorsFailOnlyTheirMessage", func(t *testing.T) {
		t.Parallel()
		noKey := errors.New("no order header")
		keyFunc := func(m *ackwise.Message) (string, error) {
			k := m.Headers.Get("order")
			if k == "!" {
				return "", noKey
			}
			return k, nil
		}
		for _, allow := range []bool{false, true} {
			r := newBatchRun(t, e, middleware.InboxConfig{KeyFunc: keyFunc, AllowMissingKey: allow})
			var seen [][]string
			h := r.wrap(func(ctx context.Context, msgs []*ackwise.Message) error {
				seen = append(seen, r.names(msgs))
				return e.Apply(ctx, msgs)
			})
			msgs := r.batch("a", "bad", "nokey", "c")
			for _, m := range msgs {
				switch r.name(m) {
				case "bad":
					m.Headers.Set("order", "!")
				case "nokey":
				default:
					m.Headers.Set("order", m.ID)
				}
			}
			err := h.HandleBatch(t.Context(), msgs)
			errs := make([]error, len(msgs))
			ackwise.BatchOutcomes(err, errs)
			if !errors.Is(errs[1], noKey) || ackwise.ClassOf(errs[1]) != ackwise.ClassPermanent {
				t.Fatalf("AllowMissingKey %v: KeyFunc error gave %v, want it marked permanent", allow, errs[1])
			}
			wantRun := []string{"a", "c", "nokey"}
			if allow {
				if errs[2] != nil {
					t.Fatalf("AllowMissingKey: the message without a key failed with %v, want it run", errs[2])
				}
			} else {
				wantRun = []string{"a", "c"}
				if !errors.Is(errs[2], middleware.ErrNoEventID) || ackwise.ClassOf(errs[2]) != ackwise.ClassPermanent {
					t.Fatalf("message without a key: %v, want a permanent ErrNoEventID", errs[2])
				}
			}
			if errs[0] != nil || errs[3] != nil {
				t.Fatalf("AllowMissingKey %v: keyed messages failed: %v, %v", allow, errs[0], errs[3])
			}
			if len(seen) != 1 || !slices.Equal(seen[0], wantRun) {
				t.Fatalf("AllowMissingKey %v: handler saw %v, want one call with %v", allow, seen, wantRun)
			}
			want := map[string]int{"a": 1, "bad": 0, "c": 1, "nokey": 0}
			if allow {
				want["nokey"] = 1
			}
			r.effects(t, want)
		}
	})

	t.Run("KeylessBatchRunsInATransaction", func(t *testing.T) {
		t.Parallel()
		noKey := func(*ackwise.Message) (string, error) { return "", nil }
		r := newBatchRun(t, e, middleware.InboxConfig{KeyFunc: noKey, AllowMissingKey: true})
		h := r.wrap(e.Apply)
		for range 2 { // no deduplication: both deliveries apply
			r.want(t, "batch without keys", h, r.batch("a", "b"), nil, nil)
		}
		r.effects(t, map[string]int{"a": 2, "b": 2})
	})

	t.Run("FinishedWorkCommitsAfterCancel", func(t *testing.T) {
		t.Parallel()
		r := newBatchRun(t, e, middleware.InboxConfig{})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		h := r.wrap(func(ctx context.Context, msgs []*ackwise.Message) error {
			err := e.Apply(ctx, msgs)
			cancel() // the engine's drain deadline passes as the handler finishes
			return err
		})
		if err := h.HandleBatch(ctx, r.batch("a", "b")); err != nil {
			t.Fatalf("the handler returned nil but the batch failed with %v once ctx ended; want its work committed", err)
		}
		r.effects(t, map[string]int{"a": 1, "b": 1})
		r.handled(t, map[string]bool{"a": true, "b": true})
	})

	t.Run("ConcurrentBatchesOverlap", func(t *testing.T) {
		t.Parallel()
		r := newBatchRun(t, e, middleware.InboxConfig{})
		h := r.wrap(e.Apply)
		const rounds, keys = 5, 20
		// A deadlock between the two would end here, with the context's
		// error, instead of hanging the test binary.
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		var all []string
		for round := range rounds {
			names := make([]string, keys)
			for k := range names {
				names[k] = fmt.Sprintf("r%d-k%02d", round, k)
			}
			all = append(all, names...)
			reversed := slices.Clone(names)
			slices.Reverse(reversed)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for _, order := range [][]string{names, reversed} {
				wg.Go(func() {
					<-start
					if err := h.HandleBatch(ctx, r.batch(order...)); err != nil {
						t.Errorf("round %d: %v", round, err)
					}
				})
			}
			close(start)
			wg.Wait()
		}
		want := map[string]int{}
		for _, n := range all {
			want[n] = 1
		}
		r.effects(t, want)
	})
}

// batchRun is one subtest's inbox: its store, consumer name and event ID
// prefix.
type batchRun struct {
	t      *testing.T
	e      Batch
	store  middleware.BatchInboxStore
	cfg    middleware.InboxConfig
	prefix string
	dups   atomic.Int32
}

func newBatchRun(t *testing.T, e Batch, cfg middleware.InboxConfig) *batchRun {
	r := &batchRun{t: t, e: e, store: e.NewStore(t), prefix: unique(t) + "/"}
	cfg.Consumer = unique(t)
	cfg.OnDuplicate = func(context.Context, *ackwise.Message) { r.dups.Add(1) }
	r.cfg = cfg
	return r
}

func (r *batchRun) wrap(h ackwise.BatchHandlerFunc) ackwise.BatchHandler {
	r.t.Helper()
	mw, err := middleware.BatchInbox(r.store, r.cfg)
	if err != nil {
		r.t.Fatalf("BatchInbox: %v", err)
	}
	return mw(h)
}

// batch returns a batch of one new message per name, event ID prefix+name.
func (r *batchRun) batch(names ...string) []*ackwise.Message {
	msgs := make([]*ackwise.Message, len(names))
	for i, n := range names {
		msgs[i] = msgFor(r.prefix + n)
	}
	return msgs
}

func (r *batchRun) name(m *ackwise.Message) string { return m.ID[len(r.prefix):] }

func (r *batchRun) names(msgs []*ackwise.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = r.name(m)
	}
	slices.Sort(out)
	return out
}

// want runs msgs through h (what names the call) and wants one outcome per
// message: errors.Is(outcome, want[i]), nil for nil.
func (r *batchRun) want(t *testing.T, what string, h ackwise.BatchHandler, msgs []*ackwise.Message, want ...error) {
	t.Helper()
	err := h.HandleBatch(t.Context(), msgs)
	got := make([]error, len(msgs))
	ackwise.BatchOutcomes(err, got)
	for i := range msgs {
		if (want[i] == nil) != (got[i] == nil) || !errors.Is(got[i], want[i]) {
			t.Fatalf("%s: %s's outcome is %v, want %v (batch error: %v)", what, r.name(msgs[i]), got[i], want[i], err)
		}
	}
}

func (r *batchRun) effects(t *testing.T, want map[string]int) {
	t.Helper()
	for name, n := range want {
		if got := r.e.Effects(t, r.prefix+name); got != n {
			t.Fatalf("%s has %d committed effects, want %d", name, got, n)
		}
	}
}

func (r *batchRun) handled(t *testing.T, want map[string]bool) {
	t.Helper()
	for name, w := range want {
		ok, err := r.e.Handled(t.Context(), middleware.InboxKey{Consumer: r.cfg.Consumer, EventID: r.prefix + name})
		if err != nil || ok != w {
			t.Fatalf("Handled(%s) = %v, %v; want %v", name, ok, err, w)
		}
	}
}

// memEffects keeps effects in memory; memTxStore makes them commit or roll
// back with the claim, as a database transaction would.
type memEffects struct {
	mu        sync.Mutex
	committed map[string]int
}

type memTxKey struct{}

type memTx struct {
	mu      sync.Mutex
	pending map[string]int
}

func (m *memEffects) apply(ctx context.Context, msgs []*ackwise.Message) error {
	tx, _ := ctx.Value(memTxKey{}).(*memTx)
	if tx == nil {
		return errors.New("no claim in the handler's context")
	}
	tx.mu.Lock()
	defer tx.mu.Unlock()
	for _, msg := range msgs {
		tx.pending[msg.ID]++
	}
	return nil
}

func (m *memEffects) effects(_ testing.TB, id string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.committed[id]
}

func (m *memEffects) pending(ctx context.Context, id string) (int, error) {
	tx, _ := ctx.Value(memTxKey{}).(*memTx)
	if tx == nil {
		return 0, errors.New("no claim in the handler's context")
	}
	tx.mu.Lock()
	n := tx.pending[id]
	tx.mu.Unlock()
	return n + m.effects(nil, id), nil
}

type memTxStore struct {
	middleware.BatchInboxStore
	mem *memEffects
}

func (s memTxStore) ClaimEvents(ctx context.Context, keys []middleware.InboxKey, claimed []bool) (middleware.Claim, error) {
	c, err := s.BatchInboxStore.ClaimEvents(ctx, keys, claimed)
	if err != nil {
		return nil, err
	}
	return &memTxClaim{Claim: c, mem: s.mem, tx: &memTx{pending: map[string]int{}}}, nil
}

type memTxClaim struct {
	middleware.Claim
	mem *memEffects
	tx  *memTx
}

func (c *memTxClaim) Context(ctx context.Context) context.Context {
	return context.WithValue(c.Claim.Context(ctx), memTxKey{}, c.tx)
}

func (c *memTxClaim) Commit(ctx context.Context) error {
	if err := c.Claim.Commit(ctx); err != nil {
		return err
	}
	c.mem.mu.Lock()
	defer c.mem.mu.Unlock()
	c.tx.mu.Lock()
	defer c.tx.mu.Unlock()
	for id, n := range c.tx.pending {
		c.mem.committed[id] += n
	}
	return nil
}

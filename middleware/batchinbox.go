package middleware

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/ackwise/ackwise"
)

// BatchInboxStore is implemented by stores that claim many events at once,
// for [BatchInbox]: pginbox and sqliteinbox (transactional with the
// handler's effects), and meminbox (for tests).
type BatchInboxStore interface {
	InboxStore
	// ClaimEvents opens one Claim on every key of keys (distinct; sorted by
	// the caller so that two claims lock in one order and cannot deadlock):
	// one transaction, in one round trip where the store can. claimed[i]
	// (len(claimed) == len(keys)) is set false when keys[i] was handled
	// already (committed record), true when it is claimed by this Claim. A
	// key another claim holds is waited for, as ClaimEvent does.
	//
	// On a nil error the Claim is never nil, even when no key was claimed or
	// keys is empty (a transaction without records, for messages that have
	// no key): the caller ends it with exactly one of Commit and Rollback.
	// On an error no key is claimed and nothing is left open.
	ClaimEvents(ctx context.Context, keys []InboxKey, claimed []bool) (Claim, error)
}

// BatchInbox is [Inbox] for batch handlers ([ackwise.BatchHandler]): each
// event of a batch has the handler's effect applied once, however often the
// broker delivers it, and the whole batch's records and effects commit in
// one transaction.
//
// For each call it keys every message as Inbox does ([InboxConfig].KeyFunc;
// a KeyFunc error fails that message, marked permanent unless classified;
// an empty ID fails it with [ErrNoEventID], marked permanent, unless
// AllowMissingKey, which runs it in the batch, in the same transaction,
// without deduplication). It
// claims the distinct keys, sorted, in one [BatchInboxStore.ClaimEvents]
// call, and acknowledges (nil) the messages whose event is already handled
// without passing them on (OnDuplicate, the Debug record and the duplicate
// metric, once per message). It runs the rest as one batch, with the claim's
// transaction in the context, and:
//
//   - every message succeeded: it commits records and effects together;
//     a commit error fails every message of the batch with it (the outcome
//     may be unknown: the redelivery finds the records if the commit
//     happened);
//   - some failed: it rolls the transaction back (the successful messages'
//     effects, written in it, are gone too) and runs the batch again
//     without the failed messages, in a new claim, until a round has no
//     failure or no message is left. Each round drops at least one message,
//     so a batch of n takes at most n rounds. A failed message's outcome is
//     its error in the round it failed;
//   - the handler panicked: it rolls back and re-panics.
//
// Several messages of one batch with the same event ID (a redelivery that
// caught up with the first delivery) are run once: the later copies get
// the first copy's outcome (nil: acknowledged as duplicates; an error: they
// are retried with it).
//
// So a handler may see a message more than once per delivery (once per
// round until the round commits), and must write its effects through the
// transaction in its context (pginbox.Tx, sqliteinbox.Tx), never commit or
// roll it back, and not keep state across calls that a rolled-back round
// would leave behind. Effects outside that transaction (an HTTP call) are
// not covered, and a failed round repeats them: pass
// [IdempotencyKey](msg, consumer, step) to such APIs.
// [InboxIdempotencyKey] does not apply (its key is per message, in a
// context that is per batch); with a custom KeyFunc, derive the API's key
// from the ID KeyFunc returns.
//
// The store must roll back the handler's effects with the records (pginbox,
// sqliteinbox): the re-run after a partial failure relies on it. meminbox
// implements BatchInboxStore for tests, with no effects to roll back.
// redisinbox does not implement it: it is not transactional with the
// effects, so the successful messages of a failed round would keep their
// effects and apply them again in the next round.
//
// A ClaimEvents error fails every message still to run with it, except a
// permanent one (an event ID the store cannot record fails its single
// statement for the whole batch): each key is then claimed on its own, and
// rolled back, to find the keys that fail; their messages fail permanently
// and the others run.
//
// Cost: one ClaimEvents and one commit per batch (pginbox: BEGIN, one
// INSERT for every key, COMMIT), plus a rollback and a new claim per round
// after a failure. The claim holds its records' locks (and pginbox's
// connection) until the batch commits: a concurrent claimer of one of its
// events waits for the whole batch.
//
// The commit (or rollback) runs even when ctx was cancelled after the
// handler returned (bounded by 10s). It returns nil when every message
// succeeded, else a [*ackwise.BatchError] with one entry per message of
// msgs, which it never changes. It returns an error, naming the field, for
// a nil store or an empty Consumer. The middleware is safe for concurrent
// use.
func BatchInbox(store BatchInboxStore, cfg InboxConfig) (ackwise.BatchMiddleware, error) {
	if store == nil {
		return nil, errors.New("middleware: BatchInbox store is nil")
	}
	if err := needStoreAndConsumer("Inbox", false, cfg.Consumer); err != nil { // the field is InboxConfig's
		return nil, err
	}
	bi := &batchInbox{store: store, cfg: cfg, keyFunc: cfg.KeyFunc, logger: orDiscard(cfg.Logger)}
	if bi.keyFunc == nil {
		bi.keyFunc = func(msg *ackwise.Message) (string, error) { return msg.EventID(), nil }
	}
	var err error
	if bi.dups, err = newDuplicateCounter(cfg.MeterProvider, cfg.Consumer); err != nil {
		return nil, err
	}
	return func(next ackwise.BatchHandler) ackwise.BatchHandler {
		return ackwise.BatchHandlerFunc(func(ctx context.Context, msgs []*ackwise.Message) error {
			return bi.handle(ctx, next, msgs)
		})
	}, nil
}

type batchInbox struct {
	store   BatchInboxStore
	cfg     InboxConfig
	keyFunc func(*ackwise.Message) (string, error)
	logger  *slog.Logger
	dups    duplicateCounter
}

// batchEntry is one message to run: msgs[msg], claiming key unless keyless.
type batchEntry struct {
	msg     int
	key     InboxKey
	keyless bool
}

// batchCall is the state of one HandleBatch call.
type batchCall struct {
	msgs   []*ackwise.Message
	errs   []error // the outcome of each message of msgs
	copyOf []int   // the index of the first message with the same event ID, or -1
	ids    []string
	live   []batchEntry
	// Reused across rounds.
	keys    []InboxKey
	claimed []bool
	run     []*ackwise.Message
	runIdx  []int
	outs    []error
}

func (bi *batchInbox) handle(ctx context.Context, next ackwise.BatchHandler, msgs []*ackwise.Message) error {
	n := len(msgs)
	bc := &batchCall{msgs: msgs, errs: make([]error, n), copyOf: make([]int, n), ids: make([]string, n), live: make([]batchEntry, 0, n)}
	first := make(map[string]int, n)
	for i, msg := range msgs {
		bc.copyOf[i] = -1
		id, err := bi.keyFunc(msg)
		bc.ids[i] = id
		switch {
		case err != nil:
			bc.errs[i] = markPermanent("inbox key", err)
		case id == "" && bi.cfg.AllowMissingKey:
			bc.live = append(bc.live, batchEntry{msg: i, keyless: true})
		case id == "":
			bc.errs[i] = ackwise.Permanent(ErrNoEventID)
		default:
			if j, ok := first[id]; ok {
				bc.copyOf[i] = j
				continue
			}
			first[id] = i
			bc.live = append(bc.live, batchEntry{msg: i, key: InboxKey{Consumer: bi.cfg.Consumer, EventID: id}})
		}
	}
	// Sorted keys make concurrent batches lock their records in one order.
	slices.SortFunc(bc.live, func(a, b batchEntry) int {
		if c := cmp.Compare(a.key.Consumer, b.key.Consumer); c != 0 {
			return c
		}
		return cmp.Compare(a.key.EventID, b.key.EventID)
	})
	for len(bc.live) > 0 {
		if !bi.round(ctx, next, bc) {
			break
		}
	}
	be := ackwise.NewBatchError(n)
	for i := range msgs {
		err := bc.errs[i]
		if j := bc.copyOf[i]; j >= 0 {
			if err = bc.errs[j]; err == nil {
				bi.duplicate(ctx, msgs[i], bc.ids[i])
			}
		}
		be.Set(i, err)
	}
	return be.Err()
}

// duplicate reports msg, acknowledged without running the handler.
func (bi *batchInbox) duplicate(ctx context.Context, msg *ackwise.Message, id string) {
	bi.logger.LogAttrs(ctx, slog.LevelDebug, "duplicate event acknowledged without handling",
		slog.String(ackwise.LogKeyEventID, id), slog.String(ackwise.LogKeySource, msg.Source))
	if bi.cfg.OnDuplicate != nil {
		bi.cfg.OnDuplicate(ctx, msg)
	}
	bi.dups.add(ctx, msg.Source)
}

// round claims the live entries' keys and runs the claimed ones. It drops
// from bc.live every entry whose outcome it settled and returns whether
// another round is needed (some failed, others remain).
func (bi *batchInbox) round(ctx context.Context, next ackwise.BatchHandler, bc *batchCall) bool {
	bc.keys = bc.keys[:0]
	for _, e := range bc.live {
		if !e.keyless {
			bc.keys = append(bc.keys, e.key)
		}
	}
	bc.claimed = slices.Grow(bc.claimed[:0], len(bc.keys))[:len(bc.keys)]
	clear(bc.claimed)
	c, err := bi.store.ClaimEvents(ctx, bc.keys, bc.claimed)
	if err != nil {
		if len(bc.live) > 1 && ackwise.ClassOf(err) == ackwise.ClassPermanent && bi.isolate(ctx, bc) {
			return true
		}
		err = fmt.Errorf("middleware: batch inbox claim: %w", err)
		for _, e := range bc.live {
			bc.errs[e.msg] = err
		}
		bc.live = bc.live[:0]
		return false
	}
	// Drop the duplicates; collect the batch to run.
	bc.run, bc.runIdx = bc.run[:0], bc.runIdx[:0]
	kept, k := bc.live[:0], 0
	for _, e := range bc.live {
		if !e.keyless {
			claimed := bc.claimed[k]
			k++
			if !claimed {
				bi.duplicate(ctx, bc.msgs[e.msg], e.key.EventID)
				continue
			}
		}
		kept = append(kept, e)
		bc.run = append(bc.run, bc.msgs[e.msg])
		bc.runIdx = append(bc.runIdx, e.msg)
	}
	bc.live = kept
	if len(bc.run) == 0 {
		bi.end(ctx, c, false)
		return false
	}
	bc.outs = slices.Grow(bc.outs[:0], len(bc.run))[:len(bc.run)]
	ackwise.BatchOutcomes(bi.runClaim(ctx, c, next, bc.run), bc.outs)
	failed := false
	for _, err := range bc.outs {
		if err != nil {
			failed = true
			break
		}
	}
	if !failed {
		if err := bi.end(ctx, c, true); err != nil {
			err = fmt.Errorf("middleware: batch inbox commit: %w", err)
			for _, i := range bc.runIdx {
				bc.errs[i] = err
			}
		}
		bc.live = bc.live[:0]
		return false
	}
	bi.end(ctx, c, false)
	kept = bc.live[:0]
	for j, e := range bc.live {
		if err := bc.outs[j]; err != nil {
			bc.errs[e.msg] = err
			continue
		}
		kept = append(kept, e)
	}
	bc.live = kept
	return len(bc.live) > 0
}

// runClaim runs next with batch inside claim c; on a panic it rolls c
// back and re-panics.
func (bi *batchInbox) runClaim(ctx context.Context, c Claim, next ackwise.BatchHandler, batch []*ackwise.Message) error {
	done := false
	defer func() {
		if !done {
			bi.end(ctx, c, false)
		}
	}()
	err := next.HandleBatch(c.Context(ctx), batch)
	done = true
	return err
}

// end commits (commit true) or rolls back c, even when ctx has ended: a
// finished batch's work is kept, and a failed one's discarded. It returns
// the commit's error; a rollback's is logged.
func (bi *batchInbox) end(ctx context.Context, c Claim, commit bool) error {
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	if commit {
		return c.Commit(ectx)
	}
	if err := c.Rollback(ectx); err != nil {
		bi.logger.LogAttrs(ctx, slog.LevelWarn, "batch inbox rollback failed", slog.String(ackwise.LogKeyError, err.Error()))
	}
	return nil
}

// isolate claims each live key on its own after a permanent error of the
// claim of them all, to find the keys the store cannot record: their
// messages fail with the error, the others stay live. It reports whether it
// found one (else the caller fails them all).
func (bi *batchInbox) isolate(ctx context.Context, bc *batchCall) bool {
	found := false
	kept := bc.live[:0]
	var one [1]bool
	for _, e := range bc.live {
		if !e.keyless {
			c, err := bi.store.ClaimEvents(ctx, []InboxKey{e.key}, one[:])
			if err == nil {
				bi.end(ctx, c, false)
			} else if ackwise.ClassOf(err) == ackwise.ClassPermanent {
				bc.errs[e.msg] = fmt.Errorf("middleware: batch inbox claim of event %q: %w", e.key.EventID, err)
				found = true
				continue
			}
		}
		kept = append(kept, e)
	}
	bc.live = kept
	return found
}

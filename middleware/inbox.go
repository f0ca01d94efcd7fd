package middleware

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/ackwise/ackwise"
)

// ErrNoEventID is returned, marked permanent, by [Inbox] for a message whose
// key function found no event ID: without a stable ID a redelivery cannot be
// told from a new event. See [InboxConfig].AllowMissingKey.
var ErrNoEventID = errors.New("middleware: message has no event ID")

// InboxKey identifies one event for one consumer: the same event handled by
// two consumers (two consumer groups, two services) is two inbox records.
type InboxKey struct {
	// Consumer is the consumer's stable name (InboxConfig.Consumer).
	Consumer string
	// EventID is the producer's stable event ID.
	EventID string
}

// Claim is the unit of work a store opens for one message: a pending record
// (an inbox key or an aggregate version) and, for transactional stores, the
// database transaction the handler writes its effects through. Exactly one of
// Commit and Rollback is called, once, by the middleware that opened it.
type Claim interface {
	// Context returns ctx carrying the claim's transaction, so that the
	// handler finds it with the store package's Tx helper. Stores without a
	// transaction return ctx.
	Context(ctx context.Context) context.Context
	// Commit makes the record durable together with every effect written
	// through the claim's transaction: both or neither. A Commit error means
	// the outcome may be unknown (the connection died during COMMIT); the
	// message is then retried, and the redelivery finds the record if the
	// commit did happen.
	Commit(ctx context.Context) error
	// Rollback discards the record and the transaction's effects.
	Rollback(ctx context.Context) error
}

// InboxStore records which events a consumer has handled.
//
// ClaimEvent opens a [Claim] on key. It returns claimed=false (and a nil
// Claim) when a committed record for key exists: the event was handled and
// the handler must not run again. While another claim on key is pending, a
// transactional store blocks until that claim ends (and then answers from its
// outcome), so two consumers racing on one event apply it once; a store that
// cannot wait returns an error, typically marked [ackwise.RetryAfter].
//
// Implementations must be safe for concurrent use. Stores live in
// subpackages: pginbox (PostgreSQL), sqliteinbox (SQLite), redisinbox (Redis,
// not transactional with the effect) and meminbox (memory, for tests).
type InboxStore interface {
	ClaimEvent(ctx context.Context, key InboxKey) (c Claim, claimed bool, err error)
}

// InboxConfig configures [Inbox].
type InboxConfig struct {
	// Consumer is the stable name of the consuming application (its
	// consumer group), the first half of every inbox key. Required. Renaming
	// a consumer forgets what it has handled.
	Consumer string
	// KeyFunc returns the event ID of a message. Nil means [ackwise.Message.EventID]: the
	// message's ID, from the ackwise-event-id header. It must be stable across
	// redeliveries and unique per event; a hash of the payload is neither (two
	// identical top-ups are two events), which is why it is not the default.
	// An error it returns is passed on with its class, or marked permanent
	// when it has none.
	KeyFunc func(msg *ackwise.Message) (string, error)
	// AllowMissingKey runs the handler without deduplication when KeyFunc
	// returns an empty ID. Default false: such a message fails with
	// [ErrNoEventID], marked permanent.
	AllowMissingKey bool
	// OnDuplicate, when set, is called for each message acknowledged without
	// running the handler because its event was already handled (for a
	// metric of one's own). It must be fast and safe for concurrent use.
	OnDuplicate func(ctx context.Context, msg *ackwise.Message)
	// MeterProvider, when set, counts the duplicates absorbed in
	// ackwise.consumer.inbox.duplicates (MetricInboxDuplicates), meter scope
	// MeterName. Nil: no metric.
	MeterProvider metric.MeterProvider
	// Logger receives a Debug record per duplicate and a Warn record when a
	// rollback fails. Nil discards.
	Logger *slog.Logger
}

// Inbox returns the idempotency middleware: each event (InboxKey: consumer
// and event ID) has its handler's effect applied once, however often the
// broker delivers it.
//
// For each message it claims the key in store, runs the handler with the
// claim's transaction in its context, and commits the record only if the
// handler returned nil; with a transactional store (pginbox, sqliteinbox) the
// record commits in the same transaction as the handler's effect, so effect
// and record commit together or not at all. A handler that fails (or panics)
// leaves no record, so its retry runs the handler again. A message whose
// event is already recorded is acknowledged (nil) without running the
// handler. Unlike a deduplicator that records the key before the handler
// runs, a failed attempt never makes a retry look like a duplicate.
//
// The handler must write its effects through the transaction in its context
// (pginbox.Tx, sqliteinbox.Tx) and must not commit or roll it back. Effects
// outside that transaction (an HTTP call, an e-mail) are not covered: pass
// [IdempotencyKey] to such APIs.
//
// The commit (or rollback) runs even when ctx was cancelled after the
// handler returned (bounded by 10s): a finished handler's effect is kept, and
// its redelivery is then acknowledged as a duplicate.
//
// Inbox returns an error, naming the field, for a nil store or an empty
// Consumer. The middleware is safe for concurrent use.
func Inbox(store InboxStore, cfg InboxConfig) (ackwise.Middleware, error) {
	if err := needStoreAndConsumer("Inbox", store == nil, cfg.Consumer); err != nil {
		return nil, err
	}
	keyFunc := cfg.KeyFunc
	if keyFunc == nil {
		keyFunc = func(msg *ackwise.Message) (string, error) { return msg.EventID(), nil }
	}
	logger := orDiscard(cfg.Logger)
	dups, err := newDuplicateCounter(cfg.MeterProvider, cfg.Consumer)
	if err != nil {
		return nil, err
	}
	return func(next ackwise.Handler) ackwise.Handler {
		return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
			id, err := keyFunc(msg)
			if err != nil {
				return markPermanent("inbox key", err)
			}
			if id == "" {
				if cfg.AllowMissingKey {
					return next.Handle(ctx, msg)
				}
				return ackwise.Permanent(ErrNoEventID)
			}
			key := InboxKey{Consumer: cfg.Consumer, EventID: id}
			c, claimed, err := store.ClaimEvent(ctx, key)
			if err != nil {
				return fmt.Errorf("middleware: inbox claim of event %q: %w", id, err)
			}
			if !claimed {
				logger.LogAttrs(ctx, slog.LevelDebug, "duplicate event acknowledged without handling",
					slog.String(ackwise.LogKeyEventID, id), slog.String(ackwise.LogKeySource, msg.Source))
				if cfg.OnDuplicate != nil {
					cfg.OnDuplicate(ctx, msg)
				}
				dups.add(ctx, msg.Source)
				return nil
			}
			// For InboxIdempotencyKey: the ID KeyFunc gave, which the
			// handler cannot derive from msg alone.
			return runClaimed(context.WithValue(ctx, inboxKeyCtx{}, key), c, next, msg, logger, "inbox")
		})
	}, nil
}

// endTimeout bounds a commit or rollback, which runs even when the handler's
// context has ended.
const endTimeout = 10 * time.Second

// runClaimed runs next inside claim c: commit on nil, rollback on error or
// panic (the panic is re-raised after the rollback).
func runClaimed(ctx context.Context, c Claim, next ackwise.Handler, msg *ackwise.Message, logger *slog.Logger, what string) (err error) {
	done := false
	defer func() {
		if done {
			return
		}
		// The handler failed or panicked: discard the record and the effect.
		// The handler's ctx may be cancelled already; the rollback must run.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
		defer cancel()
		if rerr := c.Rollback(rctx); rerr != nil {
			logger.LogAttrs(ctx, slog.LevelWarn, what+" rollback failed",
				slog.String(ackwise.LogKeyEventID, msg.EventID()), slog.String(ackwise.LogKeyError, rerr.Error()))
		}
	}()
	if err := next.Handle(c.Context(ctx), msg); err != nil {
		return err
	}
	done = true
	// The handler's work is done: commit it even if ctx was cancelled
	// meanwhile (a shutdown), so that a redelivery finds the record.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	if err := c.Commit(cctx); err != nil {
		return fmt.Errorf("middleware: %s commit: %w", what, err)
	}
	return nil
}

// markPermanent wraps err, the error of the user's function named what,
// and marks it permanent unless it already carries a class.
func markPermanent(what string, err error) error {
	err = fmt.Errorf("middleware: %s: %w", what, err)
	if ackwise.ClassOf(err) != ackwise.ClassTransient {
		return err
	}
	return ackwise.Permanent(err)
}

// needStoreAndConsumer checks what the middleware name (Inbox,
// VersionGate) needs whatever its config: a store and a consumer name.
func needStoreAndConsumer(name string, noStore bool, consumer string) error {
	if noStore {
		return fmt.Errorf("middleware: %s store is nil", name)
	}
	if consumer == "" {
		return fmt.Errorf(`middleware: %sConfig.Consumer is "" (a stable consumer name is required)`, name)
	}
	return nil
}

// orDiscard returns l, or a logger that discards for a nil l.
func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return discardLogger
	}
	return l
}

var discardLogger = slog.New(slog.DiscardHandler)

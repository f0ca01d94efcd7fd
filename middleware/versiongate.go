package middleware

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/ackwise/ackwise"
)

// VersionKey identifies one aggregate for one consumer in a [VersionStore].
type VersionKey struct {
	// Consumer is the consumer's stable name (VersionGateConfig.Consumer).
	Consumer string
	// Aggregate is the ID of the entity the events describe.
	Aggregate string
}

// VersionStore records the last aggregate version a consumer applied.
//
// ClaimVersion opens a [Claim] that, on Commit, records version as the last
// one applied for key. It returns newer=false (and a nil Claim) when the
// recorded version is already version or later: the event is stale. While
// another claim on key is pending, a transactional store blocks until it ends,
// so concurrent events of one aggregate are applied newest-wins, never
// older-over-newer. Implementations must be safe for concurrent use; pginbox,
// sqliteinbox and meminbox provide them.
type VersionStore interface {
	ClaimVersion(ctx context.Context, key VersionKey, version int64) (c Claim, newer bool, err error)
}

// VersionGateConfig configures [VersionGate].
type VersionGateConfig struct {
	// Consumer is the stable name of the consuming application. Required.
	Consumer string
	// AggregateFunc returns the aggregate ID of a message. Nil means the
	// message's Key. An empty ID or an error without a class fails the
	// message as permanent.
	AggregateFunc func(msg *ackwise.Message) (string, error)
	// VersionFunc returns the aggregate version a message carries. Nil means
	// the ackwise-aggregate-version header, a base-10 int64. A missing or
	// malformed version fails the message as permanent (wrapping ErrInvalid).
	VersionFunc func(msg *ackwise.Message) (int64, error)
	// OnStale, when set, is called for each message acknowledged without
	// running the handler because a version at least as new was applied. It
	// must be fast and safe for concurrent use.
	OnStale func(ctx context.Context, msg *ackwise.Message, version int64)
	// Logger receives a Debug record per stale event and a Warn record when a
	// rollback fails. Nil discards.
	Logger *slog.Logger
}

// VersionGate returns middleware that applies an event only if its aggregate
// version is newer than the last one applied for that aggregate; an older or
// equal version is acknowledged (nil) without running the handler. The new
// version is recorded in the same transaction as the handler's effect
// (transactional stores), and not at all when the handler fails.
//
// The gate is for full-state events ("the account now looks like this"),
// where skipping an older state is right because a newer one already
// replaced it. It is wrong for delta events ("add 10 to the balance"): a
// skipped delta is a lost change. For deltas, hold the gap instead: apply
// version n only after n-1 (return an error, so the message is retried, when
// it arrives early) — the inbox then makes each delta apply once.
//
// The gate also absorbs redeliveries of the same version. VersionGate returns
// an error, naming the field, for a nil store or an empty Consumer. The
// middleware is safe for concurrent use.
func VersionGate(store VersionStore, cfg VersionGateConfig) (ackwise.Middleware, error) {
	if store == nil {
		return nil, errors.New("middleware: VersionGate store is nil")
	}
	if cfg.Consumer == "" {
		return nil, errors.New(`middleware: VersionGateConfig.Consumer is "" (a stable consumer name is required)`)
	}
	aggFunc := cfg.AggregateFunc
	if aggFunc == nil {
		aggFunc = func(msg *ackwise.Message) (string, error) { return msg.Key, nil }
	}
	verFunc := cfg.VersionFunc
	if verFunc == nil {
		verFunc = AggregateVersion
	}
	logger := cfg.Logger
	if logger == nil {
		logger = discardLogger
	}
	return func(next ackwise.Handler) ackwise.Handler {
		return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
			agg, err := aggFunc(msg)
			if err != nil {
				return markPermanent(fmt.Errorf("middleware: version gate aggregate: %w", err))
			}
			if agg == "" {
				return ackwise.Permanent(fmt.Errorf("%w: version gate: message has no aggregate ID", ErrInvalid))
			}
			ver, err := verFunc(msg)
			if err != nil {
				return markPermanent(fmt.Errorf("middleware: version gate version: %w", err))
			}
			c, newer, err := store.ClaimVersion(ctx, VersionKey{Consumer: cfg.Consumer, Aggregate: agg}, ver)
			if err != nil {
				return fmt.Errorf("middleware: version gate claim of %q v%d: %w", agg, ver, err)
			}
			if !newer {
				logger.LogAttrs(ctx, slog.LevelDebug, "stale event acknowledged without handling",
					slog.String("aggregate", agg), slog.Int64("version", ver), slog.String(LogKeyEventID, EventID(msg)))
				if cfg.OnStale != nil {
					cfg.OnStale(ctx, msg, ver)
				}
				return nil
			}
			return runClaimed(ctx, c, next, msg, logger, "version gate")
		})
	}, nil
}

// AggregateVersion returns the version in msg's ackwise-aggregate-version
// header. A missing or malformed header is an error wrapping [ErrInvalid].
func AggregateVersion(msg *ackwise.Message) (int64, error) {
	s, ok := msg.Headers.Lookup(ackwise.HeaderAggregateVersion)
	if !ok || s == "" {
		return 0, fmt.Errorf("%w: no %s header", ErrInvalid, ackwise.HeaderAggregateVersion)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s header %q: %w", ErrInvalid, ackwise.HeaderAggregateVersion, s, err)
	}
	return v, nil
}

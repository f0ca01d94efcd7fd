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
// recorded version is already version or later: the event is stale. It
// also returns recorded, the version recorded for key as the claim was made
// (0 when none is), which the gate checks version against
// ([VersionGateConfig].MaxVersionGap; it rolls the claim back when version
// is too far ahead). While another claim on key is pending, a transactional
// store blocks until it ends, so concurrent events of one aggregate are
// applied newest-wins, never older-over-newer, and recorded is what that
// claim left. (Two first events of one aggregate racing may both see 0: the
// check is then stricter, never looser.) Implementations must be safe for
// concurrent use; pginbox, sqliteinbox and meminbox provide them.
type VersionStore interface {
	ClaimVersion(ctx context.Context, key VersionKey, version int64) (c Claim, recorded int64, newer bool, err error)
}

// DefaultMaxVersionGap is VersionGateConfig.MaxVersionGap when it is zero:
// 2^62, about 4.6e18. See MaxVersionGap for why it is this large.
const DefaultMaxVersionGap int64 = 1 << 62

// NoVersionGapLimit as VersionGateConfig.MaxVersionGap turns the gap check
// off.
const NoVersionGapLimit int64 = -1

// ErrVersionGap is wrapped (together with [ErrInvalid], marked permanent) by
// the error of a message whose version is more than MaxVersionGap above the
// recorded one.
var ErrVersionGap = errors.New("middleware: aggregate version jumps too far ahead")

// VersionGateConfig configures [VersionGate].
type VersionGateConfig struct {
	// Consumer is the stable name of the consuming application. Required.
	Consumer string
	// AggregateFunc returns the aggregate ID of a message. Nil means the
	// message's Key. An empty ID or an error without a class fails the
	// message as permanent.
	AggregateFunc func(msg *ackwise.Message) (string, error)
	// VersionFunc returns the aggregate version a message carries. Nil means
	// [AggregateVersion]: the ackwise-aggregate-version header, a base-10
	// int64. A missing or malformed version fails the message as permanent
	// (wrapping ErrInvalid), and so does a version below 1, whatever
	// VersionFunc returned it: versions start at 1.
	VersionFunc func(msg *ackwise.Message) (int64, error)
	// MaxVersionGap bounds how far ahead of the recorded version a message
	// may jump: a version more than MaxVersionGap above the one recorded
	// for its aggregate (above 0 when none is) is not applied and not
	// recorded; the message fails as permanent (dead-lettered) with an
	// error wrapping ErrVersionGap and ErrInvalid that names the version's
	// source, the version, the aggregate and the recorded version.
	//
	// The version is producer input, outside the trust boundary
	// (docs/idempotency.md). Unbounded, one message carrying MaxInt64 makes
	// the gate record MaxInt64 and acknowledge, unrun, every later event of
	// its aggregate, for good.
	//
	// Zero means DefaultMaxVersionGap (2^62, about 4.6e18). The default is
	// that large so that it breaks no version scheme in use, measured from
	// 0 for a new aggregate too: counters (1, 2, 3, …), Unix seconds,
	// milliseconds and microseconds, and Unix nanoseconds (about 1.8e18
	// today) until the year 2116. It refuses only versions no real producer
	// writes, MaxInt64 among them, which would hold an aggregate for good.
	// It does not stop a smaller forgery: with counters, a forged 10^12
	// holds the aggregate as surely as MaxInt64. Where versions are
	// counters, set MaxVersionGap to the largest step your events take
	// (say 1000: a consumer that sees only some event types of an
	// aggregate sees gaps), and strip or verify the header at the edge
	// where producers are not trusted. A tight gap also applies to the first
	// version the gate sees of an aggregate, measured from 0: a consumer
	// started on aggregates with a history needs a gap above their current
	// versions. NoVersionGapLimit (-1) turns the check off; other negative
	// values are invalid.
	MaxVersionGap int64
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
	if err := needStoreAndConsumer("VersionGate", store == nil, cfg.Consumer); err != nil {
		return nil, err
	}
	gap := cfg.MaxVersionGap
	switch {
	case gap == 0:
		gap = DefaultMaxVersionGap
	case gap < 0 && gap != NoVersionGapLimit:
		return nil, fmt.Errorf("middleware: VersionGateConfig.MaxVersionGap = %d: want a positive gap, 0 (default %d) or %d (no limit)", gap, DefaultMaxVersionGap, NoVersionGapLimit)
	}
	// What the version errors name as the version's source.
	verSource := ackwise.HeaderAggregateVersion
	if cfg.VersionFunc != nil {
		verSource = "VersionFunc version"
	}
	aggFunc := cfg.AggregateFunc
	if aggFunc == nil {
		aggFunc = func(msg *ackwise.Message) (string, error) { return msg.Key, nil }
	}
	verFunc := cfg.VersionFunc
	if verFunc == nil {
		verFunc = AggregateVersion
	}
	logger := orDiscard(cfg.Logger)
	return func(next ackwise.Handler) ackwise.Handler {
		return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
			agg, err := aggFunc(msg)
			if err != nil {
				return markPermanent("version gate aggregate", err)
			}
			if agg == "" {
				return ackwise.Permanent(fmt.Errorf("%w: version gate: message has no aggregate ID", ErrInvalid))
			}
			ver, err := verFunc(msg)
			if err != nil {
				return markPermanent("version gate version", err)
			}
			if ver < 1 {
				return ackwise.Permanent(fmt.Errorf("%w: version gate: %s %d of aggregate %q: versions start at 1", ErrInvalid, verSource, ver, agg))
			}
			c, recorded, newer, err := store.ClaimVersion(ctx, VersionKey{Consumer: cfg.Consumer, Aggregate: agg}, ver)
			if err != nil {
				return fmt.Errorf("middleware: version gate claim of %q v%d: %w", agg, ver, err)
			}
			// ver - recorded > gap, written so that it cannot overflow
			// (ver >= 1, gap >= 1).
			if newer && gap != NoVersionGapLimit && recorded < ver-gap {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
				if rerr := c.Rollback(rctx); rerr != nil {
					logger.LogAttrs(ctx, slog.LevelWarn, "version gate rollback failed",
						slog.String(ackwise.LogKeyEventID, msg.EventID()), slog.String(ackwise.LogKeyError, rerr.Error()))
				}
				cancel()
				return ackwise.Permanent(fmt.Errorf("%w: version gate: %s %d of aggregate %q is more than MaxVersionGap %d above the recorded version %d; not applied (%w)",
					ErrVersionGap, verSource, ver, agg, gap, recorded, ErrInvalid))
			}
			if !newer {
				logger.LogAttrs(ctx, slog.LevelDebug, "stale event acknowledged without handling",
					slog.String(ackwise.LogKeyAggregate, agg), slog.Int64(ackwise.LogKeyVersion, ver), slog.String(ackwise.LogKeyEventID, msg.EventID()))
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
// header, a base-10 integer from 1 to MaxInt64. A missing or malformed
// header, or a version below 1, is an error wrapping [ErrInvalid].
func AggregateVersion(msg *ackwise.Message) (int64, error) {
	s, ok := msg.Headers.Lookup(ackwise.HeaderAggregateVersion)
	if !ok || s == "" {
		return 0, fmt.Errorf("%w: no %s header", ErrInvalid, ackwise.HeaderAggregateVersion)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s header %q: %w", ErrInvalid, ackwise.HeaderAggregateVersion, s, err)
	}
	if v < 1 {
		return 0, fmt.Errorf("%w: %s header %d: versions start at 1", ErrInvalid, ackwise.HeaderAggregateVersion, v)
	}
	return v, nil
}

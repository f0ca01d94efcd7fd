package dlq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"time"

	"golang.org/x/time/rate"

	"github.com/ackwise/ackwise"
)

// RedriveSource is the part of adapters.Source that Redrive and Inspect use;
// every adapters.Source satisfies it. (Package adapters imports dlq, so dlq
// names the three methods it needs instead of importing adapters.)
type RedriveSource interface {
	Receive(ctx context.Context, buf []*ackwise.Message) (int, error)
	Ack(ctx context.Context, msg *ackwise.Message) error
	Release(ctx context.Context, msg *ackwise.Message) error
}

// RedriveSink is the part of adapters.Sink that Redrive uses; every
// adapters.Sink satisfies it. Publish must return only once the broker
// confirmed the message.
type RedriveSink interface {
	Publish(ctx context.Context, msgs ...*ackwise.Message) error
}

// Backlogger is implemented by sources that can tell how many messages
// their destination holds: a queue's depth, or on a log the records the
// consumer group has not committed. Redrive asks once, as it starts, and
// then receives no more new messages than that: the dead letters that come
// back while it runs (into a consumer that still fails, whose dead letters
// land behind the ones the run started with) are left for a later run.
// Backlog may count messages another consumer holds; the run then ends
// idle, a little earlier. It is called from Redrive's goroutine. The ackwise
// CLI's dlq stats prints it as the destination's depth; a queue or topic
// that does not exist is an error, never 0.
//
// Backlogger is not a field of adapters.Extensions, which declare the
// engine's optional parts (read once by consumer.New): nothing in the
// engine asks for a backlog, only the dlq tools do, of a source they
// opened, and this package cannot name adapters.Extensions (adapters
// imports dlq). A source declares it with a compile-time assertion next
// to its type (var _ dlq.Backlogger = (*Source)(nil)).
type Backlogger interface {
	Backlog(ctx context.Context) (int, error)
}

// HeaderRedriveCount is the number of times Redrive moved an event back
// from a dead-letter destination. Redrive writes it on each copy it
// publishes (the count the dead letter carried, plus one) and leaves a dead
// letter whose count reached RedriveOptions.MaxRedrives where it is. It is
// one of the message's own headers, not an envelope header
// (ackwise-dlq-*): Apply and Strip keep it, and so does every adapter's
// dead-lettering, which is how the count survives the next failure.
const HeaderRedriveCount = "ackwise-redrive-count"

// RedriveCount returns the count in h's ackwise-redrive-count header: 0
// when there is none, and ok=false when the value is not a base-10 integer
// from 0 to MaxInt (a producer's forgery, a foreign tool's value): Redrive
// counts such a message as past every limit, to be moved only with Force.
// A producer can set the header as it can any other; the most a forged
// count does is make its message need Force.
func RedriveCount(h ackwise.Headers) (n int, ok bool) {
	v, has := h.Lookup(HeaderRedriveCount)
	if !has {
		return 0, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// RedriveHandle is the Message.Handle of the copy Redrive publishes of a
// dead letter. It points at the dead letter as its source delivered it, so
// that a sink of the same broker can keep what a Message cannot hold: the
// RabbitMQ sink keeps the AMQP properties and header value types. A sink
// only reads it (Redrive settles the dead letter), and only during Publish;
// every other sink ignores it.
type RedriveHandle struct {
	DeadLetter *ackwise.Message
}

// Defaults of RedriveOptions and InspectOptions.
const (
	// DefaultRate is RedriveOptions.Rate when it is zero: 10 messages a
	// second, slow enough for a consumer that has just been fixed.
	DefaultRate = 10.0
	// RateUnlimited as RedriveOptions.Rate turns the rate cap off.
	RateUnlimited = -1.0
	// DefaultIdleTimeout is how long Redrive and Inspect wait for the next
	// message before they decide the dead-letter destination is drained.
	DefaultIdleTimeout = 2 * time.Second
	// DefaultMaxHeld bounds the messages a run holds unsettled (skipped,
	// dry-run and inspected messages are released only when the run ends).
	DefaultMaxHeld = 10000
	// DefaultInspectMax is InspectOptions.Max when it is zero.
	DefaultInspectMax = 20
	// DefaultPublishTimeout is RedriveOptions.PublishTimeout when it is
	// zero.
	DefaultPublishTimeout = 30 * time.Second
	// DefaultMaxRedrives is RedriveOptions.MaxRedrives when it is zero: a
	// dead letter is moved back at most 3 times without Force.
	DefaultMaxRedrives = 3
	// MaxMovedIDs bounds the event IDs one run remembers to never move an
	// event twice: 2^20 (about a million), a 64-bit hash each, some 40 MB
	// at most. A run that has moved that many events stops (StopMovedLimit);
	// run again for the rest.
	MaxMovedIDs = 1 << 20
	// releaseTimeout bounds the releases at the end of a run, which run even
	// when the run's context was cancelled.
	releaseTimeout = 10 * time.Second
	// maxBatch bounds one Receive: a batch is leased as a whole, so it is
	// kept to about a second of work at the rate cap.
	maxBatch = 64
)

// StopReason says why a run ended.
type StopReason string

// Stop reasons.
const (
	// StopIdle: no message arrived within IdleTimeout; the dead-letter
	// destination is drained (as far as this consumer can see). The normal
	// end.
	StopIdle StopReason = "idle"
	// StopMax: Max messages were moved (or, in a dry run, would have been),
	// or Inspect received its Max.
	StopMax StopReason = "max"
	// StopHeldLimit: MaxHeld messages are held unsettled; the run stopped so
	// as not to hold more. Run again with a narrower Filter or a larger
	// MaxHeld.
	StopHeldLimit StopReason = "held-limit"
	// StopRepeat: the broker delivered again a message this run holds (its
	// lease ran out) and no new message arrived since the run took it: the
	// run has come round the whole destination. (A held message that comes
	// back while new messages keep arriving is simply held again.)
	StopRepeat StopReason = "repeat"
	// StopBacklog: the run received as many messages as the dead-letter
	// destination held when it started (the source's Backlogger): every
	// message it started with was seen. Dead letters that came back while
	// it ran are left for a later run.
	StopBacklog StopReason = "backlog"
	// StopMovedLimit: the run moved MaxMovedIDs distinct events and
	// remembers no more; run again for the rest.
	StopMovedLimit StopReason = "moved-limit"
	// StopError: a receive, publish or ack failed; the error is returned.
	StopError StopReason = "error"
	// StopCanceled: the context was cancelled or its deadline passed.
	StopCanceled StopReason = "canceled"
)

// Action is what Redrive did with one received message.
type Action string

// Actions, as passed to RedriveOptions.OnMessage.
const (
	// ActionMoved: published to the target, confirmed, then acked at the
	// dead-letter source.
	ActionMoved Action = "moved"
	// ActionWouldMove: a dry run found it matching; it is released.
	ActionWouldMove Action = "would-move"
	// ActionSkipped: Filter did not match; it is released.
	ActionSkipped Action = "skipped"
	// ActionNoEnvelope: it carries no decodable envelope (not a dead letter
	// ackwise wrote, or one a broker moved on its own); it is released.
	ActionNoEnvelope Action = "no-envelope"
	// ActionFailed: its publish or its ack failed; it stays in the
	// dead-letter destination and the run stops.
	ActionFailed Action = "failed"
	// ActionRedriveLimit: it was redriven MaxRedrives times already (its
	// ackwise-redrive-count), or its count is unreadable; it stays in the
	// dead-letter destination (held, then released). Force moves it.
	ActionRedriveLimit Action = "redrive-limit"
	// ActionAlreadyMoved: this run moved its event ID already: it came back
	// (its consumer failed it again) or it is a second dead letter of the
	// event. It stays in the dead-letter destination (held, then released),
	// also with Force.
	ActionAlreadyMoved Action = "already-moved"
	// ActionPayloadCut: it was dead-lettered with its payload cut to fit
	// (PayloadCut); moved back, it would be handled as if whole. It stays
	// in the dead-letter destination (held, then released), also with
	// Force: recover the payload from its producer.
	ActionPayloadCut Action = "payload-cut"
	// ActionTooOld: it was dead-lettered longer ago than MaxAge (its
	// envelope's last failure; one without a failure time counts as too
	// old); it stays in the dead-letter destination (held, then released),
	// also with Force.
	ActionTooOld Action = "too-old"
)

// RedriveOptions configure Redrive. The zero value is valid and means: move
// every dead letter, at DefaultRate, until none arrives for
// DefaultIdleTimeout.
type RedriveOptions struct {
	// Filter, when set, selects the dead letters to move; the others are
	// skipped (held, then released when the run ends). It is called from
	// Redrive's goroutine with the delivery (read-only) and its envelope. nil
	// moves every dead letter.
	Filter func(msg *ackwise.Message, env Envelope) bool
	// Rate caps publishes to the target, in messages per second (a token
	// bucket of one: publishes are spaced evenly, never bursty). Zero means
	// DefaultRate (10/s); RateUnlimited (-1) turns the cap off. Other
	// negative values and NaN are invalid.
	Rate float64
	// Max, when positive, stops the run after Max messages were moved (in a
	// dry run: after Max would have been). Zero means no limit; negative is
	// invalid.
	Max int
	// DryRun receives and decides but moves nothing: every message is held
	// and released when the run ends, and RedriveResult.WouldMove counts the
	// messages a real run would move.
	DryRun bool
	// IdleTimeout ends the run when no message arrives for that long: a
	// drained dead-letter destination is the normal end of a run. Zero means
	// DefaultIdleTimeout (2s); negative is invalid.
	IdleTimeout time.Duration
	// MaxHeld bounds the messages held unsettled until the run ends (skipped,
	// without envelope, or everything in a dry run). They are held rather
	// than released at once because a queue broker (SQS, RabbitMQ, the
	// memory broker) hands a released message straight back, and the run
	// would see it again and again. Reaching MaxHeld ends the run
	// (StopHeldLimit). Zero means DefaultMaxHeld (10000); negative is
	// invalid. A broker's own bound on unacknowledged deliveries (RabbitMQ's
	// prefetch) also bounds it: when it is full, no more messages arrive and
	// the run ends as idle.
	MaxHeld int
	// PublishTimeout bounds each publish to the target, its confirmation
	// included. A sink whose broker is down may wait for it to come back
	// until its context ends (the RabbitMQ and Kafka sinks do); past this
	// timeout the publish fails, the dead letter stays where it was and the
	// run stops with the error (StopError), rather than block for as long
	// as the target is down. Zero means DefaultPublishTimeout (30s);
	// negative is invalid.
	PublishTimeout time.Duration
	// MaxRedrives is how many times a dead letter may be moved back: one
	// whose ackwise-redrive-count (HeaderRedriveCount) reached it, or is
	// unreadable, stays in the dead-letter destination and is reported
	// (ActionRedriveLimit, RedriveResult.RedriveLimited), so that a redrive
	// into a consumer that still fails cannot send the same messages round
	// for ever. Zero means DefaultMaxRedrives (3); negative is invalid.
	MaxRedrives int
	// Force moves the dead letters MaxRedrives would leave; their count
	// still grows. It does not move an event twice in one run.
	Force bool
	// MaxAge, when positive, leaves the dead letters written longer ago
	// than MaxAge (their envelope's LastFailure, else FirstFailure; one
	// with neither counts as too old) where they are and reports them
	// (ActionTooOld, RedriveResult.TooOld): an event that old may be stale
	// for its consumer. Zero means no limit; negative is invalid.
	MaxAge time.Duration
	// OnStart, when set, is called once from Redrive's goroutine before
	// the first receive, with the source's backlog (RedriveResult.Backlog:
	// -1 when the source cannot tell), for a progress display.
	OnStart func(backlog int)
	// OnMessage, when set, is called from Redrive's goroutine after each
	// decision, with the delivery, its envelope (zero for ActionNoEnvelope)
	// and what was done. It must not keep msg.
	OnMessage func(msg *ackwise.Message, env Envelope, action Action)
	// Logger receives a debug line per decision and warnings for failed
	// releases. nil discards.
	Logger *slog.Logger
}

// Validate reports the first invalid field, naming it and its value.
func (o RedriveOptions) Validate() error {
	switch {
	case math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0):
		return fmt.Errorf("dlq: RedriveOptions.Rate = %v: want messages per second (0 means %v/s, %v no cap)", o.Rate, DefaultRate, RateUnlimited)
	case o.Rate < 0 && o.Rate != RateUnlimited:
		return fmt.Errorf("dlq: RedriveOptions.Rate = %v: must not be negative (0 means %v/s, %v no cap)", o.Rate, DefaultRate, RateUnlimited)
	case o.Max < 0:
		return fmt.Errorf("dlq: RedriveOptions.Max = %d: must not be negative (0 means no limit)", o.Max)
	case o.IdleTimeout < 0:
		return fmt.Errorf("dlq: RedriveOptions.IdleTimeout = %v: must not be negative (0 means %v)", o.IdleTimeout, DefaultIdleTimeout)
	case o.MaxHeld < 0:
		return fmt.Errorf("dlq: RedriveOptions.MaxHeld = %d: must not be negative (0 means %d)", o.MaxHeld, DefaultMaxHeld)
	case o.PublishTimeout < 0:
		return fmt.Errorf("dlq: RedriveOptions.PublishTimeout = %v: must not be negative (0 means %v)", o.PublishTimeout, DefaultPublishTimeout)
	case o.MaxRedrives < 0:
		return fmt.Errorf("dlq: RedriveOptions.MaxRedrives = %d: must not be negative (0 means %d)", o.MaxRedrives, DefaultMaxRedrives)
	case o.MaxAge < 0:
		return fmt.Errorf("dlq: RedriveOptions.MaxAge = %v: must not be negative (0 means no limit)", o.MaxAge)
	}
	return nil
}

// RedriveResult counts what a run did.
type RedriveResult struct {
	// Moved counts dead letters published to the target (confirmed) and then
	// acked at the dead-letter source.
	Moved int
	// WouldMove counts, in a dry run, the dead letters a real run would move.
	WouldMove int
	// Skipped counts messages received and released without moving them:
	// Filter did not match, or they carry no envelope (NoEnvelope of them).
	// Dry-run matches are in WouldMove, not here.
	Skipped int
	// NoEnvelope counts the skipped messages without a decodable envelope.
	NoEnvelope int
	// RedriveLimited counts the dead letters left where they were because
	// they were redriven MaxRedrives times already (ActionRedriveLimit);
	// Force moves them. (Not in Skipped.)
	RedriveLimited int
	// AlreadyMoved counts the dead letters left where they were because the
	// run had moved their event ID already (ActionAlreadyMoved). (Not in
	// Skipped.)
	AlreadyMoved int
	// PayloadCut counts the dead letters left where they were because
	// their payload was cut to fit the dead-letter destination
	// (ActionPayloadCut). (Not in Skipped.)
	PayloadCut int
	// TooOld counts the dead letters left where they were because they
	// were written longer ago than MaxAge (ActionTooOld). (Not in Skipped.)
	TooOld int
	// Backlog is what the dead-letter source said it held when the run
	// started (Backlogger), the most new messages the run receives; -1 when
	// the source cannot tell.
	Backlog int
	// Failed counts messages whose publish or ack failed (the run stops at
	// the first, so it is 0 or 1). Such a message stays in the dead-letter
	// destination; after a failed ack it is also in the target, and a later
	// redrive publishes it again, which consumers deduplicating on the event
	// ID absorb.
	Failed int
	// ReleaseFailed counts held messages whose release failed (typically
	// because their lease ran out). Nothing is lost: the broker redelivers
	// them once their lease ends.
	ReleaseFailed int
	// Stop says why the run ended.
	Stop StopReason
	// Elapsed is the run's duration.
	Elapsed time.Duration
}

// Redrive moves dead letters from the dead-letter source from back to the
// sink to, normally the queue or topic their consumer reads, once the cause
// of their failure is fixed.
//
// For each message it receives it decodes the envelope (a message without
// one is skipped), applies Filter, and publishes a copy to to: the payload
// byte-identical, Key and event ID unchanged, the original headers kept, the
// envelope headers removed (Strip), credential headers (SecretHeaders)
// removed, and the engine's hop headers
// ackwise-attempt and ackwise-first-failure removed as well so that the
// redriven message starts again at attempt 1 (else a message that ran out of
// attempts would be dead-lettered again on its first failure). The copy's
// Handle is a RedriveHandle, through which a sink of the dead letter's own
// broker may keep what a Message cannot hold (the RabbitMQ sink: AMQP
// properties, header value types). Only once the publish is confirmed is
// the dead letter acked (move before ack, invariant 3): a dead letter is
// never lost. A failed publish leaves the dead letter where it was
// (released) and ends the run with the error; a failed ack after a
// confirmed publish leaves the message in both places and ends the run
// with the error.
//
// Redrive is safe only into consumers that deduplicate on the event ID (the
// idempotency inbox): a crash or a failed ack between publish and ack, or a
// redrive of a log without committing, publishes a message again, with the
// same event ID.
//
// Messages not moved (skipped, without envelope, at the redrive limit,
// older than MaxAge, of an event the run moved already, all of them in a
// dry run) are held
// unsettled and released when the run ends, also when ctx is
// cancelled (within a bounded time). On a log (Kafka) a released record's
// offset is not committed, so a later run with the same consumer group reads
// again from the first skipped record, including records moved after it;
// their second publish is absorbed by the consumers' deduplication.
//
// A held message whose lease runs out (SQS's visibility timeout, the memory
// broker's lease) is delivered again; Redrive then holds the new delivery in
// place of the old one and does not count it again. Each batch is received
// only when the rate cap is about to allow it, and holds about a second of
// publishes; at a Rate below one a second, keep 1/Rate well below the
// broker's lease, or a message's lease may run out before its publish (its
// ack then fails and the run stops: a duplicate, never a loss).
//
// Redrive never sends the same messages round for ever, also into a
// consumer that still fails them (whose dead letters come back into the
// destination the run reads). The copy carries ackwise-redrive-count, one
// more than the dead letter's (HeaderRedriveCount); a dead letter whose
// count reached MaxRedrives (default 3) is left where it is and reported,
// unless Force. One run moves an event ID at most once: a dead letter of an
// event it moved already is left (it remembers up to MaxMovedIDs event IDs;
// dead letters without an event ID are bounded by their count alone). And
// where the source can tell how many messages it held when the run started
// (Backlogger), the run receives no more new messages than that.
//
// The run ends when no message arrives within IdleTimeout (the normal end),
// when it received the source's backlog (StopBacklog), when Max messages
// were moved, when MaxHeld messages are held, when it remembers
// MaxMovedIDs event IDs (StopMovedLimit), when a held message comes back
// with no new message received since it was taken (StopRepeat), on the
// first error, or when ctx is done (the result then says StopCanceled and
// ctx's error is returned). Redrive uses from and to from one goroutine; it
// does not close them.
func Redrive(ctx context.Context, from RedriveSource, to RedriveSink, opts RedriveOptions) (RedriveResult, error) {
	if err := opts.Validate(); err != nil {
		return RedriveResult{}, err
	}
	if from == nil {
		return RedriveResult{}, errors.New("dlq: Redrive: from is nil")
	}
	if to == nil && !opts.DryRun {
		return RedriveResult{}, errors.New("dlq: Redrive: to is nil (allowed only with DryRun)")
	}
	r := &run{
		from:    from,
		idle:    opts.IdleTimeout,
		maxHeld: opts.MaxHeld,
		log:     opts.Logger,
	}
	r.defaults()
	var lim *rate.Limiter
	switch {
	case opts.Rate == 0:
		lim = rate.NewLimiter(rate.Limit(DefaultRate), 1)
	case opts.Rate > 0:
		lim = rate.NewLimiter(rate.Limit(opts.Rate), 1)
	}
	batch := maxBatch
	if lim != nil && !opts.DryRun {
		batch = min(maxBatch, max(1, int(math.Ceil(float64(lim.Limit())))))
	}
	start := time.Now()
	backlog := -1
	if b, ok := from.(Backlogger); ok {
		n, err := b.Backlog(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return RedriveResult{Stop: StopCanceled, Backlog: -1, Elapsed: time.Since(start)}, ctx.Err()
			}
			r.log.Warn("dlq: redrive: the source cannot tell its backlog; the run is bounded by event IDs and redrive counts", slog.Any(ackwise.LogKeyError, err))
		} else {
			backlog = max(n, 0)
		}
	}
	if opts.OnStart != nil {
		opts.OnStart(backlog)
	}
	res, err := r.redrive(ctx, to, lim, batch, backlog, opts)
	res.Elapsed = time.Since(start)
	return res, err
}

func (r *run) redrive(ctx context.Context, to RedriveSink, lim *rate.Limiter, batch, backlog int, opts RedriveOptions) (RedriveResult, error) {
	res := RedriveResult{Backlog: backlog}
	maxRedrives := cmp.Or(opts.MaxRedrives, DefaultMaxRedrives)
	moved := movedIDs{seed: maphash.MakeSeed(), m: map[uint64]struct{}{}}
	note := func(msg *ackwise.Message, env Envelope, a Action) {
		r.log.Debug("dlq: redrive", slog.String(ackwise.LogKeyAction, string(a)), slog.String(ackwise.LogKeyEventID, msg.EventID()), slog.String(ackwise.LogKeyBrokerID, msg.BrokerID), slog.String(ackwise.LogKeyReason, string(env.Reason)))
		if opts.OnMessage != nil {
			opts.OnMessage(msg, env, a)
		}
	}
	counted := func() int {
		if opts.DryRun {
			return res.WouldMove
		}
		return res.Moved
	}
	plan := func() (int, StopReason, error) {
		want := batch
		if opts.Max > 0 {
			if counted() >= opts.Max {
				return 0, StopMax, nil
			}
			want = min(want, opts.Max-counted())
		}
		room := r.maxHeld - len(r.pending)
		if room <= 0 {
			return 0, StopHeldLimit, nil
		}
		want = min(want, room)
		if backlog >= 0 {
			left := backlog - r.seen
			if left <= 0 {
				return 0, StopBacklog, nil
			}
			want = min(want, left)
		}
		if lim != nil && !opts.DryRun {
			// Receive only when the next publish may go, so that no message
			// waits for the rate cap for long while its lease runs.
			if err := tokenReady(ctx, lim); err != nil {
				return 0, StopCanceled, err
			}
		}
		return want, "", nil
	}
	var err error
	res.Stop, res.ReleaseFailed, err = r.drive(ctx, make([]*ackwise.Message, batch), plan, func(msg *ackwise.Message) (StopReason, error) {
		env, derr := Decode(msg.Headers)
		switch {
		case derr != nil:
			res.Skipped++
			res.NoEnvelope++
			r.hold(msg)
			note(msg, Envelope{}, ActionNoEnvelope)
			return "", nil
		case opts.Filter != nil && !opts.Filter(msg, env):
			res.Skipped++
			r.hold(msg)
			note(msg, env, ActionSkipped)
			return "", nil
		}
		id := msg.EventID()
		count, countOK := RedriveCount(msg.Headers)
		switch {
		case PayloadCut(msg.Headers):
			res.PayloadCut++
			r.hold(msg)
			note(msg, env, ActionPayloadCut)
			return "", nil
		case opts.MaxAge > 0 && tooOld(env, opts.MaxAge, time.Now()):
			res.TooOld++
			r.hold(msg)
			note(msg, env, ActionTooOld)
			return "", nil
		case id != "" && moved.has(id):
			res.AlreadyMoved++
			r.hold(msg)
			note(msg, env, ActionAlreadyMoved)
			return "", nil
		case !opts.Force && (!countOK || count >= maxRedrives):
			res.RedriveLimited++
			r.hold(msg)
			note(msg, env, ActionRedriveLimit)
			return "", nil
		case id != "" && moved.len() >= MaxMovedIDs:
			r.hold(msg)
			return StopMovedLimit, nil
		case opts.DryRun:
			res.WouldMove++
			moved.add(id)
			r.hold(msg)
			note(msg, env, ActionWouldMove)
			return "", nil
		}
		if !countOK {
			count = math.MaxInt // unreadable: past every limit, and stays so
		}
		if err := r.move(ctx, to, lim, cmp.Or(opts.PublishTimeout, DefaultPublishTimeout), msg, count); err != nil {
			if ctx.Err() != nil || errors.Is(err, errRateDeadline) {
				return StopCanceled, err
			}
			res.Failed++
			note(msg, env, ActionFailed)
			return StopError, err
		}
		res.Moved++
		moved.add(id)
		note(msg, env, ActionMoved)
		return "", nil
	})
	return res, err
}

// drive is the loop Redrive and Inspect share. Before each batch plan says
// how many messages it may take, or why the run stops there (with the
// error that stopped it, if any). A batch receives that many and calls f on
// each that is not a redelivery of one the run holds (those it holds
// again). A failed receive ends the run with the receive's stop reason and
// error; a message the run took coming back with no new one since ends it
// with StopRepeat; f ends it with a stop reason it returns (and its
// error). The messages of the batch after the one it ended at are held:
// they are this run's to release. Whatever the run holds is released when
// it ends; drive returns why it ended, how many releases failed, and the
// error.
func (r *run) drive(ctx context.Context, buf []*ackwise.Message, plan func() (int, StopReason, error), f func(msg *ackwise.Message) (StopReason, error)) (StopReason, int, error) {
	for {
		want, stop, err := plan()
		if stop == "" {
			stop, err = r.batch(ctx, buf[:want], f)
		}
		if stop != "" {
			return stop, r.releaseAll(ctx), err
		}
	}
}

// batch is one batch of drive.
func (r *run) batch(ctx context.Context, buf []*ackwise.Message, f func(msg *ackwise.Message) (StopReason, error)) (StopReason, error) {
	n, stop, err := r.receive(ctx, buf)
	if stop != "" {
		return stop, err
	}
	for i, msg := range buf[:n] {
		buf[i] = nil
		again, repeat := r.redelivered(msg)
		switch {
		case repeat:
			stop = StopRepeat
		case !again:
			stop, err = f(msg)
		}
		if stop != "" {
			for _, m := range buf[i+1 : n] {
				r.hold(m)
			}
			clear(buf[i+1 : n])
			return stop, err
		}
	}
	return "", nil
}

// move publishes msg's redrive copy, with redrive count count+1, to to
// (after the rate cap lets it) and acks msg once the publish is confirmed.
// On any failure msg is held, to be released.
func (r *run) move(ctx context.Context, to RedriveSink, lim *rate.Limiter, timeout time.Duration, msg *ackwise.Message, count int) error {
	if lim != nil {
		if err := lim.Wait(ctx); err != nil {
			r.hold(msg)
			if ctxErr := ctx.Err(); ctxErr != nil {
				return ctxErr
			}
			// Wait also fails when ctx's deadline comes before the next token.
			return fmt.Errorf("%w: %w", errRateDeadline, context.DeadlineExceeded)
		}
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	err := to.Publish(pctx, redriveCopy(msg, count))
	cancel()
	if err != nil {
		r.hold(msg)
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("not confirmed within %v (the target may be down): %w", timeout, err)
		}
		return fmt.Errorf("dlq: redrive of %s (event %q): publish failed, the dead letter stays in the dead-letter destination: %w", msg.BrokerID, msg.EventID(), err)
	}
	// The copy is confirmed: ack even if ctx was cancelled meanwhile, so
	// that an interrupted run does not leave a duplicate behind.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if err := r.from.Ack(actx, msg); err != nil {
		r.hold(msg)
		return fmt.Errorf("dlq: redrive of %s (event %q): published, but the ack of the dead letter failed; it stays in the dead-letter destination too, and a later redrive publishes it again (consumers deduplicate on the event ID): %w", msg.BrokerID, msg.EventID(), err)
	}
	return nil
}

// tooOld reports whether the dead letter of env was written longer ago
// than maxAge at now: its last failure, else its first; without either its
// age is unknown and it counts as too old (a run asked to leave old dead
// letters does not move one it cannot date).
func tooOld(env Envelope, maxAge time.Duration, now time.Time) bool {
	at := env.LastFailure
	if at.IsZero() {
		at = env.FirstFailure
	}
	return at.IsZero() || now.Sub(at) > maxAge
}

// tokenReady waits, without taking it, until lim has a token.
func tokenReady(ctx context.Context, lim *rate.Limiter) error {
	t := lim.Tokens()
	if t >= 1 {
		return nil
	}
	d := time.Duration((1 - t) / float64(lim.Limit()) * float64(time.Second))
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errRateDeadline: ctx's deadline comes before the rate cap allows the next
// publish.
var errRateDeadline = errors.New("dlq: redrive stopped: the context's deadline comes before the rate cap allows the next publish")

// redriveCopy is the message Redrive publishes for the dead letter msg,
// which was redriven count times before.
func redriveCopy(msg *ackwise.Message, count int) *ackwise.Message {
	h := slices.DeleteFunc(Strip(msg.Headers), func(kv ackwise.Header) bool { return ackwise.IsHopHeader(kv.Key) })
	// Apply leaves credentials out of a dead letter; one written otherwise
	// (by an older release, another tool) still goes back without them.
	h = withoutSecrets(h)
	if count < math.MaxInt { // saturating: a forged MaxInt must not wrap to a negative count
		count++
	}
	h.Set(HeaderRedriveCount, strconv.Itoa(count))
	return &ackwise.Message{ID: msg.EventID(), Key: msg.Key, Payload: msg.Payload, Headers: h, Handle: RedriveHandle{DeadLetter: msg}}
}

// movedIDs is the set of event IDs a run moved, as 64-bit hashes (a
// collision would leave a dead letter for the next run, never lose one).
type movedIDs struct {
	seed maphash.Seed
	m    map[uint64]struct{}
}

func (s movedIDs) has(id string) bool {
	_, ok := s.m[maphash.String(s.seed, id)]
	return ok
}

func (s movedIDs) add(id string) {
	if id != "" {
		s.m[maphash.String(s.seed, id)] = struct{}{}
	}
}

func (s movedIDs) len() int { return len(s.m) }

// run is the receive-and-hold machinery Redrive and Inspect share.
type run struct {
	from    RedriveSource
	idle    time.Duration
	maxHeld int
	log     *slog.Logger
	pending []*ackwise.Message   // held deliveries, released when the run ends
	held    map[string]heldEntry // by BrokerID, the pending deliveries that have one (the last held of those sharing one)
	seen    int                  // new (not redelivered) messages received
}

type heldEntry struct {
	idx  int // in pending
	seen int // run.seen when the message was (last) taken
}

func (r *run) defaults() {
	if r.idle == 0 {
		r.idle = DefaultIdleTimeout
	}
	if r.maxHeld == 0 {
		r.maxHeld = DefaultMaxHeld
	}
	if r.log == nil {
		r.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	r.held = map[string]heldEntry{}
}

// receive receives into buf, waiting at most the idle timeout. A non-empty
// StopReason ends the run (with err for StopError and StopCanceled).
func (r *run) receive(ctx context.Context, buf []*ackwise.Message) (int, StopReason, error) {
	if err := ctx.Err(); err != nil {
		return 0, StopCanceled, err
	}
	rctx, cancel := context.WithTimeout(ctx, r.idle)
	defer cancel()
	n, err := r.from.Receive(rctx, buf)
	for err == nil && n == 0 && rctx.Err() == nil {
		// A source should block until a message is there; one that returns
		// empty-handed is asked again until the idle timeout.
		n, err = r.from.Receive(rctx, buf)
	}
	if err == nil && n > 0 {
		return n, "", nil
	}
	if err == nil {
		return 0, StopIdle, nil
	}
	// Deliveries that came with an error are still this run's to release.
	for i := range buf[:n] {
		r.hold(buf[i])
		buf[i] = nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return 0, StopCanceled, ctxErr
	}
	if rctx.Err() != nil {
		// The idle timeout ran out, whichever way the source reported it.
		return 0, StopIdle, nil
	}
	return 0, StopError, fmt.Errorf("dlq: receive: %w", err)
}

// redelivered reports whether msg is a new delivery of a message the run
// holds (its lease ran out: see heldAs). If so, msg takes the old delivery's place among
// the held ones (the old receipt is dead) and stop reports whether no new
// message arrived since the run took it: the run has come round.
func (r *run) redelivered(msg *ackwise.Message) (again, stop bool) {
	e, ok := r.heldAs(msg)
	if !ok {
		r.seen++
		return false, false
	}
	stop = e.seen == r.seen
	r.pending[e.idx] = msg
	r.held[msg.BrokerID] = heldEntry{idx: e.idx, seen: r.seen}
	return true, stop
}

// heldAs finds the held delivery msg is a new delivery of: one with msg's
// BrokerID that the source no longer counts as valid (its lease ran out, so
// the broker delivered the message again). A held delivery that is still
// valid is another message sharing the BrokerID: on RabbitMQ the BrokerID
// is the AMQP message-id, the event ID, which two dead letters of one event
// share. A source without Valid is taken at its BrokerID.
func (r *run) heldAs(msg *ackwise.Message) (heldEntry, bool) {
	if msg.BrokerID == "" {
		return heldEntry{}, false
	}
	e, ok := r.held[msg.BrokerID]
	if !ok {
		return e, false
	}
	if v, isV := r.from.(interface{ Valid(*ackwise.Message) bool }); isV && v.Valid(r.pending[e.idx]) {
		return e, false
	}
	return e, true
}

func (r *run) hold(msg *ackwise.Message) {
	if msg.BrokerID != "" {
		if e, ok := r.heldAs(msg); ok {
			r.pending[e.idx] = msg
			return
		}
		r.held[msg.BrokerID] = heldEntry{idx: len(r.pending), seen: r.seen}
	}
	r.pending = append(r.pending, msg)
}

// releaseAll releases every held delivery, even when ctx was cancelled, and
// returns how many releases failed.
func (r *run) releaseAll(ctx context.Context) int {
	if len(r.pending) == 0 {
		return 0
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	failed := 0
	for i, msg := range r.pending {
		if err := r.from.Release(rctx, msg); err != nil {
			failed++
			r.log.Warn("dlq: release failed; the broker redelivers the message when its lease ends",
				slog.String(ackwise.LogKeyBrokerID, msg.BrokerID), slog.String(ackwise.LogKeyEventID, msg.EventID()), slog.Any(ackwise.LogKeyError, err))
		}
		r.pending[i] = nil
	}
	r.pending = r.pending[:0]
	clear(r.held)
	return failed
}

// InspectOptions configure Inspect. The zero value is valid.
type InspectOptions struct {
	// Max is how many messages to receive at most. Zero means
	// DefaultInspectMax (20); negative is invalid. Every received message is
	// held until Inspect returns, so Max also bounds what is held; a broker's
	// own bound on unacknowledged deliveries (RabbitMQ's prefetch) may end
	// the inspection earlier, as idle.
	Max int
	// IdleTimeout ends the inspection when no message arrives for that long.
	// Zero means DefaultIdleTimeout (2s); negative is invalid.
	IdleTimeout time.Duration
	// Logger receives warnings for failed releases. nil discards.
	Logger *slog.Logger
}

// Validate reports the first invalid field, naming it and its value.
func (o InspectOptions) Validate() error {
	switch {
	case o.Max < 0:
		return fmt.Errorf("dlq: InspectOptions.Max = %d: must not be negative (0 means %d)", o.Max, DefaultInspectMax)
	case o.IdleTimeout < 0:
		return fmt.Errorf("dlq: InspectOptions.IdleTimeout = %v: must not be negative (0 means %v)", o.IdleTimeout, DefaultIdleTimeout)
	}
	return nil
}

// Letter is one message Inspect saw: a copy of the delivery (Handle nil, so
// it cannot be settled) and its envelope.
type Letter struct {
	// Message is a copy of the delivery; it may be kept and changed.
	Message *ackwise.Message
	// Envelope is the decoded envelope; zero when Err is set.
	Envelope Envelope
	// Err is set when the message carries no decodable envelope.
	Err error
}

// InspectResult is what Inspect saw.
type InspectResult struct {
	// Letters are the messages received, in the order received.
	Letters []Letter
	// ReleaseFailed counts releases that failed (see
	// RedriveResult.ReleaseFailed); nothing is lost.
	ReleaseFailed int
	// Stop says why the inspection ended: StopIdle, StopMax, StopRepeat,
	// StopError or StopCanceled.
	Stop StopReason
}

// Inspect receives up to Max messages from from, decodes their envelopes and
// releases every one of them before it returns: inspecting never consumes
// a dead letter (on a log, nothing is committed). The release happens even
// when ctx is cancelled. Inspect returns what it saw until an error together
// with the error.
func Inspect(ctx context.Context, from RedriveSource, opts InspectOptions) (InspectResult, error) {
	if err := opts.Validate(); err != nil {
		return InspectResult{}, err
	}
	if from == nil {
		return InspectResult{}, errors.New("dlq: Inspect: from is nil")
	}
	if opts.Max == 0 {
		opts.Max = DefaultInspectMax
	}
	r := &run{from: from, idle: opts.IdleTimeout, maxHeld: opts.Max, log: opts.Logger}
	r.defaults()
	var res InspectResult
	buf := make([]*ackwise.Message, min(opts.Max, maxBatch))
	plan := func() (int, StopReason, error) {
		if want := min(len(buf), opts.Max-len(res.Letters)); want > 0 {
			return want, "", nil
		}
		return 0, StopMax, nil
	}
	var err error
	res.Stop, res.ReleaseFailed, err = r.drive(ctx, buf, plan, func(msg *ackwise.Message) (StopReason, error) {
		r.hold(msg)
		env, derr := Decode(msg.Headers)
		if derr != nil {
			env = Envelope{}
		}
		res.Letters = append(res.Letters, Letter{Message: copyMessage(msg), Envelope: env, Err: derr})
		return "", nil
	})
	return res, err
}

// copyMessage copies the fields of a delivery that outlive it: a broker may
// reuse the delivery once it is settled.
func copyMessage(m *ackwise.Message) *ackwise.Message {
	c := *m
	c.Handle = nil
	c.Headers = m.Headers.Clone()
	if m.Payload != nil {
		c.Payload = append([]byte(nil), m.Payload...)
	}
	return &c
}

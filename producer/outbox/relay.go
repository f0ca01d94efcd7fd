package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/producer"
)

// ErrRunning is returned by Run while another Run of the same relay is
// under way.
var ErrRunning = errors.New("outbox: relay is already running")

// Relay moves outbox rows to a broker: it claims batches of rows (the head
// row of each key), publishes them through a [producer.Publisher] on an
// [adapters.Sink] and marks each row sent once the broker confirmed it.
// Several relays may run on one table at once (see [Store]).
type Relay struct {
	store Store
	pub   *producer.Publisher
	cfg   Config
	log   *slog.Logger
	m     *metrics

	running atomic.Bool
	wake    wakeup
	// claimMu lets one worker claim at a time: concurrent claims of one
	// relay would scan the same rows, and lock each other's (a row a claim
	// locks and then finds taken stays locked until the claim ends,
	// holding up the other worker's mark). Workers publish and mark in
	// parallel.
	claimMu sync.Mutex
	// exhausted is 1 + the wake generation at which a claim last found
	// fewer rows than a batch (0: none yet).
	exhausted atomic.Uint64
}

// NewRelay returns a relay from store to sink. It does not take ownership
// of sink. With a MeterProvider it records, with attribute
// ackwise.outbox.owner:
//
//   - ackwise.outbox.published (counter, {message}): rows confirmed and
//     marked sent;
//   - ackwise.outbox.publish.errors (counter, {message}): rows whose
//     publish failed (each failed claim of a row counts once);
//   - ackwise.outbox.parked (counter, {message}): rows this relay parked;
//   - ackwise.outbox.backlog (gauge, {row}), ackwise.outbox.oldest.age
//     (gauge, s) and ackwise.outbox.parked.rows (gauge, {row}): the
//     table's Stats, read when the metrics are collected while Run runs.
func NewRelay(store Store, sink adapters.Sink, cfg Config) (*Relay, error) {
	if store == nil {
		return nil, errors.New("outbox: store is nil")
	}
	if sink == nil {
		return nil, errors.New("outbox: sink is nil")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	pub, err := producer.New(sink, cfg.Publish)
	if err != nil {
		return nil, fmt.Errorf("outbox: Config.Publish: %w", err)
	}
	m, err := newMetrics(cfg.MeterProvider, cfg.Owner)
	if err != nil {
		return nil, err
	}
	r := &Relay{store: store, pub: pub, cfg: cfg, log: cfg.Logger, m: m}
	r.wake.ch = make(chan struct{})
	return r, nil
}

// Owner returns the name this relay claims rows under.
func (r *Relay) Owner() string { return r.cfg.Owner }

// Run relays rows until ctx is done, then drains: it stops claiming, lets
// the batches in flight publish for up to Config.DrainTimeout, marks what
// was confirmed and releases the rest unmarked. It wakes on the store's
// notifications and polls every Config.PollInterval, and prunes sent rows
// older than Config.Retention every Config.PruneInterval. It returns nil
// after the drain. A relay runs once at a time (a second Run while one is
// under way returns ErrRunning at once); it may run again after Run
// returned.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)
	unregister, err := r.m.observeStats(r.store)
	if err != nil {
		return err
	}
	defer unregister()

	// hard ends the publishes still in flight DrainTimeout after ctx.
	hard, cancelHard := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHard()
	stopDrainTimer := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(r.cfg.DrainTimeout, cancelHard)
		context.AfterFunc(hard, func() { t.Stop() })
	})
	defer stopDrainTimer()

	var wg sync.WaitGroup
	wg.Go(func() {
		if err := r.store.Listen(ctx, r.wake.signal); err != nil && ctx.Err() == nil {
			r.log.Error("outbox: listen for notifications failed; polling only", "err", err)
		}
	})
	if r.cfg.Retention > 0 {
		wg.Go(func() { r.pruneLoop(ctx) })
	}
	for range r.cfg.Workers {
		wg.Go(func() { r.work(ctx, hard) })
	}
	wg.Wait()
	return nil
}

// work claims, publishes and marks batches until ctx is done.
//
// Workers claim one at a time (claimMu). A claim that found fewer rows than
// a batch took everything claimable: the other workers then skip their
// claims until something changes — a notification, a batch marked (the
// next rows of its keys are heads now) — or their poll timer fires (leases
// and retry delays run out without a signal).
func (r *Relay) work(ctx, hard context.Context) {
	poll := time.NewTimer(r.cfg.PollInterval)
	defer poll.Stop()
	force := true
	for ctx.Err() == nil {
		woken, gen := r.wake.wait() // before the claim: a notification during it is not lost
		var rows []Row
		if force || r.exhausted.Load() != gen+1 {
			r.claimMu.Lock()
			var err error
			rows, err = r.store.Claim(ctx, r.cfg.Owner, r.cfg.BatchSize, r.cfg.Lease)
			if err != nil && ctx.Err() == nil {
				r.log.Error("outbox: claim failed", "err", err)
			}
			if err == nil && len(rows) < r.cfg.BatchSize {
				r.exhausted.Store(gen + 1)
			}
			r.claimMu.Unlock()
		}
		if len(rows) > 0 {
			r.relay(hard, rows)
			r.wake.signal() // the next rows of these keys are heads now
			force = false
			continue
		}
		poll.Reset(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
		case <-woken:
			force = false
		case <-poll.C:
			force = true
		}
	}
}

// relay publishes the claimed rows and records each one's outcome: sent,
// parked, or released for a later claim.
func (r *Relay) relay(hard context.Context, rows []Row) {
	rows = r.parkUnreadable(hard, rows)
	if len(rows) == 0 {
		return
	}
	msgs := make([]*ackwise.Message, len(rows))
	for i, row := range rows {
		msgs[i] = row.Message
	}
	// A row carries the trace of the transaction that added it, or none:
	// never the span of the relay's own ctx.
	pctx, cancel := context.WithTimeout(trace.ContextWithSpanContext(hard, trace.SpanContext{}), r.cfg.PublishTimeout)
	err := r.pub.Publish(pctx, msgs...)
	cancel()
	failures := adapters.PublishFailures(err, len(rows))

	// Bookkeeping outlives the drain: a confirmed row left unmarked would
	// be published again.
	bctx, bcancel := context.WithTimeout(context.WithoutCancel(hard), bookkeepingTimeout)
	defer bcancel()
	failed := make([]bool, len(rows))
	for _, f := range failures {
		failed[f.Index] = true
	}
	sent := make([]int64, 0, len(rows))
	for i, row := range rows {
		if !failed[i] {
			sent = append(sent, row.ID)
		}
	}
	if len(sent) > 0 {
		if err := r.store.MarkSent(bctx, sent); err != nil {
			// Their claims run out and they are published again, with the
			// same event IDs.
			r.log.Error("outbox: marking confirmed rows sent failed; they will be published again", "rows", len(sent), "err", err)
		} else {
			r.m.published(len(sent))
		}
	}
	if len(failures) == 0 {
		return
	}
	r.m.publishErrors(len(failures))
	// Rows that failed alike wait alike: one release per attempt count.
	type group struct {
		ids   []int64
		delay time.Duration
		err   error
	}
	groups := map[int]*group{}
	for _, f := range failures {
		row := rows[f.Index]
		if reason, park := r.parkReason(row, f.Err); park {
			r.park(bctx, row, reason)
			continue
		}
		g := groups[row.Attempts]
		if g == nil {
			g = &group{delay: r.cfg.RowRetry.Delay(row.Attempts), err: f.Err}
			if hard.Err() != nil {
				g.delay = 0 // drained, not failed: the next relay may take it at once
			}
			groups[row.Attempts] = g
		}
		if d, ok := ackwise.RetryAfterOf(f.Err); ok && hard.Err() == nil {
			g.delay = max(g.delay, d)
		}
		g.ids = append(g.ids, row.ID)
	}
	for _, g := range groups {
		if err := r.store.Release(bctx, r.cfg.Owner, g.ids, g.delay, errorText(g.err)); err != nil {
			r.log.Error("outbox: releasing failed rows failed; their claims run out instead", "rows", len(g.ids), "err", err)
		}
	}
}

// parkUnreadable parks the rows a store could not read (Row.Err) and
// returns the others.
func (r *Relay) parkUnreadable(hard context.Context, rows []Row) []Row {
	if !slices.ContainsFunc(rows, func(row Row) bool { return row.Err != nil }) {
		return rows
	}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(hard), bookkeepingTimeout)
	defer cancel()
	ok := make([]Row, 0, len(rows))
	for _, row := range rows {
		if row.Err == nil {
			ok = append(ok, row)
			continue
		}
		r.park(bctx, row, "unreadable: "+errorText(row.Err))
	}
	return ok
}

// park parks row with reason, and logs it.
func (r *Relay) park(ctx context.Context, row Row, reason string) {
	if err := r.store.Park(ctx, r.cfg.Owner, row.ID, reason); err != nil {
		r.log.Error("outbox: parking a row failed", "id", row.ID, "event_id", row.Message.ID, "err", err)
		return
	}
	r.m.parkedRow()
	r.log.Warn("outbox: row parked", "id", row.ID, "event_id", row.Message.ID, "key", row.Message.Key, "reason", reason)
}

// parkReason says whether a row that failed with err is parked: refused
// for good by the broker (ackwise.Permanent), or out of attempts.
func (r *Relay) parkReason(row Row, err error) (string, bool) {
	if errors.Is(err, adapters.ErrClosed) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return "", false
	}
	if ackwise.ClassOf(err) == ackwise.ClassPermanent {
		return "permanent: " + errorText(err), true
	}
	if r.cfg.RowRetry.Exhausted(row.Attempts) {
		return fmt.Sprintf("max-attempts (%d): %s", row.Attempts, errorText(err)), true
	}
	return "", false
}

// errorText is err's text, bounded.
func errorText(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if len(s) > maxErrorText {
		s = s[:maxErrorText] + "…"
	}
	return s
}

// pruneLoop prunes sent rows past the retention every PruneInterval.
func (r *Relay) pruneLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.PruneInterval)
	defer t.Stop()
	for {
		for {
			n, err := r.store.Prune(ctx, r.cfg.Retention, DefaultPruneBatch)
			if err != nil && ctx.Err() == nil {
				r.log.Error("outbox: prune failed", "err", err)
			}
			if err != nil || n < DefaultPruneBatch {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// wakeup wakes every waiting worker at once: signal closes the channel
// wait handed out, makes a new one and counts a generation.
type wakeup struct {
	mu  sync.Mutex
	ch  chan struct{}
	gen uint64
}

func (w *wakeup) wait() (<-chan struct{}, uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ch, w.gen
}

func (w *wakeup) signal() {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.ch)
	w.ch = make(chan struct{})
	w.gen++
}

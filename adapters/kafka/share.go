package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// DefaultShareLease is the broker's default acquisition lock of a share
// group record (share.record.lock.duration.ms, 30s).
const DefaultShareLease = 30 * time.Second

// ShareSource consumes a topic as a member of a share group (KIP-932,
// "queues for Kafka"): the broker hands each record to one member at a time,
// members of one group may share a partition, and each record is settled on
// its own: Ack accepts it, Release hands it back for redelivery (its
// delivery count, the message's Attempt, goes up), Reject archives it.
// There is no offset to commit and no per-key order across members.
//
// franz-go accepts every record of a poll that is still unsettled when the
// client polls again. So that nothing is accepted before its work is done
// (invariant 1), Receive does not poll again until every record of the
// previous poll was settled: a poll's records are handed out over several
// Receive calls, and the last one waits for the slowest record of the poll.
//
// The broker locks a record when it hands it to the client, not when the
// engine receives it. So that no lock runs out on a record waiting in the
// source (the broker would count a delivery that no handler saw, and archive
// the record at its delivery limit), the client fetches only when Receive
// polls, about ShareConfig.PollBatch records (DefaultSharePollBatch when 0; the
// broker may return a little more rather than split a batch), and the
// source renews the locks of the records it holds back every sixth of the
// lease until it hands them out; from then on the engine's heartbeat renews
// them. The source sends the acks queued meanwhile at the same pace, and a
// renewal at once. (franz-go can still grant one fetch while a poll
// returns; a record of it whose lock ran out in the client's buffer by the
// next poll is released, not delivered, and one with less than half of it
// left is renewed before it is handed out.)
//
// The broker applies the acknowledgements of one partition in one request
// all or nothing: a single status it refuses (a record whose lock ran out)
// fails the others, whose records it then delivers again. A status is sent
// some time after it is queued, so the source never queues a status for a
// record whose lock it knows ends within half the lease together with
// others: it sends it on its own, a release instead once the lock ran out,
// and no renewal then.
//
// Renewing a lock takes Kafka 4.2 (KIP-1222, ShareAcknowledge v2). On older
// brokers nothing renews locks: Capabilities reports no ExtendLease (the
// engine then runs no heartbeat), ExtendLease fails, and a record whose
// handler, or whose retry waiting in place, outlasts its lock is delivered
// again. Keep handlers and retry backoffs well within the lock there, or
// raise share.record.lock.duration.ms.
//
// Receive must be called from one goroutine at a time; the settle methods
// may be called concurrently.
type ShareSource struct {
	cfg    ShareConfig
	cl     *kgo.Client
	log    *slog.Logger
	lease  time.Duration
	limits *batchLimits // of the dead-letter topic
	// renews reports whether the brokers renew locks (Kafka 4.2+).
	renews bool

	mu          sync.Mutex
	pending     []*kgo.Record // this poll's records not yet delivered
	renewedAt   time.Time     // when the locks of pending were last renewed (zero: not since the poll)
	outstanding int           // this poll's records not yet settled
	drained     chan struct{} // closed when outstanding reaches 0

	// ackMu keeps a status the broker may refuse out of the requests of
	// the others: statuses of live records are queued under its read lock,
	// the status of a record whose lock runs out soon or ran out under its
	// write lock (see sendAlone).
	ackMu sync.RWMutex
	// settleMu keeps terminal statuses (accept, release, reject) from
	// being queued while renewPending sends renewals (see there); taken
	// after ackMu. Renewals do not wait for it.
	settleMu sync.RWMutex
	// flushNow asks renewPending to send the queued statuses now: a
	// renewal by ExtendLease must not wait for the next tick.
	flushNow chan struct{}

	closed atomic.Bool
	// invalid is told when Close voids the records in flight
	// (adapters.Invalidator).
	invalid  adapters.InvalidHook
	stopCtx  context.Context // cancelled by Close: ends renewPending
	stop     context.CancelFunc
	renewing sync.WaitGroup
}

var (
	_ adapters.Source      = (*ShareSource)(nil)
	_ adapters.Detacher    = (*ShareSource)(nil)
	_ adapters.Invalidator = (*ShareSource)(nil)
)

// DefaultSharePollBatch is how many records a share source fetches at most
// per poll when ShareConfig.PollBatch is 0: the engine's default MaxInFlight.
// Every record fetched stays locked to this member until it is settled, out
// of reach of the group's other members.
const DefaultSharePollBatch = 64

type shareReceipt struct {
	r       *kgo.Record
	lease   time.Duration
	settled atomic.Bool
	// renewedAt is when the lock was last renewed (Unix nanoseconds; 0:
	// never), by ExtendLease or while the record waited in the source.
	// franz-go does not move the fetch-time AcquisitionDeadline; the
	// broker's new deadline is a lease after it takes the renewal, which
	// the source sends at once.
	renewedAt atomic.Int64
	detached  bool // Detach ran (by the engine, one call at a time)
}

// deadline is when rc's lock ends as far as the source knows: a lease
// after its last renewal, else the fetch-time deadline (franz-go computes
// it when the fetch response arrives, so it is never earlier than the
// broker's). A renewal's is earlier than the broker's by the time the
// renewal takes to reach it, milliseconds. Zero when unknown.
func (rc *shareReceipt) deadline() time.Time {
	if at := rc.renewedAt.Load(); at != 0 {
		return time.Unix(0, at).Add(rc.lease)
	}
	return rc.r.AcquisitionDeadline()
}

// expired reports whether rc's lock ran out.
func (rc *shareReceipt) expired(now time.Time) bool {
	return rc.expiresWithin(now, 0)
}

// expiresWithin reports whether rc's lock ends within d of now.
func (rc *shareReceipt) expiresWithin(now time.Time, d time.Duration) bool {
	dl := rc.deadline()
	return !dl.IsZero() && !now.Add(d).Before(dl)
}

// nearExpiry is how close to the end of its lock a record's status is sent
// on its own: a status is sent well after it is queued (with renewPending's
// flush, a sixth of the lease later, or franz-go's own 1s timer), so one
// queued near the end of the lock may reach the broker after it, and the
// broker would refuse the other statuses of the partition sent with it.
func (s *ShareSource) nearExpiry() time.Duration { return s.lease / 2 }

// NewShareSource joins the share group cfg.Group on cfg.Topic and returns
// once a broker answered. It fails when the config is invalid (the error
// names the field and value) or no broker can be reached before ctx is
// done.
func NewShareSource(ctx context.Context, cfg ShareConfig) (*ShareSource, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	batch := int32(DefaultSharePollBatch)
	if cfg.PollBatch > 0 {
		batch = int32(min(cfg.PollBatch, 1<<30))
	}
	limits := new(batchLimits) // of the dead-letter topic
	opts := append(cfg.consume().opts(),
		limits.opt(),
		kgo.ShareGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topic),
		// At most batch records per fetch, and no fetching ahead: every
		// record the broker locks for this member is one Receive polled
		// (but for franz-go's race that releaseStale handles).
		// (Not ShareMaxRecordsStrict: splitting the producer's batches
		// made kfake count a released record's delivery twice.)
		kgo.ShareMaxRecords(batch),
		kgo.MaxConcurrentFetches(0),
	)
	opts = append(opts, cfg.Options...)
	// Set either way: a group earlier opened with "earliest" keeps that
	// setting on the broker, and "latest" would silently not apply.
	if err := setShareAutoOffsetReset(ctx, cfg, cfg.StartOffset); err != nil {
		return nil, err
	}
	w := writes{group: cfg.Group, deadLetter: cfg.DeadLetterTopic, limits: limits}
	cl, err := w.newClient(ctx, "ShareConfig", cfg.ClientConfig, opts, nil)
	if err != nil {
		return nil, err
	}
	lease, err := shareLockDuration(ctx, cl, cfg.Group)
	if err != nil {
		cfg.Logger.Warn("kafka: cannot read the share group's record lock duration; assuming the broker default",
			ackwise.LogKeyGroup, cfg.Group, "assumed", DefaultShareLease, ackwise.LogKeyError, err)
		lease = DefaultShareLease
	}
	renews, err := brokersRenewLocks(ctx, cl)
	if err != nil {
		cfg.Logger.Warn("kafka: cannot read the brokers' API versions; assuming they renew share locks (Kafka 4.2+)", ackwise.LogKeyError, err)
		renews = true
	}
	if !renews {
		cfg.Logger.Warn("kafka: the brokers do not renew share locks (before Kafka 4.2): a handler that outlasts a record's lock has the record delivered again",
			ackwise.LogKeyGroup, cfg.Group, "lock", lease)
	}
	s := &ShareSource{cfg: cfg, cl: cl, log: cfg.Logger, lease: lease, limits: limits, renews: renews, flushNow: make(chan struct{}, 1)}
	s.stopCtx, s.stop = context.WithCancel(context.Background())
	s.renewing.Add(1)
	go s.renewPending()
	return s, nil
}

// brokersRenewLocks reports whether every broker renews share locks: the
// renewal (KIP-1222) came with ShareAcknowledge v2, in Kafka 4.2.
func brokersRenewLocks(ctx context.Context, cl *kgo.Client) (bool, error) {
	vs, err := kadm.NewClient(cl).ApiVersions(ctx)
	if err != nil {
		return false, err
	}
	renews, seen := true, false
	for _, v := range vs.Sorted() {
		if v.Err != nil {
			return false, fmt.Errorf("broker %d: %w", v.NodeID, v.Err)
		}
		seen = true
		if max, ok := v.KeyMaxVersion(kmsg.ShareAcknowledge.Int16()); !ok || max < 2 {
			renews = false
		}
	}
	if !seen {
		return false, errors.New("no broker answered")
	}
	return renews, nil
}

// renewPending renews the locks of the records polled but not handed out
// yet, every sixth of the lease, until Close, and sends the acks queued
// meanwhile, and at once the renewals ExtendLease queued: with no fetch in
// flight between polls, franz-go would hold them until the next poll, after
// the locks they renew ran out. A sixth: a record handed out just before a
// tick has five sixths of the lease left, and the engine's first heartbeat
// comes within two thirds of the lease.
func (s *ShareSource) renewPending() {
	defer s.renewing.Done()
	every := max(s.lease/6, time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stopCtx.Done():
			return
		case <-t.C:
		case <-s.flushNow:
		}
		// No settle queues a terminal status while the renewals are
		// drained and sent (settleMu). franz-go leaves a window open where
		// a record's terminal ack, landing between the drain of its
		// renewal and the building of the request, goes out twice (with
		// the renewal's request and the next); the broker refuses the
		// second, and every other status of the partition sent with it.
		// Renewals queued meanwhile (ExtendLease takes only ackMu's read
		// lock) go with the next flush, which their kick asks for: a
		// heartbeat round of renewals does not wait a round trip each.
		s.ackMu.RLock()
		s.settleMu.Lock()
		s.mu.Lock()
		// A record whose lock ran out (one franz-go fetched ahead) is not
		// renewed: the broker would refuse the renewal, with the other
		// statuses sent with it, and renewedAt would make the record look
		// locked. It leaves pending and is released on its own below.
		var stale []*shareReceipt
		now := time.Now()
		kept := s.pending[:0]
		for _, r := range s.pending {
			if rc := newShareReceipt(r, s.lease, s.renewedAt); rc.expired(now) {
				stale = append(stale, rc)
				continue
			}
			kept = append(kept, r)
			if s.renews {
				r.Ack(kgo.AckRenew)
			}
		}
		s.pending = kept
		if len(s.pending) > 0 && s.renews {
			s.renewedAt = now
		}
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(s.stopCtx, every)
		if err := s.cl.FlushAcks(ctx); err != nil && s.stopCtx.Err() == nil {
			s.log.Warn("kafka: share acks not sent", ackwise.LogKeyGroup, s.cfg.Group, ackwise.LogKeyError, err)
		}
		cancel()
		s.settleMu.Unlock()
		s.ackMu.RUnlock()
		if len(stale) > 0 {
			s.releaseStale(stale)
		}
	}
}

// shareLockDuration reads how long the broker locks a record it hands to a
// member of group: the group's share.record.lock.duration.ms when set, else
// the broker's group.share.record.lock.duration.ms. The engine heartbeats
// (renews the locks of) records in flight at a third of it.
func shareLockDuration(ctx context.Context, cl *kgo.Client, group string) (time.Duration, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	g := kmsg.NewDescribeConfigsRequestResource()
	g.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	g.ResourceName = group
	g.ConfigNames = []string{"share.record.lock.duration.ms"}
	req.Resources = append(req.Resources, g)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, fmt.Errorf("describe configs of group %s: %w", group, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return 0, fmt.Errorf("describe configs of group %s: %w", group, err)
		}
		for _, c := range r.Configs {
			if c.Name == "share.record.lock.duration.ms" && c.Source == kmsg.ConfigSourceGroupConfig {
				return lockMillis(c.Name, c.Value)
			}
		}
	}
	adm := kadm.NewClient(cl)
	brokers, err := adm.ListBrokers(ctx)
	if err != nil || len(brokers) == 0 {
		return 0, fmt.Errorf("list brokers: %w", err)
	}
	rcs, err := adm.DescribeBrokerConfigs(ctx, brokers[0].NodeID)
	if err != nil {
		return 0, fmt.Errorf("describe configs of broker %d: %w", brokers[0].NodeID, err)
	}
	for _, rc := range rcs {
		for _, c := range rc.Configs {
			if c.Key == "group.share.record.lock.duration.ms" {
				return lockMillis(c.Key, c.Value)
			}
		}
	}
	return DefaultShareLease, nil
}

func lockMillis(name string, v *string) (time.Duration, error) {
	if v == nil {
		return DefaultShareLease, nil
	}
	ms, err := strconv.ParseInt(*v, 10, 64)
	if err != nil || ms <= 0 {
		return 0, fmt.Errorf("%s = %q: want a positive number of milliseconds", name, *v)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// setShareAutoOffsetReset sets the share group's share.auto.offset.reset.
func setShareAutoOffsetReset(ctx context.Context, cfg ShareConfig, v string) error {
	// cfg.Options too: they may carry the dialer or the authentication.
	cl, err := kgo.NewClient(append(cfg.ClientConfig.opts(), cfg.Options...)...)
	if err != nil {
		return fmt.Errorf("kafka: new client: %w", err)
	}
	defer cl.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = cfg.Group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name = "share.auto.offset.reset"
	c.Value = &v
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("kafka: set share.auto.offset.reset of group %s: %w", cfg.Group, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return fmt.Errorf("kafka: set share.auto.offset.reset of group %s: %w", cfg.Group, err)
		}
	}
	return nil
}

// Client returns the franz-go client behind the source.
func (s *ShareSource) Client() *kgo.Client { return s.cl }

// Capabilities: DeliveryCount (Attempt is the broker's delivery count),
// Lease (the acquisition lock, as the group's or the broker's config says
// when the source was opened: 30s by default) with ExtendLease (AckRenew)
// when the brokers are Kafka 4.2 or later. No Delay: Release redelivers at once, so the engine retries
// in place. Not Ordered: members of a share group share partitions.
func (s *ShareSource) Capabilities() adapters.Capabilities {
	return adapters.Capabilities{Lease: s.lease, ExtendLease: s.renews, DeliveryCount: true}
}

// Extensions declares Detacher (a payload detached from its fetch) and
// Invalidator (told on Close).
func (s *ShareSource) Extensions() adapters.Extensions {
	return adapters.Extensions{Detacher: s, Invalidator: s}
}

// Receive hands out the records of the current poll; once all are handed
// out it waits until all are settled, then polls again.
func (s *ShareSource) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	for {
		if stop, err := receiveEnds(ctx, &s.closed, buf); stop {
			return 0, err
		}
		s.mu.Lock()
		if len(s.pending) > 0 {
			n := 0
			var stale []*shareReceipt
			var short []*ackwise.Message
			now := time.Now()
			for n+len(short) < len(buf) && len(s.pending) > 0 {
				m := shareMessage(s.pending[0], s.lease, s.renewedAt)
				s.pending = s.pending[1:]
				switch rc := m.Handle.(*shareReceipt); {
				case rc.expired(now):
					stale = append(stale, rc)
				case rc.expiresWithin(now, s.nearExpiry()) && s.renews:
					short = append(short, m)
				default:
					buf[n] = m
					n++
				}
			}
			s.mu.Unlock()
			// Records franz-go fetched ahead (only they wait unrenewed)
			// with little of their lock left: the engine's first renewal
			// comes a third to two thirds of the lease after delivery,
			// too late for them. Renewed first, or released if their
			// lock ran out meanwhile.
			for _, m := range short {
				if rc := m.Handle.(*shareReceipt); s.sendAlone(rc, kgo.AckRenew) {
					buf[n] = m
					n++
				} else {
					stale = append(stale, rc)
				}
			}
			if len(stale) > 0 {
				s.releaseStale(stale)
			}
			if n == 0 {
				continue
			}
			return n, nil
		}
		if s.outstanding > 0 {
			if s.drained == nil {
				s.drained = make(chan struct{})
			}
			wait := s.drained
			s.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		s.mu.Unlock()
		// Everything the client holds: a record left in its buffer would
		// be locked with nobody renewing it.
		fetches := s.cl.PollFetches(ctx)
		if fetches.IsClientClosed() {
			return 0, adapters.ErrClosed
		}
		fetches.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				s.log.Warn("kafka: share fetch error", ackwise.LogKeyTopic, t, ackwise.LogKeyPartition, p, ackwise.LogKeyError, err)
			}
		})
		recs := fetches.Records()
		if len(recs) == 0 {
			continue
		}
		s.mu.Lock()
		s.pending = recs
		s.renewedAt = time.Time{}
		s.outstanding = len(recs)
		s.mu.Unlock()
	}
}

// releaseStale gives the records whose lock ran out before they were handed
// out a status of their own (a release, which the broker refuses; it
// redelivers them either way) instead of delivering them: a handler would
// run on a record the broker may already have given to another member.
// Only records franz-go fetched ahead get here: the source polls only when
// everything it holds is settled, but franz-go's strict-pull gate can grant
// the next fetch while a poll is returning, and those records wait in the
// client's buffer, where nobody can renew them, until the next poll.
func (s *ShareSource) releaseStale(stale []*shareReceipt) {
	s.log.Warn("kafka: share records outlived their lock in the client's buffer before delivery; released for redelivery",
		ackwise.LogKeyGroup, s.cfg.Group, "records", len(stale), "lock", s.lease)
	for _, rc := range stale {
		rc.settled.Store(true)
		s.sendAlone(rc, kgo.AckRelease)
		s.done()
	}
}

// shareMessage builds r's message; renewedAt is when its lock was last
// renewed while it waited in the source (zero: not), lease how long a lock
// lasts.
func shareMessage(r *kgo.Record, lease time.Duration, renewedAt time.Time) *ackwise.Message {
	m := plainMessage(r)
	if dc := int(r.DeliveryCount()); dc > 0 {
		m.Attempt = dc
	}
	m.Handle = newShareReceipt(r, lease, renewedAt)
	return m
}

// newShareReceipt is r's receipt; renewedAt is when its lock was last
// renewed while it waited in the source (zero: not).
func newShareReceipt(r *kgo.Record, lease time.Duration, renewedAt time.Time) *shareReceipt {
	rc := &shareReceipt{r: r, lease: lease}
	if !renewedAt.IsZero() {
		rc.renewedAt.Store(renewedAt.UnixNano())
	}
	return rc
}

// Detach copies msg's Payload out of the fetch it points into
// (adapters.Detacher), once per delivery, and lets go of the record's
// bytes: the record stays, for its acknowledgement, without its key, value
// and headers (the message holds copies of its key and headers already).
func (s *ShareSource) Detach(msg *ackwise.Message) {
	rc, ok := msg.Handle.(*shareReceipt)
	if !ok || rc.detached {
		return
	}
	rc.detached = true
	msg.Payload = bytes.Clone(msg.Payload)
	rc.r.Key, rc.r.Value, rc.r.Headers = nil, nil, nil
}

func (s *ShareSource) receipt(msg *ackwise.Message) (*shareReceipt, error) {
	rc, ok := msg.Handle.(*shareReceipt)
	if !ok {
		return nil, fmt.Errorf("kafka: message %q was not delivered by a share source", msg.BrokerID)
	}
	return rc, nil
}

// settle acks msg with status, once.
func (s *ShareSource) settle(msg *ackwise.Message, status kgo.AckStatus) error {
	rc, err := s.receipt(msg)
	if err != nil {
		return err
	}
	if s.closed.Load() {
		return fmt.Errorf("kafka: %s: source closed: %w", msg.BrokerID, adapters.ErrReceiptInvalid)
	}
	if !rc.settled.CompareAndSwap(false, true) {
		return fmt.Errorf("kafka: %s: already settled", msg.BrokerID)
	}
	if !rc.expiresWithin(time.Now(), s.nearExpiry()) {
		s.ackMu.RLock()
		s.settleMu.RLock()
		// Checked again: the wait for the locks (behind a sendAlone's or
		// a renewal round's flushes) can take the record near its lock's
		// end, and queued now it would be sent with other statuses.
		queued := !rc.expiresWithin(time.Now(), s.nearExpiry())
		if queued {
			rc.r.Ack(status)
		}
		s.settleMu.RUnlock()
		s.ackMu.RUnlock()
		if queued {
			s.done()
			return nil
		}
	}
	ok := s.sendAlone(rc, status)
	s.done()
	if !ok {
		return fmt.Errorf("kafka: %s: acquisition lock expired at %v: %w", msg.BrokerID, rc.r.AcquisitionDeadline(), adapters.ErrReceiptInvalid)
	}
	return nil
}

// sendAlone sends status for rc, whose lock ends soon or ran out, in a
// request of its own: the statuses queued before go first, then rc's, and
// no other status is queued meanwhile. If rc's lock ran out by then, it
// sends a release instead of status (the record must have a status:
// franz-go's next poll would accept it otherwise; the broker refuses the
// release and redelivers the record either way), or nothing for a renewal,
// and reports false.
func (s *ShareSource) sendAlone(rc *shareReceipt, status kgo.AckStatus) bool {
	s.ackMu.Lock()
	defer s.ackMu.Unlock()
	flush := func() {
		ctx, cancel := context.WithTimeout(context.Background(), max(s.lease/3, time.Second))
		defer cancel()
		if err := s.cl.FlushAcks(ctx); err != nil && !s.closed.Load() {
			s.log.Warn("kafka: share acks not sent", ackwise.LogKeyGroup, s.cfg.Group, ackwise.LogKeyError, err)
		}
	}
	flush()
	ok := !rc.expired(time.Now())
	switch {
	case ok:
	case status == kgo.AckRenew:
		return false
	default:
		status = kgo.AckRelease
	}
	rc.r.Ack(status)
	if status == kgo.AckRenew {
		rc.renewedAt.Store(time.Now().UnixNano())
	}
	flush()
	return ok
}

func (s *ShareSource) done() {
	s.mu.Lock()
	s.outstanding--
	if s.outstanding == 0 && s.drained != nil {
		close(s.drained)
		s.drained = nil
	}
	s.mu.Unlock()
}

// Ack accepts msg: the broker will not deliver it again. Acks are sent in
// the background; Close flushes them.
func (s *ShareSource) Ack(_ context.Context, msg *ackwise.Message) error {
	return s.settle(msg, kgo.AckAccept)
}

// Release hands msg back: the broker delivers it again at once, to any
// member, with its delivery count incremented.
func (s *ShareSource) Release(_ context.Context, msg *ackwise.Message) error {
	return s.settle(msg, kgo.AckRelease)
}

// Reject archives msg: the broker never delivers it again. Prefer
// DeadLetter, which keeps the record.
func (s *ShareSource) Reject(_ context.Context, msg *ackwise.Message) error {
	return s.settle(msg, kgo.AckReject)
}

// Nack returns an error: a share group cannot delay a redelivery
// (Capabilities.Delay is false), so the engine retries in place.
func (s *ShareSource) Nack(context.Context, *ackwise.Message, time.Duration) error {
	return errors.New("kafka: a share source cannot delay redelivery (Capabilities.Delay is false)")
}

// DeadLetter produces msg to the dead-letter topic with the envelope as
// headers, waits for the broker's confirmation, then accepts msg. Near the
// end of msg's lock it renews the lock first, so that the produce does not
// outlast it (the record would be delivered again beside its dead letter).
func (s *ShareSource) DeadLetter(ctx context.Context, msg *ackwise.Message, env dlq.Envelope) error {
	rc, err := s.receipt(msg)
	if err != nil {
		return err
	}
	if rc.settled.Load() {
		return fmt.Errorf("kafka: %s: already settled", msg.BrokerID)
	}
	now := time.Now()
	if rc.expired(now) {
		// The broker redelivers it: a dead letter now would be a second
		// copy beside the redelivered record. settle releases it.
		return s.settle(msg, kgo.AckRelease)
	}
	if rc.expiresWithin(now, s.nearExpiry()) && s.renews && !s.sendAlone(rc, kgo.AckRenew) {
		// The produce must end before the lock does, or the record is
		// released after its dead letter was written: renew it first.
		return s.settle(msg, kgo.AckRelease)
	}
	if err := produceDeadLetter(ctx, s.cl, s.limits, s.log, s.cfg.DeadLetterTopic, msg, env); err != nil {
		return fmt.Errorf("kafka: %s: dead-letter to %s: %w", msg.BrokerID, s.cfg.DeadLetterTopic, err)
	}
	return s.settle(msg, kgo.AckAccept)
}

// ExtendLease renews msg's acquisition lock (AckRenew, Kafka 4.2+; it
// fails on older brokers, see Capabilities). d is the broker's to decide.
func (s *ShareSource) ExtendLease(_ context.Context, msg *ackwise.Message, _ time.Duration) error {
	rc, err := s.receipt(msg)
	if err != nil {
		return err
	}
	if s.closed.Load() {
		// Closing released the records not settled: nothing left to renew
		// (the engine's heartbeat outlives Run for handlers still running
		// after its drain deadline, and may call this after Close).
		return fmt.Errorf("kafka: %s: source closed: %w", msg.BrokerID, adapters.ErrClosed)
	}
	if !s.renews {
		return fmt.Errorf("kafka: %s: the brokers do not renew share locks (Kafka 4.2+)", msg.BrokerID)
	}
	if rc.settled.Load() {
		return nil
	}
	if rc.expiresWithin(time.Now(), s.nearExpiry()) {
		// A renewal the broker refuses would fail the statuses sent with
		// it: near the end of the lock it goes alone, and not at all after.
		if !s.sendAlone(rc, kgo.AckRenew) {
			return fmt.Errorf("kafka: %s: acquisition lock expired at %v: %w", msg.BrokerID, rc.r.AcquisitionDeadline(), adapters.ErrReceiptInvalid)
		}
		return nil
	}
	// A settle may land between the check above and this renewal: franz-go
	// queues a renewal only over no status (Record.Ack's compare-and-swap
	// from zero), so the renewal never replaces the settle's status.
	s.ackMu.RLock()
	rc.r.Ack(kgo.AckRenew)
	rc.renewedAt.Store(time.Now().UnixNano())
	s.ackMu.RUnlock()
	select {
	case s.flushNow <- struct{}{}:
	default: // a flush is asked for already
	}
	return nil
}

// Valid reports whether msg is unsettled, the source is open and its
// acquisition lock has not run out (a renewed lock is reckoned from when the
// renewal was sent).
//
// Of these, only Close is an event the source tells (OnInvalid): msg is
// settled by the engine's own call, and a lock runs out with time (the
// engine's heartbeat renews it). A lost share session or membership is no
// event here: franz-go tells the source of neither (a share group takes no
// revoke or lost callbacks; the client rejoins on its own), so Valid cannot
// reflect one (the broker redelivers the records whose locks it dropped).
func (s *ShareSource) Valid(msg *ackwise.Message) bool {
	rc, ok := msg.Handle.(*shareReceipt)
	if !ok || rc.settled.Load() || s.closed.Load() {
		return false
	}
	return !rc.expired(time.Now())
}

// OnInvalid sets f (adapters.Invalidator), called when Close makes the
// records in flight no longer Valid: the engine hands back at once those
// waiting in place (a retry, a failed move), instead of at their timers.
func (s *ShareSource) OnInvalid(f func()) { s.invalid.OnInvalid(f) }

// Close flushes the acks sent so far and leaves the group; the broker
// releases records not settled.
func (s *ShareSource) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	// Closed under a running engine: its records waiting in place go back
	// now, and with them the MaxInFlight slots its Receive waits for, to
	// learn of the close.
	s.invalid.Invalidated()
	s.stop()
	s.renewing.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.cl.FlushAcks(ctx)
	s.cl.Close()
	s.mu.Lock()
	if s.drained != nil {
		close(s.drained)
		s.drained = nil
	}
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("kafka: flush share acks: %w", err)
	}
	return nil
}

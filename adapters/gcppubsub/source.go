package gcppubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// HeaderKey is the attribute a dead letter carries the message's ordering
// key in: DeadLetter publishes without an ordering key (a failure would
// pause the key on the dead-letter publisher), so the key travels as an
// attribute.
const HeaderKey = "ackwise-key"

// Pub/Sub's default RetryPolicy backoffs, used when a subscription's
// RetryPolicy leaves one unset.
const (
	defaultMinBackoff = 10 * time.Second
	defaultMaxBackoff = 600 * time.Second
)

// receiptGuard is how long after its receipt a delivery is first nacked.
// The client sends a "receipt" ack-deadline extension for each message it
// receives, batched every 100ms and in its own goroutine, and a nack (an
// ack deadline of zero) the same way: a nack sent first would be undone by
// the receipt, and the message held for a whole ack deadline instead of
// redelivered at once. On an exactly-once subscription the client awaits
// the receipt before delivering, and nothing waits.
const receiptGuard = 250 * time.Millisecond

// flushDelay is how long after an ack or nack Close waits before it stops
// the client: the client sends acks, nacks and receipts in batches every
// 100ms from one goroutine, which ends, dropping what it has not sent, as
// soon as the stream stops. Close waits flushDelay after the last settle
// (or put-off nack, receiptGuard), and receiptGuard after the last
// receipt, so that the nacks the client sends when it stops are not undone
// by a receipt.
const flushDelay = 200 * time.Millisecond

// closeTimeout bounds Close's wait for the client's Receive to end.
const closeTimeout = 30 * time.Second

// maxCounted bounds the deliveries whose attempts the source counts itself
// (a subscription without a dead-letter policy): past it the count starts
// over, as after a restart.
const maxCounted = 1 << 16

// Source receives from one Pub/Sub subscription through the v2 client's
// streaming pull (Subscriber.Receive), one message at a time handed to
// Receive. See the package doc for what each settle does.
type Source struct {
	cfg      Config
	client   *pubsub.Client
	sub      *pubsub.Subscriber
	dl       *pubsub.Publisher
	name     string // projects/P/subscriptions/S
	log      *slog.Logger
	caps     adapters.Capabilities
	eos      bool                   // exactly-once delivery: acks through AckWithResult
	brokerDC bool                   // dead-letter policy: Attempt from DeliveryAttempt
	subInfo  *pubsubpb.Subscription // as NewSource read it (CheckAttempts)

	deliveries chan *pubsub.Message
	cancel     context.CancelFunc
	done       chan struct{} // the client's Receive returned
	recvErr    error         // what it returned, read after done
	closing    chan struct{}
	closeOnce  sync.Once

	quiet atomic.Int64 // Unix ns from which Close may stop the client: see flushDelay

	mu      sync.Mutex
	closed  bool
	out     map[*handle]struct{} // delivered, not settled
	counted map[string]int       // message ID → failed attempts (no dead-letter policy)
}

// handle is a delivery's receipt (Message.Handle).
type handle struct {
	src    *Source
	m      *pubsub.Message
	at     time.Time // received
	warned bool      // watchHeld warned of it (under src.mu while in src.out)
}

var _ adapters.Source = (*Source)(nil)

// NewSource reads the subscription's settings (retry policy, dead-letter
// policy, message ordering, exactly-once delivery: it needs the
// pubsub.subscriptions.get permission, roles/pubsub.viewer) and starts
// receiving.
func NewSource(ctx context.Context, cfg Config) (*Source, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	client, err := newClient(ctx, cfg.Project, cfg.Endpoint, cfg.Emulator, cfg.ClientOptions)
	if err != nil {
		return nil, err
	}
	name := "projects/" + cfg.Project + "/subscriptions/" + cfg.Subscription
	ps, err := client.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: name})
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("gcppubsub: reading subscription %s (needs pubsub.subscriptions.get): %w", name, err)
	}
	if err := checkSubscription(cfg, ps, log.With("subscription", name)); err != nil {
		client.Close()
		return nil, err
	}
	s := &Source{
		cfg:        cfg,
		subInfo:    ps,
		client:     client,
		sub:        client.Subscriber(name),
		name:       name,
		log:        log.With("subscription", name),
		eos:        ps.GetEnableExactlyOnceDelivery(),
		brokerDC:   ps.GetDeadLetterPolicy() != nil,
		deliveries: make(chan *pubsub.Message),
		done:       make(chan struct{}),
		closing:    make(chan struct{}),
		out:        map[*handle]struct{}{},
		counted:    map[string]int{},
	}
	if cfg.DeadLetterTopic != "" {
		dlName, _, _ := topicName(cfg.Project, cfg.DeadLetterTopic)
		s.dl = client.Publisher(dlName)
	}
	s.caps = capabilities(ps)
	s.sub.ReceiveSettings.MaxOutstandingMessages = cfg.MaxOutstandingMessages
	s.sub.ReceiveSettings.MaxExtension = cfg.MaxExtension
	s.sub.ReceiveSettings.MaxDurationPerAckExtension = cfg.AckDeadline
	s.sub.ReceiveSettings.NumGoroutines = cfg.Streams
	// On Close the client stops its stream, then nacks every delivery it
	// holds unsettled (those the engine holds, and those not yet handed
	// to Receive) in one call of its own: the nacks cannot be delivered
	// back to this source, and do not wait for the client's batches,
	// which stop with the stream.
	s.sub.ReceiveSettings.ShutdownOptions = &pubsub.ShutdownOptions{Timeout: closeTimeout, Behavior: pubsub.ShutdownBehaviorNackImmediately}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	go s.run(rctx)
	go s.watchHeld(rctx)
	return s, nil
}

// watchHeld warns, once each, of the deliveries held unsettled past
// MaxExtension, as it happens: their handler (or retry in place) still
// runs, while the client stopped extending their ack deadline and Pub/Sub
// may deliver them again. It looks every quarter of MaxExtension (15m by
// default), until ctx ends.
func (s *Source) watchHeld(ctx context.Context) {
	t := time.NewTicker(max(s.cfg.MaxExtension/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var late []*handle
		s.mu.Lock()
		for h := range s.out {
			if !h.warned && s.expired(h) {
				h.warned = true
				late = append(late, h)
			}
		}
		s.mu.Unlock()
		for _, h := range late {
			s.warnHeld(h)
		}
	}
}

// warnHeld warns that h was held past MaxExtension.
func (s *Source) warnHeld(h *handle) {
	s.log.Warn("gcppubsub: a delivery was held past max_extension: the client stopped extending its ack deadline, so Pub/Sub may deliver it again while its handler runs, and its settle fails; raise max_extension (or handler_timeout=) above the handler's time and its retries in place", "message_id", h.m.ID, "held", time.Since(h.at).Round(time.Millisecond), "max_extension", s.cfg.MaxExtension)
}

// capabilities says what the subscription ps lets the source do.
//
//   - Delay: only with a RetryPolicy whose minimum and maximum backoff are
//     equal, a fixed delay, which is then the one delay tier (and MaxDelay):
//     an exponential backoff picks the delay from the delivery count, not
//     from what Nack asks, and without a RetryPolicy a nack is redelivered
//     at once.
//   - DeliveryCount: with a dead-letter policy, whose DeliveryAttempt Pub/Sub
//     sets on each delivery (it survives restarts); without one the source
//     counts the attempts it failed itself (lost on a restart).
//   - Ordered: with message ordering enabled on the subscription.
//   - Lease: none the engine manages; the client extends ack deadlines
//     itself up to MaxExtension.
func capabilities(ps *pubsubpb.Subscription) adapters.Capabilities {
	c := adapters.Capabilities{
		DeliveryCount: ps.GetDeadLetterPolicy() != nil,
		Ordered:       ps.GetEnableMessageOrdering(),
	}
	if rp := ps.GetRetryPolicy(); rp != nil {
		lo, hi := defaultMinBackoff, defaultMaxBackoff
		if rp.GetMinimumBackoff() != nil {
			lo = rp.GetMinimumBackoff().AsDuration()
		}
		if rp.GetMaximumBackoff() != nil {
			hi = rp.GetMaximumBackoff().AsDuration()
		}
		if lo == hi && lo > 0 {
			c.Delay, c.DelayTiers, c.MaxDelay = true, []time.Duration{lo}, lo
		}
	}
	return c
}

// run is the client's Receive loop: each message is handed to Receive, or
// nacked when the source closes first.
func (s *Source) run(ctx context.Context) {
	defer close(s.done)
	s.recvErr = s.sub.Receive(ctx, func(ctx context.Context, m *pubsub.Message) {
		// A message not handed to Receive before Close is left
		// unsettled: the client nacks it when it stops.
		s.quietAfter(time.Now().Add(receiptGuard))
		select {
		case s.deliveries <- m:
		case <-ctx.Done():
		case <-s.closing:
		}
	})
}

// Receive fills buf with the messages the client holds for it: it waits for
// one, then takes those ready without waiting.
func (s *Source) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	if len(buf) == 0 {
		return 0, nil
	}
	n := 0
	for n < len(buf) {
		var m *pubsub.Message
		if n == 0 {
			select {
			case m = <-s.deliveries:
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-s.closing:
				return 0, adapters.ErrClosed
			case <-s.done:
				if s.recvErr != nil {
					return 0, fmt.Errorf("gcppubsub: receiving from %s: %w", s.name, s.recvErr)
				}
				return 0, adapters.ErrClosed
			}
		} else {
			select {
			case m = <-s.deliveries:
			default:
				return n, nil
			}
		}
		msg := s.message(m)
		if msg == nil {
			return n, adapters.ErrClosed
		}
		buf[n] = msg
		n++
	}
	return n, nil
}

// message builds the ackwise message of m and records its delivery; nil
// once the source is closed (m is left to the client, which nacks it when
// it stops).
func (s *Source) message(m *pubsub.Message) *ackwise.Message {
	h := &handle{src: s, m: m, at: time.Now()}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.out[h] = struct{}{}
	attempt := 1 + s.counted[m.ID]
	s.mu.Unlock()
	if s.brokerDC && m.DeliveryAttempt != nil {
		attempt = max(*m.DeliveryAttempt, 1)
	}
	keys := make([]string, 0, len(m.Attributes))
	for k := range m.Attributes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	key := m.OrderingKey
	hs := make(ackwise.Headers, 0, len(keys))
	for _, k := range keys {
		if k == HeaderKey && key == "" {
			// A dead letter's ordering key (see DeadLetter): the key
			// again, so that a redrive publishes it on its key.
			key = m.Attributes[k]
			continue
		}
		hs = append(hs, ackwise.Header{Key: k, Value: m.Attributes[k]})
	}
	return &ackwise.Message{
		ID:          m.Attributes[ackwise.HeaderEventID],
		Key:         key,
		Payload:     m.Data,
		Headers:     hs,
		Source:      s.name,
		Partition:   -1,
		Offset:      -1,
		BrokerID:    m.ID,
		Attempt:     attempt,
		PublishedAt: m.PublishTime,
		Handle:      h,
	}
}

var errSettled = errors.New("gcppubsub: delivery already settled")

// take claims msg's delivery for a settle: it fails for a message this
// source did not deliver, one settled before, and after Close.
func (s *Source) take(msg *ackwise.Message) (*handle, error) {
	h, ok := msg.Handle.(*handle)
	if !ok || h.src != s {
		return nil, errors.New("gcppubsub: message not delivered by this source")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("gcppubsub: settle after Close (the delivery was handed back): %w", adapters.ErrClosed)
	}
	if _, ok := s.out[h]; !ok {
		return nil, errSettled
	}
	delete(s.out, h)
	return h, nil
}

// giveBack returns a delivery whose settle failed before it acted (a dead
// letter not confirmed) to the unsettled ones; after Close it leaves it to
// the client, which nacks what it holds when it stops.
func (s *Source) giveBack(h *handle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.out[h] = struct{}{}
	}
}

// count records a failed attempt of m (no dead-letter policy) or forgets
// it (done).
func (s *Source) count(m *pubsub.Message, failed bool) {
	if s.brokerDC {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !failed {
		delete(s.counted, m.ID)
		return
	}
	if len(s.counted) >= maxCounted {
		clear(s.counted)
	}
	s.counted[m.ID]++
}

// expired reports whether h was held past MaxExtension, after which the
// client stopped extending its ack deadline.
func (s *Source) expired(h *handle) bool {
	return time.Since(h.at) > s.cfg.MaxExtension
}

// Ack acks msg: on an exactly-once subscription through AckWithResult,
// awaited; a failed result means Pub/Sub may deliver the message again,
// and Ack returns an error wrapping adapters.ErrReceiptInvalid.
func (s *Source) Ack(ctx context.Context, msg *ackwise.Message) error {
	h, err := s.take(msg)
	if err != nil {
		return err
	}
	s.count(h.m, false)
	return s.ack(ctx, h)
}

func (s *Source) ack(ctx context.Context, h *handle) error {
	late := s.expired(h)
	if late && !h.warned {
		s.warnHeld(h)
	}
	if !s.eos {
		h.m.Ack()
		s.quietAfter(time.Now().Add(flushDelay))
		if late {
			return fmt.Errorf("gcppubsub: ack of %s after max_extension (%v): it may be redelivered: %w", h.m.ID, s.cfg.MaxExtension, adapters.ErrReceiptInvalid)
		}
		return nil
	}
	st, err := h.m.AckWithResult().Get(ctx)
	if err != nil || st != pubsub.AcknowledgeStatusSuccess {
		s.log.Warn("gcppubsub: an exactly-once ack failed: the message may be delivered again", "message_id", h.m.ID, "status", st, "error", err)
		return fmt.Errorf("gcppubsub: ack of %s not confirmed (status %d: %v): it may be redelivered: %w", h.m.ID, st, err, adapters.ErrReceiptInvalid)
	}
	return nil
}

// Nack nacks msg, for redelivery after the subscription's fixed retry
// backoff (Capabilities.DelayTiers): a delay up to it waits that long, a
// longer one is cut to it. Without Capabilities.Delay it returns an error
// and settles nothing.
func (s *Source) Nack(ctx context.Context, msg *ackwise.Message, delay time.Duration) error {
	if !s.caps.Delay {
		return fmt.Errorf("gcppubsub: subscription %s cannot delay a redelivery (no retry policy with a fixed backoff): the consumer retries in place", s.name)
	}
	h, err := s.take(msg)
	if err != nil {
		return err
	}
	s.count(h.m, true)
	s.nack(h)
	return nil
}

// Release nacks msg, for redelivery as soon as the subscription's retry
// policy allows; it is not counted as an attempt.
func (s *Source) Release(ctx context.Context, msg *ackwise.Message) error {
	h, err := s.take(msg)
	if err != nil {
		return err
	}
	s.nack(h)
	return nil
}

// nack nacks h's message once receiptGuard passed since its receipt.
func (s *Source) nack(h *handle) {
	wait := receiptGuard - time.Since(h.at)
	if s.eos || wait <= 0 {
		wait = 0
		h.m.Nack()
	} else {
		time.AfterFunc(wait, h.m.Nack)
	}
	s.quietAfter(time.Now().Add(wait + flushDelay))
}

// quietAfter makes Close wait until t before it stops the client.
func (s *Source) quietAfter(t time.Time) {
	for {
		q := s.quiet.Load()
		if t.UnixNano() <= q || s.quiet.CompareAndSwap(q, t.UnixNano()) {
			return
		}
	}
}

// DeadLetter publishes msg to the dead-letter topic, its data unchanged and
// its attributes with env added (dlq.Envelope.Apply: credentials left out),
// the ordering key as attribute ackwise-key; once Pub/Sub confirmed the
// publish, it acks msg. A publish not confirmed leaves msg unsettled.
func (s *Source) DeadLetter(ctx context.Context, msg *ackwise.Message, env dlq.Envelope) error {
	if s.dl == nil {
		// Broker-managed: the engine hands the message back (Release),
		// and Pub/Sub counts the delivery towards its dead-letter policy.
		return fmt.Errorf("gcppubsub: no dead-letter topic (dead_letter_topic=): message %s is handed back for the subscription's dead-letter policy, if any, to forward: %w", msg.BrokerID, errors.ErrUnsupported)
	}
	h, err := s.take(msg)
	if err != nil {
		return err
	}
	hs := env.Apply(msg.Headers.Clone())
	attrs := make(map[string]string, len(hs)+1)
	for _, kv := range hs {
		attrs[kv.Key] = kv.Value
	}
	if msg.Key != "" {
		attrs[HeaderKey] = msg.Key
	}
	if _, err := s.dl.Publish(ctx, &pubsub.Message{Data: h.m.Data, Attributes: attrs}).Get(ctx); err != nil {
		s.giveBack(h)
		return fmt.Errorf("gcppubsub: dead letter of %s to %s not confirmed: %w", h.m.ID, s.dl, err)
	}
	s.count(h.m, false)
	return s.ack(ctx, h)
}

// ExtendLease does nothing: the client extends ack deadlines itself, up
// to MaxExtension (Capabilities.ExtendLease is false).
func (s *Source) ExtendLease(context.Context, *ackwise.Message, time.Duration) error { return nil }

// Valid reports whether msg is unsettled, the source open, and msg held for
// less than MaxExtension.
func (s *Source) Valid(msg *ackwise.Message) bool {
	h, ok := msg.Handle.(*handle)
	if !ok || h.src != s || s.expired(h) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok = s.out[h]
	return ok && !s.closed
}

// Capabilities returns what the subscription allows (read at start); see
// the package doc.
func (s *Source) Capabilities() adapters.Capabilities {
	c := s.caps
	c.DelayTiers = slices.Clone(c.DelayTiers)
	return c
}

// Extensions declares none.
func (s *Source) Extensions() adapters.Extensions {
	return adapters.Extensions{AttemptsChecker: s}
}

// CheckAttempts checks the consumer's max attempts (consumer.New gives
// them, adapters.AttemptsChecker) against the subscription's dead-letter
// policy, as NewSource checked Config.Retry: an error naming both where
// they disagree.
func (s *Source) CheckAttempts(maxAttempts int) error {
	m, policy := maxDeliveryAttempts(s.subInfo)
	return checkAttempts(s.subInfo, s.cfg.DeadLetterTopic, maxAttempts, m, policy, "the consumer's Retry.MaxAttempts")
}

// Close stops receiving, nacks the deliveries not settled (for redelivery
// to another consumer), waits for the client's Receive to end and closes
// the client. Settles after it fail.
func (s *Source) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.out = nil // left unsettled: the client nacks them when it stops
		s.mu.Unlock()
		close(s.closing)
		time.Sleep(time.Until(time.Unix(0, s.quiet.Load())))
		s.cancel()
		var recvErr error
		select {
		case <-s.done:
			recvErr = s.recvErr
		case <-time.After(closeTimeout):
			s.log.Warn("gcppubsub: the client's Receive did not end in time on Close: the last acks and nacks may be lost (their messages are delivered again after their ack deadline)", "timeout", closeTimeout)
		}
		if s.dl != nil {
			s.dl.Stop()
		}
		err = s.client.Close()
		if recvErr != nil && !errors.Is(recvErr, context.Canceled) {
			err = errors.Join(fmt.Errorf("gcppubsub: receiving from %s: %w", s.name, recvErr), err)
		}
	})
	return err
}

package sqs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// Defaults and limits of a Source.
const (
	// DefaultWaitTime is the long-poll wait of a receive (SQS's longest).
	DefaultWaitTime = 20 * time.Second
	// DefaultAckLinger is how long an ack waits for others to share its
	// DeleteMessageBatch call.
	DefaultAckLinger = 5 * time.Millisecond
	// MaxVisibility is SQS's longest visibility timeout, and the longest a
	// message stays invisible from the receive that delivered it: a lease
	// extension or a Nack delay is cut to what is left of it.
	MaxVisibility = 12 * time.Hour
	// shortPollPause is the pause between two short polls that found
	// nothing: SQS answers a short poll at once.
	shortPollPause = 50 * time.Millisecond
	// maxBatch is SQS's limit of entries in one batch call and of messages
	// in one receive.
	maxBatch = 10
)

// Config configures a Source.
type Config struct {
	// QueueURL is the queue to consume
	// (https://sqs.us-east-2.amazonaws.com/123456789012/orders). Required.
	QueueURL string
	// DeadLetterQueueURL is the queue DeadLetter sends dead letters to
	// (ackwise-managed dead letters). Empty: DeadLetter fails with an error
	// wrapping errors.ErrUnsupported, and the message comes back after its
	// visibility timeout (a RedrivePolicy on the queue may move it).
	// Refused with DeadLetters = DeadLetterBroker.
	DeadLetterQueueURL string
	// DeadLetters says who moves a message the consumer gave up on:
	// DeadLetterAckwise ("" means it) sends it to DeadLetterQueueURL with
	// the envelope; DeadLetterBroker leaves it to the queue's
	// RedrivePolicy, which NewSource reads and checks against MaxAttempts
	// (see the package doc for what each keeps).
	DeadLetters DeadLetterMode
	// MaxAttempts is the consumer's retry.Policy.MaxAttempts (0 means
	// retry.DefaultMaxAttempts, as there). With DeadLetterBroker NewSource
	// refuses a queue whose RedrivePolicy's maxReceiveCount differs (or
	// that has none); with DeadLetterAckwise it warns when the queue's
	// RedrivePolicy would move messages before the consumer gives up.
	MaxAttempts int
	// Connection says how to reach SQS (region, endpoint, TLS).
	Connection
	// WaitTime is the long-poll wait of a receive, whole seconds from 1s to
	// 20s. Zero means DefaultWaitTime; -1 means short polling (a receive
	// returns at once, and Receive calls again after shortPollPause while
	// none come).
	WaitTime time.Duration
	// VisibilityTimeout is the lease each receive asks for, whole seconds
	// from 1s to 12h. Zero means the queue's own VisibilityTimeout, read
	// when the source opens (a queue whose timeout is 0 is refused).
	VisibilityTimeout time.Duration
	// AckLinger is how long an ack waits for others to share its
	// DeleteMessageBatch call (up to 10 share one), and a Nack or lease
	// extension for others to share its ChangeMessageVisibilityBatch call.
	// Zero means DefaultAckLinger; -1 means no wait (calls waiting together
	// still share a batch).
	AckLinger time.Duration
	// Pollers is how many ReceiveMessage calls (long polls of up to 10
	// messages each) the source keeps under way at once, from 1 to
	// MaxPollers. Zero means DefaultPollers. They are bounded by the
	// engine's in-flight window: all together ask for no more messages
	// than the latest Receive had room for, less those received and not
	// handed over yet, so a window of fewer than 10×Pollers runs fewer.
	Pollers int
	// Logger receives warnings (no dead-letter queue, a dead letter cut to
	// fit its queue); nil discards them.
	Logger *slog.Logger
}

func (c Config) validate() error {
	if err := checkQueueURL("Config.QueueURL", c.QueueURL); err != nil {
		return err
	}
	if c.DeadLetterQueueURL != "" {
		if err := checkQueueURL("Config.DeadLetterQueueURL", c.DeadLetterQueueURL); err != nil {
			return err
		}
		if c.DeadLetterQueueURL == c.QueueURL {
			return errors.New("sqs: Config.DeadLetterQueueURL is the queue itself")
		}
	}
	switch w := c.WaitTime; {
	case w == 0 || w == -1:
	case w < time.Second || w > DefaultWaitTime || w%time.Second != 0:
		return fmt.Errorf("sqs: Config.WaitTime = %v: want whole seconds from 1s to 20s, 0 (default %v) or -1 (short polling)", w, DefaultWaitTime)
	}
	if v := c.VisibilityTimeout; v != 0 && (v < time.Second || v > MaxVisibility || v%time.Second != 0) {
		return fmt.Errorf("sqs: Config.VisibilityTimeout = %v: want whole seconds from 1s to 12h, or 0 (the queue's)", v)
	}
	if err := c.validateDeadLetters(); err != nil {
		return err
	}
	if c.Pollers < 0 || c.Pollers > MaxPollers {
		return fmt.Errorf("sqs: Config.Pollers = %d: want 1 to %d, or 0 (default %d)", c.Pollers, MaxPollers, DefaultPollers)
	}
	if c.AckLinger < -1 {
		return fmt.Errorf("sqs: Config.AckLinger = %v: want ≥ 0 (0: default %v) or -1 (none)", c.AckLinger, DefaultAckLinger)
	}
	return nil
}

// Source consumes one SQS queue. See the package doc for what it does
// with each settle.
type Source struct {
	client   *sqs.Client
	queueURL string
	name     string
	dlqURL   string
	dlqFIFO  bool
	dlqMax   int // the dead-letter queue's MaximumMessageSize
	fifo     bool
	lease    time.Duration
	margin   time.Duration
	wait     int32
	log      *slog.Logger
	epoch    time.Time

	stop    context.Context // done once Close began
	cancel  context.CancelFunc
	closed  atomic.Bool
	once    sync.Once
	polls   *pollers // ReceiveMessage
	acks    *batcher // DeleteMessageBatch
	vis     *batcher // ChangeMessageVisibilityBatch
	invalid adapters.InvalidHook

	// brokerDL: broker-managed dead letters, to brokerDLQ (a queue name).
	brokerDL  bool
	brokerDLQ string
	// maxReceives is the RedrivePolicy's maxReceiveCount, 0 without one
	// (CheckAttempts).
	maxReceives int
}

var (
	_ adapters.Source = (*Source)(nil)
	_ dlq.Backlogger  = (*Source)(nil)
)

// NewSource opens a source on cfg.QueueURL. It reads the queue's
// visibility timeout (the lease) and checks that the dead-letter queue, if
// any, exists.
func NewSource(ctx context.Context, cfg Config) (*Source, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	client, err := cfg.Connection.newClient(ctx, cfg.QueueURL)
	if err != nil {
		return nil, err
	}
	s := &Source{
		client:   client,
		queueURL: cfg.QueueURL,
		name:     queueName(cfg.QueueURL),
		dlqURL:   cfg.DeadLetterQueueURL,
		dlqFIFO:  isFIFO(cfg.DeadLetterQueueURL),
		fifo:     isFIFO(cfg.QueueURL),
		lease:    cfg.VisibilityTimeout,
		log:      cfg.Logger,
		epoch:    time.Now(),
	}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	switch cfg.WaitTime {
	case 0:
		s.wait = int32(DefaultWaitTime / time.Second)
	case -1:
	default:
		s.wait = int32(cfg.WaitTime / time.Second)
	}
	out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(s.queueURL),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameVisibilityTimeout, types.QueueAttributeNameRedrivePolicy, types.QueueAttributeNameMessageRetentionPeriod},
	})
	if err != nil {
		return nil, fmt.Errorf("sqs: read the attributes of queue %s: %w", s.name, err)
	}
	if s.lease == 0 {
		secs, err := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameVisibilityTimeout)])
		if err != nil || secs <= 0 {
			return nil, fmt.Errorf("sqs: queue %s has VisibilityTimeout %q: a source needs a lease of at least 1s (set Config.VisibilityTimeout, URL parameter visibility)", s.name, out.Attributes[string(types.QueueAttributeNameVisibilityTimeout)])
		}
		s.lease = time.Duration(min(secs, int(MaxVisibility/time.Second))) * time.Second
	}
	s.margin = min(s.lease/10, time.Second)
	if s.dlqURL != "" {
		if s.dlqMax, err = maxSize(ctx, client, s.dlqURL); err != nil {
			return nil, fmt.Errorf("sqs: dead-letter queue: %w", err)
		}
	}
	if err := s.checkDeadLetters(ctx, cfg, out.Attributes); err != nil {
		return nil, err
	}
	linger := cfg.AckLinger
	switch linger {
	case 0:
		linger = DefaultAckLinger
	case -1:
		linger = 0
	}
	s.stop, s.cancel = context.WithCancel(context.Background())
	pollers := cfg.Pollers
	if pollers == 0 {
		pollers = DefaultPollers
	}
	s.polls = newPollers(s, pollers)
	s.acks = newDeleter(s, linger)
	s.vis = newVisibility(s, linger)
	return s, nil
}

// now is the time since the source opened, on the monotonic clock.
func (s *Source) now() time.Duration { return time.Since(s.epoch) }

// Receive hands over up to len(buf) messages, waiting until there is at
// least one. Config.Pollers ReceiveMessage calls run at once (long polling,
// up to 10 messages each, every message attribute and system attribute,
// the lease as the visibility timeout), and keep running between two
// Receive calls, asking for no more than len(buf) messages in all, less
// those handed over since. When ctx ends no new one starts, and the
// messages received but not handed over go back to the queue at once
// (ChangeMessageVisibilityBatch to 0), as do those the polls under way
// still bring (they run to their end; Close cancels them).
func (s *Source) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	if len(buf) == 0 {
		return 0, nil
	}
	return s.polls.receive(ctx, buf)
}

// message builds the Message of a received m.
func (s *Source) message(m types.Message, arrived time.Duration) *ackwise.Message {
	h, key, enc := decodeAttributes(m.MessageAttributes)
	if key == "" && s.fifo {
		key = m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
	}
	body := aws.ToString(m.Body)
	attempt := 1
	if n, err := strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]); err == nil {
		attempt = min(max(n, 1), ackwise.MaxAttempt)
	}
	var published time.Time
	if ms, err := strconv.ParseInt(m.Attributes[string(types.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil {
		published = time.UnixMilli(ms)
	}
	// SQS does not say when an attempt failed: on a redelivery, the first
	// receive is when the first attempt began, the closest bound it keeps.
	var first time.Time
	if ms, err := strconv.ParseInt(m.Attributes[string(types.MessageSystemAttributeNameApproximateFirstReceiveTimestamp)], 10, 64); err == nil && attempt > 1 {
		first = time.UnixMilli(ms)
	}
	id := h.Get(ackwise.HeaderEventID)
	if id == "" {
		id = aws.ToString(m.MessageId)
	}
	r := &receipt{s: s, handle: aws.ToString(m.ReceiptHandle), body: body, enc: enc, received: arrived}
	r.deadline.Store(int64(arrived + s.lease - s.margin))
	return &ackwise.Message{
		ID:           id,
		Key:          key,
		Payload:      decodeBody(body, enc),
		Headers:      h,
		Source:       s.name,
		Partition:    -1,
		Offset:       -1,
		BrokerID:     aws.ToString(m.MessageId),
		Attempt:      attempt,
		PublishedAt:  published,
		FirstFailure: first,
		Handle:       r,
	}
}

// Receipt states.
const (
	open    uint32 = iota
	busy           // a settle call is under way
	settled        // settled, released, or known invalid
)

// receipt is a delivery's Handle.
type receipt struct {
	s        *Source
	handle   string
	body     string // as received, for a dead letter
	enc      string // its AttrBodyEncoding
	received time.Duration
	state    atomic.Uint32
	deadline atomic.Int64 // Source.now() when the lease ends, less a margin
	// mu orders a lease extension and the settles: a settle waits for an
	// extension under way, and an extension after a settle does nothing.
	mu sync.Mutex
}

func (s *Source) receipt(msg *ackwise.Message) (*receipt, error) {
	r, ok := msg.Handle.(*receipt)
	if !ok || r.s != s {
		return nil, fmt.Errorf("sqs: message %q was not delivered by this source", msg.BrokerID)
	}
	return r, nil
}

// begin starts settling msg with op, or says why it cannot: settled
// already, the source closed, the lease ran out.
func (s *Source) begin(msg *ackwise.Message, op string) (*receipt, error) {
	r, err := s.receipt(msg)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.state.CompareAndSwap(open, busy) {
		return nil, fmt.Errorf("sqs: %s message %s: already settled or released", op, msg.BrokerID)
	}
	switch {
	case s.closed.Load():
		r.state.Store(settled)
		return nil, fmt.Errorf("sqs: %s message %s: %w; the queue redelivers it: %w", op, msg.BrokerID, adapters.ErrClosed, adapters.ErrReceiptInvalid)
	case s.now() >= time.Duration(r.deadline.Load()):
		r.state.Store(settled)
		return nil, fmt.Errorf("sqs: %s message %s: its visibility timeout ran out, the queue redelivers it: %w", op, msg.BrokerID, adapters.ErrReceiptInvalid)
	}
	return r, nil
}

// end ends the settle begin started: settled unless it failed otherwise
// than for a receipt no longer valid, when the receipt is open again for
// the engine to try again (a move) or release it.
func (r *receipt) end(err error) error {
	if err != nil && !errors.Is(err, adapters.ErrReceiptInvalid) {
		r.state.Store(open)
		return err
	}
	r.state.Store(settled)
	return err
}

// settleErr maps the error of a call on one receipt.
func (s *Source) settleErr(op string, msg *ackwise.Message, err error) error {
	if err == nil {
		return nil
	}
	if code := errorCode(err); receiptGone(code) {
		return fmt.Errorf("sqs: %s message %s: %s, the queue redelivers it: %w", op, msg.BrokerID, code, adapters.ErrReceiptInvalid)
	}
	return fmt.Errorf("sqs: %s message %s on %s: %w", op, msg.BrokerID, s.name, err)
}

// Ack deletes msg (DeleteMessageBatch, shared with up to 9 other acks
// within AckLinger) and returns once SQS confirmed it. A receipt whose
// visibility timeout ran out (by the source's clock, or as SQS says) is
// not deleted: Ack returns an error wrapping adapters.ErrReceiptInvalid
// and the queue redelivers the message.
func (s *Source) Ack(ctx context.Context, msg *ackwise.Message) error {
	r, err := s.begin(msg, "ack")
	if err != nil {
		return err
	}
	return r.end(s.acks.do(ctx, "ack", msg, r, 0))
}

// AckBatch acks msgs as Ack does, sharing DeleteMessageBatch calls
// (adapters.BatchAcker).
func (s *Source) AckBatch(ctx context.Context, msgs []*ackwise.Message, errs []error) {
	reqs := make([]*batchReq, len(msgs))
	for i, m := range msgs {
		r, err := s.begin(m, "ack")
		if err != nil {
			errs[i] = err
			continue
		}
		reqs[i] = s.acks.add("ack", m, r, 0)
	}
	for i, req := range reqs {
		if req != nil {
			errs[i] = req.r.end(s.acks.wait(ctx, req))
		}
	}
}

// Nack makes msg visible again after delay (ChangeMessageVisibilityBatch,
// shared with other Nacks and lease extensions within AckLinger),
// rounded up to whole seconds and cut to what is left of MaxVisibility
// since the receive that delivered it: at the cap the message comes back
// sooner than asked, with its receive count one higher.
func (s *Source) Nack(ctx context.Context, msg *ackwise.Message, delay time.Duration) error {
	r, err := s.begin(msg, "nack")
	if err != nil {
		return err
	}
	return r.end(s.vis.do(ctx, "nack", msg, r, r.visibility(delay)))
}

// Release makes msg visible again at once (ChangeMessageVisibility to 0).
func (s *Source) Release(ctx context.Context, msg *ackwise.Message) error {
	r, err := s.begin(msg, "release")
	if err != nil {
		return err
	}
	// Alone, not batched: a release is rare (a shutdown, a receipt no
	// longer valid) and the sooner it is made the sooner the message comes
	// back; and a FIFO lane's releases, made one after the other, reach SQS
	// in that order.
	_, err = s.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(s.queueURL), ReceiptHandle: aws.String(r.handle), VisibilityTimeout: 0,
	})
	return r.end(s.settleErr("release", msg, err))
}

// visibility is d in whole seconds, rounded up, cut to what is left of
// MaxVisibility since r was received (rounded down).
func (r *receipt) visibility(d time.Duration) int32 {
	// SQS counts the 12 hours from when it handed the message out, a
	// little before the response came: leave the lease's margin, and
	// round down there.
	left := (MaxVisibility - (r.s.now() - r.received) - r.s.margin) / time.Second
	secs := (max(d, 0) + time.Second - 1) / time.Second
	return int32(max(min(secs, left), 0))
}

// ExtendLease sets msg's visibility timeout to d from now
// (ChangeMessageVisibility), in whole seconds, cut to what is left of
// MaxVisibility since its receive; with nothing left it returns an error
// and the message comes back when its lease ends. After a settle, on a
// closed source or once the lease ran out it does nothing and returns an
// error wrapping adapters.ErrReceiptInvalid.
func (s *Source) ExtendLease(ctx context.Context, msg *ackwise.Message, d time.Duration) error {
	r, err := s.receipt(msg)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	start := s.now()
	if r.state.Load() != open || s.closed.Load() || start >= time.Duration(r.deadline.Load()) {
		return fmt.Errorf("sqs: extend the lease of message %s: settled, closed or run out: %w", msg.BrokerID, adapters.ErrReceiptInvalid)
	}
	secs := r.visibility(d)
	if secs <= 0 {
		return fmt.Errorf("sqs: extend the lease of message %s: SQS keeps a message invisible at most %v from its receive", msg.BrokerID, MaxVisibility)
	}
	if err := s.vis.do(ctx, "extend the lease of", msg, r, secs); err != nil {
		if errors.Is(err, adapters.ErrReceiptInvalid) {
			r.state.Store(settled)
		}
		return err
	}
	r.deadline.Store(int64(start + time.Duration(secs)*time.Second - s.margin))
	return nil
}

// Valid reports whether msg is still this consumer's: not settled, the
// source open, and its lease (by the source's clock, from the receive that
// delivered it, less a margin of a tenth of the lease up to 1s) not run
// out.
func (s *Source) Valid(msg *ackwise.Message) bool {
	r, ok := msg.Handle.(*receipt)
	return ok && r.s == s && !s.closed.Load() && r.state.Load() == open && s.now() < time.Duration(r.deadline.Load())
}

// backlogAttributes are the counts Backlog adds up: the messages available,
// those in flight (received, not yet deleted, their visibility timeout
// running) and those delayed.
var backlogAttributes = []types.QueueAttributeName{
	types.QueueAttributeNameApproximateNumberOfMessages,
	types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
	types.QueueAttributeNameApproximateNumberOfMessagesDelayed,
}

// Backlog returns how many messages the queue holds by SQS's count
// (dlq.Backlogger): GetQueueAttributes' ApproximateNumberOfMessages (those
// available) plus ApproximateNumberOfMessagesNotVisible (in flight: taken
// by a consumer, or left invisible by a cancelled receive or an
// interrupted dlq run, until their visibility timeout ends) plus
// ApproximateNumberOfMessagesDelayed. Every message the queue holds is
// counted, so that a dead-letter queue whose messages are all in flight
// does not read as empty; dlq.Redrive then receives fewer than that and
// ends idle rather than at the count, as the Backlogger contract allows.
// The counts are approximate: SQS may answer from a moment ago (on AWS, up
// to about a minute behind); a count below the truth ends a redrive run
// early and leaves the rest for the next run. It asks SQS each call (it
// holds no count of its own, so it answers after Receive too), and a
// queue that does not exist is an error, never 0.
func (s *Source) Backlog(ctx context.Context) (int, error) {
	out, err := s.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(s.queueURL),
		AttributeNames: backlogAttributes,
	})
	if _, gone := errors.AsType[*types.QueueDoesNotExist](err); gone {
		return 0, fmt.Errorf("sqs: backlog of queue %s: the queue does not exist: %w", s.name, err)
	}
	if err != nil {
		return 0, fmt.Errorf("sqs: backlog of queue %s: %w", s.name, err)
	}
	n := 0
	for _, a := range backlogAttributes {
		v, ok := out.Attributes[string(a)]
		c, err := strconv.Atoi(v)
		if !ok || err != nil || c < 0 {
			return 0, fmt.Errorf("sqs: backlog of queue %s: SQS answered %s = %q, want a count", s.name, a, v)
		}
		n += c
	}
	return n, nil
}

// Capabilities: DeliveryCount (ApproximateReceiveCount), Lease (the
// visibility timeout), ExtendLease, Delay up to MaxVisibility; Ordered on
// a FIFO queue; BrokerDeadLetters with Config.DeadLetters =
// DeadLetterBroker.
func (s *Source) Capabilities() adapters.Capabilities {
	return adapters.Capabilities{
		Delay:         true,
		MaxDelay:      MaxVisibility,
		Lease:         s.lease,
		ExtendLease:   true,
		DeliveryCount: true,
		Ordered:       s.fifo,

		BrokerDeadLetters: s.brokerDL,
	}
}

// Extensions declares AckBatch and the Invalidator, which Close calls:
// the lease running out is time, not an event.
func (s *Source) Extensions() adapters.Extensions {
	return adapters.Extensions{BatchAcker: s, Invalidator: s, AttemptsChecker: s}
}

// OnInvalid sets f, which Close calls once every delivery stopped being
// Valid (adapters.Invalidator).
func (s *Source) OnInvalid(f func()) { s.invalid.OnInvalid(f) }

// Close stops receiving (a Receive under way returns adapters.ErrClosed),
// cancels the polls under way, hands back the messages received and not
// handed over (visibility 0), and waits for the deletes of acks already
// made. Unsettled deliveries
// come back when their visibility timeout ends.
func (s *Source) Close() error {
	s.once.Do(func() {
		s.closed.Store(true)
		s.cancel()
		s.polls.close()
		s.invalid.Invalidated()
		s.acks.close()
		s.vis.close()
	})
	return nil
}

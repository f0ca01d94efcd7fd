package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// Source consumes a topic (and its retry topics) as a member of a consumer
// group and commits settled offsets only. See the package documentation for
// its guarantees.
//
// Receive must be called from one goroutine at a time; Ack, Nack,
// DeadLetter, Release, ExtendLease and Valid may be called concurrently from
// many.
type Source struct {
	cfg     SourceConfig
	cl      *kgo.Client
	log     *slog.Logger
	retries map[string]time.Duration // retry topic -> tier
	caps    adapters.Capabilities
	limits  *batchLimits // of the retry and dead-letter topics

	mu      sync.Mutex
	parts   map[topicPartition]*partition
	pending []pendingRun // polled, not yet delivered, under mu
	pendIdx int
	queued  int    // records in pending[pendIdx:], under mu
	last    int    // records of the last poll that had some, under mu
	polls   uint64 // polls started, under mu (see partition.rewoundAt)
	pollsIn uint64 // polls whose records were stashed, under mu (see partition.rewoundFrom)

	// Message building, by the goroutine calling Receive and without mu:
	// records to deliver are picked under mu, their messages built after.
	build []toBuild
	strs  []byte           // append-only chunk the messages' strings are carved from
	slab  []delivery       // new deliveries are carved from it
	hslab []ackwise.Header // headers beyond a delivery's own room
	local []*delivery      // recycled deliveries taken from freed

	freeMu sync.Mutex
	freed  []*delivery // recycled deliveries, under freeMu

	closed  atomic.Bool
	closing chan struct{}

	commitMu sync.Mutex // serializes commits: periodic, on revoke, on close
	// rewindMu serializes rewinds of partitions to released records, and
	// the group callbacks' changes of a partition's ownership with them
	// (taken before mu): a rewind's SetOffsets lands while the partition it
	// checked is still owned, never on its next assignment.
	rewindMu sync.Mutex
	kick     chan struct{}
	stop     chan struct{}
	done     chan struct{}
	closeMu  sync.Mutex
	closeErr error

	// invalid tells the engine when records stop being Valid: a
	// revoke, a loss of partitions (adapters.Invalidator).
	invalid adapters.InvalidHook

	// Test hooks, nil outside tests: a rewind checked ownership and calls
	// SetOffsets next; onRevoked was entered; a commit read its offsets and
	// sends them next.
	testRewindChecked, testRevoking, testCommitting func()
}

type topicPartition struct {
	topic string
	id    int32
}

type heldRecord struct {
	rec *kgo.Record
	seq int64
	due time.Time
}

// receipt is a Message's Handle: where the record sits in its partition's
// tracking.
// Where the record first sat (it differs on retry topics) is the message's
// Source, Partition and Offset.
type receipt struct {
	p   *partition
	seq int64     // recycled once the message is recycled
	gen uint16    // delivery generation of the record (see partition.redeliver)
	d   *delivery // the delivery holding this receipt, for Recycle
}

// recycled is the seq of a recycled message's receipt.
const recycled = -1

// delivery puts a message, its receipt and room for its headers in one
// allocation. Deliveries are carved from slabs and reused once the engine
// recycles their message (see Recycle).
type delivery struct {
	msg      ackwise.Message
	rc       receipt
	hdrs     [4]ackwise.Header
	detached bool // msg.Payload is a copy (Detach)
}

var (
	_ adapters.Source      = (*Source)(nil)
	_ adapters.Recycler    = (*Source)(nil)
	_ adapters.BatchAcker  = (*Source)(nil)
	_ adapters.Detacher    = (*Source)(nil)
	_ adapters.Invalidator = (*Source)(nil)
	_ dlq.Backlogger       = (*Source)(nil)
)

// NewSource joins cfg.Group on cfg.Topic (and its retry topics, when
// cfg.RetryTiers are set) and returns once a broker answered. It fails when
// the config is invalid (the error names the field and value) or no broker
// can be reached before ctx is done.
func NewSource(ctx context.Context, cfg SourceConfig) (*Source, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := refuseCommitOptions(cfg.optionsName("SourceConfig"), cfg.Options, true); err != nil {
		return nil, err
	}
	s := &Source{
		cfg:     cfg,
		log:     cfg.Logger,
		retries: make(map[string]time.Duration, len(cfg.RetryTiers)),
		parts:   make(map[topicPartition]*partition),
		closing: make(chan struct{}),
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	topics := []string{cfg.Topic}
	for _, t := range cfg.RetryTiers {
		name := cfg.RetryTopic(cfg.Topic, t)
		s.retries[name] = t
		topics = append(topics, name)
	}
	s.caps = adapters.Capabilities{
		Log:        true,
		Ordered:    true,
		Delay:      len(cfg.RetryTiers) > 0,
		DelayTiers: append([]time.Duration(nil), cfg.RetryTiers...),
	}
	if n := len(cfg.RetryTiers); n > 0 {
		s.caps.MaxDelay = cfg.RetryTiers[n-1]
	}
	limits := new(batchLimits) // of the retry and dead-letter topics
	s.limits = limits
	opts := append(cfg.consume(nil).opts(),
		limits.opt(),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(topics...),
		kgo.DisableAutoCommit(),
		// Partitions with no commit start at the beginning, also with
		// StartOffset "latest": that applies to the main topic only (see
		// below). A retry partition with no commit yet holds retries this
		// group moved there, with the source offsets committed past them:
		// starting it at its end would lose them.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.OnPartitionsAssigned(s.onAssigned),
		kgo.OnPartitionsRevoked(s.onRevoked),
		kgo.OnPartitionsLost(s.onLost),
		kgo.BlockRebalanceOnPoll(), // see poll
	)
	opts = append(opts, cfg.groupOpts()...)
	if cfg.StartOffset == "latest" {
		main := cfg.Topic
		opts = append(opts, kgo.AdjustFetchOffsetsFn(func(_ context.Context, offs map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
			for p, o := range offs[main] {
				if o.EpochOffset().Offset < 0 { // no commit: the reset offset
					offs[main][p] = kgo.NewOffset().AtEnd()
				}
			}
			return offs, nil
		}))
	}
	if len(cfg.RetryTiers) > 0 {
		// A resumed retry partition joins the next fetch only after the
		// fetch in flight returns, which waits up to FetchMaxWait (5s by
		// default) when nothing is new: bound that wait by half the
		// shortest tier.
		opts = append(opts, kgo.FetchMaxWait(min(max(cfg.RetryTiers[0]/2, 100*time.Millisecond), 5*time.Second)))
	}
	opts = append(opts, cfg.Options...)
	opts = append(opts, cfg.testOptions...)
	// A revoke that waits for handlers as long as the rebalance timeout
	// (SourceConfig.Options may set it) gets the member evicted: its final
	// commit is refused and what was settled meanwhile is redelivered.
	revokeFits := func(cl *kgo.Client) error {
		if rt, ok := cl.OptValue(kgo.RebalanceTimeout).(time.Duration); ok && cfg.RevokeTimeout >= rt {
			return fmt.Errorf("kafka: SourceConfig.RevokeTimeout = %v (revoke_timeout in a URL): must be below the group's rebalance timeout %v (SourceConfig.RebalanceTimeout, rebalance_timeout in a URL, or kgo.RebalanceTimeout), or a slow handler gets the member evicted", cfg.RevokeTimeout, rt)
		}
		return nil
	}
	w := writes{group: cfg.Group, deadLetter: cfg.DeadLetterTopic, retries: cfg.retryTopics(), limits: limits}
	cl, err := w.newClient(ctx, "SourceConfig", cfg.ClientConfig, opts, revokeFits)
	if err != nil {
		return nil, err
	}
	s.cl = cl
	go s.committer()
	return s, nil
}

// Client returns the franz-go client behind the source, for metrics and
// admin calls. Polling or committing with it breaks the source's guarantees.
func (s *Source) Client() *kgo.Client { return s.cl }

// Capabilities reports Log and Ordered; Delay, DelayTiers and MaxDelay (the
// longest tier) when retry tiers are configured.
func (s *Source) Capabilities() adapters.Capabilities { return s.caps }

// Extensions declares all four: the source recycles its deliveries, acks
// batches under one lock, detaches a payload from its fetch, and tells of
// revokes and lost partitions.
func (s *Source) Extensions() adapters.Extensions {
	return adapters.Extensions{Recycler: s, BatchAcker: s, Detacher: s, Invalidator: s}
}

// Close commits what is settled, leaves the group (revoking, and so
// committing, every partition) and closes the client. Deliveries not settled
// are left for the next owner. Close is idempotent.
func (s *Source) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed.Swap(true) {
		return s.closeErr
	}
	close(s.closing)
	close(s.stop)
	<-s.done
	s.commitMu.Lock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := s.commitLocked(ctx, s.cl, nil)
	cancel()
	s.commitMu.Unlock()
	s.cl.Close()
	if err != nil {
		s.closeErr = fmt.Errorf("kafka: final commit: %w", err)
	}
	return s.closeErr
}

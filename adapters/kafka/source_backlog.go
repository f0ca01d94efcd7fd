package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Backlog returns how many records of the source's topic (and its retry
// topics) its group has yet to read, over all partitions: the end offset a
// read_committed consumer sees (the last stable offset) less the group's
// committed offset (the partition's start offset without one, its end on
// the topic with StartOffset "latest") and less the records above it the
// commit metadata names as settled, which are not delivered again
// (dlq.Backlogger: dlq.Redrive receives no more new records than that, so
// the dead letters that a consumer which still fails sends back while the
// run reads wait for the next run). Offsets that hold no record a consumer
// sees (transaction markers, aborted records) are counted: on a topic
// written in transactions the run may end idle rather than at the count.
// On a topic of several partitions, records written after the count may
// be received from one partition before the last counted ones of another,
// which the run then leaves for the next run. It asks the brokers (three
// requests) and fails for a topic that does not exist.
func (s *Source) Backlog(ctx context.Context) (int, error) {
	offs, err := groupOffsets(ctx, kadm.NewClient(s.cl), s.cfg)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, o := range offs {
		n += o.Lag()
	}
	return int(min(max(n, 0), math.MaxInt)), nil
}

// PartitionOffsets is where a consumer group stands on one partition of a
// source's topic (or of one of its retry topics).
type PartitionOffsets struct {
	Topic     string
	Partition int32
	// End is the end offset a read_committed consumer sees (the last
	// stable offset).
	End int64
	// Committed is where the group resumes: its committed offset, or the
	// partition's start offset without one (its end on the topic with
	// StartOffset "latest"), never below the start offset.
	Committed int64
	// Settled counts the records between Committed and End that the
	// group's commit metadata names as settled (they are not delivered
	// again).
	Settled int64
}

// Lag is the records of the partition the group has yet to read: End less
// Committed less Settled, never negative.
func (o PartitionOffsets) Lag() int64 { return max(o.End-o.Committed-o.Settled, 0) }

// GroupOffsets returns, for every partition of cfg's topic and its retry
// topics, where cfg.Group stands (the counts Backlog sums), asking the
// brokers through a client of its own that joins no group: unlike opening
// a Source, it does not make the group rebalance, so it may be called on
// the group of live consumers (the ackwise CLI's lag command samples it
// twice to tell ingress and consume rates). A topic that does not exist is
// an error. Of cfg, the ClientConfig, Topic, RetryTiers, RetryPrefix,
// Group and StartOffset are used.
func GroupOffsets(ctx context.Context, cfg SourceConfig) ([]PartitionOffsets, error) {
	cfg = cfg.withDefaults()
	if err := cfg.ClientConfig.validate(fieldsOf("SourceConfig"), cfg.Topic); err != nil {
		return nil, err
	}
	if cfg.Group == "" {
		return nil, errors.New("kafka: GroupOffsets: SourceConfig.Group is empty")
	}
	cl, err := kgo.NewClient(append(cfg.ClientConfig.opts(), cfg.Options...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka: new client: %w", err)
	}
	defer cl.Close()
	return groupOffsets(ctx, kadm.NewClient(cl), cfg)
}

// groupOffsets is GroupOffsets with a client (three requests).
func groupOffsets(ctx context.Context, adm *kadm.Client, cfg SourceConfig) ([]PartitionOffsets, error) {
	st, err := groupStandings(ctx, adm, cfg)
	if err != nil {
		return nil, err
	}
	out := make([]PartitionOffsets, len(st))
	for i, p := range st {
		out[i] = p.PartitionOffsets
	}
	return out, nil
}

// standing is where a group stands on one partition, with the offsets
// between Committed and End that its commit metadata names as settled
// (Settled counts them).
type standing struct {
	PartitionOffsets
	settled map[int64]struct{}
}

// groupStandings is groupOffsets with the settled offsets themselves.
func groupStandings(ctx context.Context, adm *kadm.Client, cfg SourceConfig) ([]standing, error) {
	topics := append([]string{cfg.Topic}, cfg.retryTopics()...)
	ends, err := adm.ListCommittedOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		return nil, fmt.Errorf("kafka: backlog of %v: a topic does not exist: %w", topics, err)
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: backlog of %v: list end offsets: %w", topics, err)
	}
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: backlog of %v: list start offsets: %w", topics, err)
	}
	offs, err := adm.FetchOffsetsForTopics(ctx, cfg.Group, topics...)
	if err == nil {
		err = offs.Error()
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		// A group that has not joined yet has committed nothing (a broker
		// may say so before the group's first join is recorded).
		offs, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: backlog of %v: fetch the offsets of group %q: %w", topics, cfg.Group, err)
	}
	var out []standing
	ends.Each(func(e kadm.ListedOffset) {
		p := standing{PartitionOffsets: PartitionOffsets{Topic: e.Topic, Partition: e.Partition, End: e.Offset}}
		if st, ok := starts.Lookup(e.Topic, e.Partition); ok {
			p.Committed = st.Offset
		}
		if o, ok := offs.Lookup(e.Topic, e.Partition); ok && o.At >= 0 {
			p.Committed = max(p.Committed, o.At)
			for off := range decodeSettled(o.At, o.Metadata) {
				if off >= p.Committed && off < e.Offset {
					p.Settled++
					if p.settled == nil {
						p.settled = make(map[int64]struct{})
					}
					p.settled[off] = struct{}{}
				}
			}
		} else if e.Topic == cfg.Topic && cfg.StartOffset == "latest" {
			p.Committed = e.Offset
		}
		out = append(out, p)
	})
	slices.SortFunc(out, func(a, b standing) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out, nil
}

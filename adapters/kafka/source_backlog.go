package kafka

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
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
	topics := append([]string{s.cfg.Topic}, s.cfg.retryTopics()...)
	adm := kadm.NewClient(s.cl)
	ends, err := adm.ListCommittedOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		return 0, fmt.Errorf("kafka: backlog of %v: a topic does not exist: %w", topics, err)
	}
	if err != nil {
		return 0, fmt.Errorf("kafka: backlog of %v: list end offsets: %w", topics, err)
	}
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("kafka: backlog of %v: list start offsets: %w", topics, err)
	}
	offs, err := adm.FetchOffsetsForTopics(ctx, s.cfg.Group, topics...)
	if err == nil {
		err = offs.Error()
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		// A group that has not joined yet has committed nothing (a broker
		// may say so before the group's first join is recorded).
		offs, err = nil, nil
	}
	if err != nil {
		return 0, fmt.Errorf("kafka: backlog of %v: fetch the offsets of group %q: %w", topics, s.cfg.Group, err)
	}
	var n int64
	ends.Each(func(e kadm.ListedOffset) {
		from := int64(0)
		if st, ok := starts.Lookup(e.Topic, e.Partition); ok {
			from = st.Offset
		}
		if o, ok := offs.Lookup(e.Topic, e.Partition); ok && o.At >= 0 {
			from = max(from, o.At)
			for off := range decodeSettled(o.At, o.Metadata) {
				if off >= from && off < e.Offset {
					n--
				}
			}
		} else if e.Topic == s.cfg.Topic && s.cfg.StartOffset == "latest" {
			from = e.Offset
		}
		n += max(e.Offset-from, 0)
	})
	return int(min(max(n, 0), math.MaxInt)), nil
}

package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

var _ dlq.Ager = (*Source)(nil)

// Oldest returns when the oldest record the source's group has yet to read
// was written (dlq.Ager: on a dead-letter topic, the age of the oldest dead
// letter, ackwise.dlq.oldest.age of dlq.NewDepthMetrics and the broker's
// oldest age of the ackwise CLI's dlq stats), and ok false when the group
// has read everything (Backlog is 0).
//
// The oldest unread record of a partition is the first one at or above
// where the group stands (its committed offset, or the partition's start
// offset without one: see PartitionOffsets.Committed) that a
// read_committed consumer sees and the commit metadata does not name as
// settled; Oldest takes that record from each partition that has a
// backlog and answers the earliest of their times. A record's time is its
// envelope's last failure (dlq.HeaderLastFailure) when it carries an
// envelope dlq.Decode reads, else its Kafka timestamp. Within a partition
// records are taken in log order: a record written later with an earlier
// timestamp is not looked for.
//
// It reads those records with a client of its own that joins no group and
// commits nothing, fetching at exact offsets one record batch per
// partition, and closes it before returning: live consumers of the group
// are not disturbed. It costs the three requests of Backlog and, when a
// partition has a backlog, a connection and a fetch (more when markers of
// transactions or settled records come first). It answers within ctx:
// a partition whose first unread record does not come before ctx is done
// (a broker that does not answer; the records above the committed offset
// all in a transaction still open) makes it fail, naming the partition.
// SourceConfig.Options apply to that client too; a consumer group among
// them is refused. It may be called concurrently with the source's other
// methods.
func (s *Source) Oldest(ctx context.Context) (time.Time, bool, error) {
	st, err := groupStandings(ctx, kadm.NewClient(s.cl), s.cfg)
	if err != nil {
		return time.Time{}, false, err
	}
	return firstUnread(ctx, s.cfg, st)
}

// unread is what firstUnread waits for on one partition.
type unread struct {
	end     int64
	settled map[int64]struct{}
}

// firstUnread reads the first unread record of each partition of st that
// has a backlog and returns the earliest of their times.
func firstUnread(ctx context.Context, cfg SourceConfig, st []standing) (time.Time, bool, error) {
	at := map[string]map[int32]kgo.Offset{}
	left := map[topicPartition]unread{}
	for _, p := range st {
		if p.Lag() == 0 {
			continue
		}
		if at[p.Topic] == nil {
			at[p.Topic] = map[int32]kgo.Offset{}
		}
		at[p.Topic][p.Partition] = kgo.NewOffset().At(p.Committed)
		left[topicPartition{p.Topic, p.Partition}] = unread{end: p.End, settled: p.settled}
	}
	if len(left) == 0 {
		return time.Time{}, false, nil
	}
	opts := append(cfg.consume(fieldsOf("SourceConfig")).opts(), cfg.Options...)
	opts = append(opts,
		kgo.ConsumePartitions(at),
		// Retention may delete the committed offset meanwhile: the oldest
		// unread record is then the partition's first.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// A transaction marker at the committed offset comes as a record,
		// so a partition whose backlog holds no record a consumer sees
		// ends at the marker below its end rather than at ctx.
		kgo.KeepControlRecords(),
		// One batch per partition is enough: the first is what is looked for.
		kgo.FetchMaxPartitionBytes(1),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		// kgo refuses a consumer group (from Options) next to
		// ConsumePartitions: no group is joined.
		return time.Time{}, false, fmt.Errorf("kafka: oldest unread record: new client: %w", err)
	}
	defer cl.Close()

	var (
		oldest time.Time
		found  bool
	)
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return time.Time{}, false, fmt.Errorf("kafka: oldest unread record: none came from %s: %w", partitionsOf(left), context.Cause(ctx))
		}
		var ferr error
		fs.EachError(func(topic string, p int32, err error) {
			var loss *kgo.ErrDataLoss
			if !errors.As(err, &loss) { // retention moved the start: read on
				ferr = errors.Join(ferr, fmt.Errorf("%s[%d]: %w", topic, p, err))
			}
		})
		if ferr != nil {
			return time.Time{}, false, fmt.Errorf("kafka: oldest unread record: fetch: %w", ferr)
		}
		done := map[string][]int32{}
		fs.EachRecord(func(r *kgo.Record) {
			tp := topicPartition{r.Topic, r.Partition}
			u, ok := left[tp]
			if !ok {
				return
			}
			_, settled := u.settled[r.Offset]
			switch {
			case r.Offset < u.end && !r.Attrs.IsControl() && !settled:
				if t := recordTime(r); !found || t.Before(oldest) {
					oldest, found = t, true
				}
			case r.Offset+1 < u.end:
				return // a marker or a settled record: the next one
			}
			// Found, or nothing a consumer sees below the end.
			delete(left, tp)
			done[r.Topic] = append(done[r.Topic], r.Partition)
		})
		if len(done) > 0 {
			cl.PauseFetchPartitions(done)
		}
	}
	return oldest, found, nil
}

// recordTime is when r was dead-lettered, by its envelope, else its
// timestamp.
func recordTime(r *kgo.Record) time.Time {
	h := make(ackwise.Headers, 0, len(r.Headers))
	for _, kv := range r.Headers {
		h = append(h, ackwise.Header{Key: kv.Key, Value: string(kv.Value)})
	}
	if e, err := dlq.Decode(h); err == nil && !e.LastFailure.IsZero() {
		return e.LastFailure
	}
	return r.Timestamp
}

// partitionsOf names the partitions of left, sorted.
func partitionsOf(left map[topicPartition]unread) string {
	names := make([]string, 0, len(left))
	for tp := range left {
		names = append(names, fmt.Sprintf("%s[%d]", tp.topic, tp.id))
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

package kafka

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ackwise/ackwise"
)

// kickCommitter tells the committer there is something to commit.
func (s *Source) kickCommitter() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// committer commits settled offsets at most once per CommitInterval, and only
// when something was settled.
func (s *Source) committer() {
	defer close(s.done)
	t := time.NewTimer(0)
	<-t.C
	for {
		select {
		case <-s.kick:
		case <-s.stop:
			return
		}
		s.commitMu.Lock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := s.commitLocked(ctx, s.cl, nil)
		cancel()
		s.commitMu.Unlock()
		if err != nil && !s.closed.Load() {
			s.log.Warn("kafka: commit failed; will retry", ackwise.LogKeyGroup, s.cfg.Group, ackwise.LogKeyError, err)
			select {
			case s.kick <- struct{}{}:
			default:
			}
		}
		t.Reset(s.cfg.CommitInterval)
		select {
		case <-t.C:
		case <-s.stop:
			return
		}
	}
}

// commitLocked commits the settled offsets of ps (of every owned partition
// when ps is nil) synchronously. The caller holds commitMu.
func (s *Source) commitLocked(ctx context.Context, cl *kgo.Client, ps []*partition) error {
	s.mu.Lock()
	if ps == nil {
		for _, p := range s.parts {
			ps = append(ps, p)
		}
	}
	offs := make(map[string]map[int32]kgo.EpochOffset)
	metas := make(map[string]map[int32]string)
	type pend struct {
		p    *partition
		off  int64
		meta bool
	}
	var todo []pend
	for _, p := range ps {
		if !p.dirty() || p.own.Load() == ownGone {
			continue
		}
		m := offs[p.topic]
		if m == nil {
			m = make(map[int32]kgo.EpochOffset)
			offs[p.topic] = m
		}
		m[p.id] = kgo.EpochOffset{Epoch: p.commitEp, Offset: p.commitOff}
		if meta := encodeSettled(p.commitOff, p.settledAbove()); meta != "" {
			mm := metas[p.topic]
			if mm == nil {
				mm = make(map[int32]string)
				metas[p.topic] = mm
			}
			mm[p.id] = meta
		}
		todo = append(todo, pend{p, p.commitOff, p.metaDirty})
		p.metaDirty = false
	}
	s.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	if s.testCommitting != nil {
		s.testCommitting()
	}
	if len(metas) > 0 {
		ctx = kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
			for i := range req.Topics {
				t := &req.Topics[i]
				for j := range t.Partitions {
					if meta, ok := metas[t.Topic][t.Partitions[j].Partition]; ok {
						t.Partitions[j].Metadata = &meta
					}
				}
			}
			return nil
		})
	}
	var cerr error
	failed := map[topicPartition]bool{}
	cl.CommitOffsetsSync(ctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			cerr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					failed[topicPartition{t.Topic, p.Partition}] = true
					cerr = fmt.Errorf("%s/%d: %w", t.Topic, p.Partition, err)
				}
			}
		}
	})
	s.mu.Lock()
	for _, t := range todo {
		if (cerr != nil && len(failed) == 0) || failed[topicPartition{t.p.topic, t.p.id}] {
			t.p.metaDirty = t.p.metaDirty || t.meta
			continue
		}
		if t.off > t.p.committed {
			t.p.committed = t.off
		}
	}
	s.mu.Unlock()
	return cerr
}

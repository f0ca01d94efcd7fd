package kafka

import (
	"context"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

func (s *Source) onAssigned(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) {
	// The settled offsets above each committed offset, left in the commit
	// metadata by the previous owner: they are not delivered again.
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	adm := kadm.NewClient(cl)
	offs, err := adm.FetchOffsets(fctx, s.cfg.Group)
	var ends kadm.ListedOffsets
	if err == nil && hasSettledSets(offs, assigned) {
		// A set may name only records that exist: offsets at or past a
		// partition's end are a forgery, or what a truncation (an
		// unclean leader election) took back, and the records written
		// there next were never settled.
		var topics []string
		for t := range assigned {
			topics = append(topics, t)
		}
		if ends, err = adm.ListEndOffsets(fctx, topics...); err != nil {
			offs = nil
		}
	}
	cancel()
	if err != nil {
		s.log.Warn("kafka: cannot read commit metadata; settled records above the committed offsets will be redelivered", ackwise.LogKeyGroup, s.cfg.Group, ackwise.LogKeyError, err)
	}
	s.rewindMu.Lock()
	defer s.rewindMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	var unpause map[string][]int32
	for t, ids := range assigned {
		_, retry := s.retries[t]
		for _, id := range ids {
			k := topicPartition{t, id}
			if old := s.parts[k]; old != nil {
				s.dropLocked(cl, []*partition{old})
			}
			p := newPartition(t, id, retry)
			if retry {
				// A new assignment starts unpaused; make sure the client
				// agrees (pauses outlive assignments in franz-go).
				if unpause == nil {
					unpause = make(map[string][]int32)
				}
				unpause[t] = append(unpause[t], id)
			}
			if o, ok := offs.Lookup(t, id); ok && o.Err == nil && o.At >= 0 {
				p.skip = decodeSettled(o.At, o.Metadata)
				if len(p.skip) > 0 {
					if e, ok := ends.Lookup(t, id); !ok || e.Err != nil || !below(p.skip, e.Offset) {
						s.log.Warn("kafka: commit metadata names records past the partition's end; ignored, the records above the committed offset will be redelivered",
							ackwise.LogKeyGroup, s.cfg.Group, ackwise.LogKeyTopic, t, ackwise.LogKeyPartition, id)
						p.skip = nil
					}
				}
				if len(p.skip) == 0 {
					p.skip = nil
				}
			}
			s.parts[k] = p
		}
	}
	resumeLocked(cl, unpause)
	s.log.Debug("kafka: partitions assigned", ackwise.LogKeyGroup, s.cfg.Group, "partitions", assigned)
}

// hasSettledSets reports whether offs holds ackwise's commit metadata for
// a partition of assigned.
func hasSettledSets(offs kadm.OffsetResponses, assigned map[string][]int32) bool {
	for t, ids := range assigned {
		for _, id := range ids {
			if o, ok := offs.Lookup(t, id); ok && o.Err == nil && strings.HasPrefix(o.Metadata, metaPrefix) {
				return true
			}
		}
	}
	return false
}

// below reports whether every offset of set is below end.
func below(set map[int64]struct{}, end int64) bool {
	for o := range set {
		if o >= end {
			return false
		}
	}
	return true
}

// onRevoked runs before revoked partitions are released: new deliveries
// stop at once, running handlers get RevokeTimeout to settle, then what is
// settled is committed synchronously.
func (s *Source) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	if s.testRevoking != nil {
		s.testRevoking()
	}
	s.rewindMu.Lock()
	s.mu.Lock()
	var ps []*partition
	var waits []chan struct{}
	for t, ids := range revoked {
		for _, id := range ids {
			p := s.parts[topicPartition{t, id}]
			if p == nil {
				continue
			}
			p.own.Store(ownRevoking)
			ps = append(ps, p)
			if p.inflight > 0 {
				if p.drained == nil {
					p.drained = make(chan struct{})
				}
				waits = append(waits, p.drained)
			}
		}
	}
	s.mu.Unlock()
	s.rewindMu.Unlock()
	if len(ps) == 0 {
		return
	}
	if len(waits) > 0 {
		// Records waiting in the engine (a retry in place, a failed move)
		// are handed back now, not when their waits end.
		s.invalid.Invalidated()
	}
	if len(waits) > 0 && s.cfg.RevokeTimeout > 0 {
		timer := time.NewTimer(s.cfg.RevokeTimeout)
	wait:
		for _, w := range waits {
			select {
			case <-w:
			case <-timer.C:
				s.log.Warn("kafka: revoke timeout: handlers still running on revoked partitions; their records will be redelivered", ackwise.LogKeyGroup, s.cfg.Group, ackwise.LogKeyTimeout, s.cfg.RevokeTimeout)
				break wait
			case <-s.closing:
				break wait
			case <-ctx.Done():
				break wait
			}
		}
		timer.Stop()
	}
	// From here a settle fails: the commit below is the last for these
	// partitions, and a settle it does not carry would be reported done
	// while the next owner delivers the record again.
	s.mu.Lock()
	for _, p := range ps {
		p.own.Store(ownSealed)
	}
	s.mu.Unlock()
	s.commitMu.Lock()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	err := s.commitLocked(cctx, cl, ps)
	cancel()
	s.mu.Lock()
	s.dropLocked(cl, ps)
	s.mu.Unlock()
	s.commitMu.Unlock()
	if err != nil {
		s.log.Warn("kafka: commit on revoke failed; settled records may be redelivered", ackwise.LogKeyGroup, s.cfg.Group, ackwise.LogKeyError, err)
	}
	s.log.Debug("kafka: partitions revoked", ackwise.LogKeyGroup, s.cfg.Group, "partitions", revoked)
}

// onLost marks partitions gone without committing: the group already gave
// them to someone else. It waits for a commit in flight (at most its 10s):
// one whose offsets were read before the loss but sent after franz-go
// rejoined the group, under the new generation, would be accepted and set
// the offsets of partitions another member owns by now back to older ones.
func (s *Source) onLost(_ context.Context, cl *kgo.Client, lost map[string][]int32) {
	s.commitMu.Lock()
	s.rewindMu.Lock()
	s.mu.Lock()
	var ps []*partition
	for t, ids := range lost {
		for _, id := range ids {
			if p := s.parts[topicPartition{t, id}]; p != nil {
				ps = append(ps, p)
			}
		}
	}
	s.dropLocked(cl, ps)
	s.mu.Unlock()
	s.rewindMu.Unlock()
	s.commitMu.Unlock()
	if len(ps) > 0 {
		// Without the source's locks, as adapters.Invalidator says.
		s.invalid.Invalidated()
	}
	s.log.Warn("kafka: partitions lost", ackwise.LogKeyGroup, s.cfg.Group, "partitions", lost)
}

// dropLocked forgets partitions and resumes those that were paused, so that
// a later assignment of them fetches.
func (s *Source) dropLocked(cl *kgo.Client, ps []*partition) {
	var resume map[string][]int32
	for _, p := range ps {
		p.own.Store(ownGone)
		k := topicPartition{p.topic, p.id}
		if s.parts[k] == p {
			delete(s.parts, k)
		}
		p.held = nil
		if p.drained != nil {
			close(p.drained)
			p.drained = nil
		}
		resume = p.unpauseLocked(resume)
	}
	resumeLocked(cl, resume)
}

// unpauseLocked marks p not paused and, if it was, adds it to resume (made
// when nil), the partitions to resume fetching; it returns resume.
func (p *partition) unpauseLocked(resume map[string][]int32) map[string][]int32 {
	if !p.paused {
		return resume
	}
	p.paused = false
	if resume == nil {
		resume = make(map[string][]int32)
	}
	resume[p.topic] = append(resume[p.topic], p.id)
	return resume
}

// pauseLocked and resumeLocked change the client's paused partitions. They
// run under s.mu, like every change of partition.paused, so that the client
// and the tracking cannot disagree: a pause decided for a partition that is
// dropped meanwhile would otherwise land after the drop's resume and leave
// the partition paused for its next assignment. The group callbacks pass
// their client (s.cl may not be set yet when the first assignment runs).
func pauseLocked(cl *kgo.Client, tps map[string][]int32) {
	if len(tps) > 0 {
		cl.PauseFetchPartitions(tps)
	}
}

func resumeLocked(cl *kgo.Client, tps map[string][]int32) {
	if len(tps) > 0 {
		cl.ResumeFetchPartitions(tps)
	}
}

// OnInvalid sets f, called when a revoke or a loss of partitions makes
// records in flight no longer Valid (adapters.Invalidator).
func (s *Source) OnInvalid(f func()) { s.invalid.OnInvalid(f) }

package rabbitmq

// Acknowledgements are coalesced per channel. Ack records the delivery tag
// and wakes the session's flusher, which writes, for everything recorded
// since its last write, one basic.ack with multiple=true up to the highest
// tag below the oldest unsettled delivery, and a plain basic.ack for each
// tag above it. The broker then handles one ack frame for a run of
// deliveries instead of one each, and nothing is held back behind a slow
// handler.
//
// A multiple ack up to N acknowledges every delivery of the channel with a
// tag at most N that is still outstanding. It is safe because every such
// delivery was settled by the engine: deliveries arrive and are tracked in
// tag order, the oldest unsettled one bounds N, and a delivery released with
// basic.nack stays tracked until that nack is written, so the nack always
// reaches the broker first.

// ack records r as acknowledged and wakes the flusher. It returns an error
// wrapping ErrReceiptInvalid when r's channel died.
func (ss *session) ack(r *receipt, op string) error {
	ss.mu.Lock()
	if ss.isDead.Load() {
		ss.mu.Unlock()
		return r.invalid(op)
	}
	ss.unlinkLocked(r)
	ss.acks = append(ss.acks, r.d.DeliveryTag)
	ss.mu.Unlock()
	select {
	case ss.ackSignal <- struct{}{}:
	default:
	}
	return nil
}

// flusher writes recorded acks until the session dies.
func (ss *session) flusher() {
	for {
		select {
		case <-ss.ackSignal:
			ss.flush()
		case <-ss.dead:
			return
		}
	}
}

// flush writes the recorded acks. Write errors mean the channel is dying:
// the broker then redelivers what was not acknowledged.
func (ss *session) flush() {
	ss.flushMu.Lock()
	defer ss.flushMu.Unlock()
	ss.mu.Lock()
	tags := ss.acks
	ss.acks, ss.spare = ss.spare[:0], nil
	if ss.isDead.Load() {
		// kill emptied the in-flight list while the channel may still be
		// open: with no head as a limit, a multiple ack would cover
		// deliveries still in their handlers. Write nothing: the broker
		// redelivers these (a duplicate, not a loss).
		ss.mu.Unlock()
		ss.recycle(tags)
		return
	}
	limit := ^uint64(0)
	if ss.head != nil {
		limit = ss.head.d.DeliveryTag
	}
	ss.mu.Unlock()
	if len(tags) == 0 {
		ss.recycle(tags)
		return
	}
	var upTo uint64
	for _, t := range tags {
		if t < limit && t > upTo {
			upTo = t
		}
	}
	if upTo > 0 {
		if err := ss.ch.Ack(upTo, true); err != nil {
			ss.recycle(tags)
			return
		}
	}
	for _, t := range tags {
		if t > limit {
			if err := ss.ch.Ack(t, false); err != nil {
				break
			}
		}
	}
	ss.recycle(tags)
}

// recycle keeps the flushed slice for the next round (double buffering),
// unless it grew large.
func (ss *session) recycle(tags []uint64) {
	if cap(tags) > 4096 {
		return
	}
	ss.mu.Lock()
	if ss.spare == nil {
		ss.spare = tags[:0]
	}
	ss.mu.Unlock()
}

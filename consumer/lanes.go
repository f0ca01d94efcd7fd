package consumer

import (
	"sync/atomic"

	"github.com/ackwise/ackwise"
)

// lanes keeps per-key order (Config.Ordering): a lane per key (OrderKey)
// or per partition (OrderPartition), in which the messages of that key
// wait for the one in flight. Idle lanes are kept for reuse, up to limit
// lanes in all. Its fields, and those of every lane, are guarded by
// Consumer.mu, which it shares with the rest of the engine: a lane's next
// message is taken as the message before it finishes, under the same lock
// as the in-flight count. Methods named ...Locked require the caller to
// hold c.mu.
type lanes struct {
	ordering Ordering
	byKey    map[string]*lane  // OrderKey
	byPart   map[partKey]*lane // OrderPartition
	limit    int               // lanes kept before idle ones are dropped
	free     []*lane
	// returns counts the messages of lanes that went back to the broker
	// unsettled (lane.returnedAt); written under mu, read by the receive
	// loop without it.
	returns atomic.Uint64
}

// minLaneLimit is the fewest lanes kept (idle ones included) before the
// idle ones are dropped; the limit is 4 × MaxInFlight when larger.
const minLaneLimit = 1024

func (l *lanes) init(o Ordering, maxInFlight int) {
	l.ordering = o
	switch o {
	case OrderKey:
		l.byKey = make(map[string]*lane)
	case OrderPartition:
		l.byPart = make(map[partKey]*lane)
	}
	l.limit = max(4*maxInFlight, minLaneLimit)
}

// partKey names the lane of a partition (OrderPartition).
type partKey struct {
	source    string
	partition int32
}

// lane holds the messages of one key (or partition) that wait for the one in
// flight. An idle lane stays in its map, so that the next message of its key
// finds it without a map insert, until the map holds lanes.limit lanes.
type lane struct {
	queue []queued
	head  int
	busy  bool // a message of the lane is in flight and not finished
	// returnedAt is lanes.returns when a message of the lane last went
	// back to the broker unsettled (0: never), and returned that message's
	// identity. Another message received before that, but dispatched
	// after, would overtake its redelivery: dispatch releases it too (see
	// pool.dispatch).
	returnedAt uint64
	returned   msgID
}

// queued is a message waiting in its lane, with its slot in Consumer.ages.
type queued struct {
	msg *ackwise.Message
	age int32
}

// push queues m, whose slot in Consumer.ages is age, behind the lane's message in flight. A lane that stays busy
// through a backlog never resets its queue (next does when it goes idle),
// so the messages still waiting are moved to the front before the queue
// would grow: its room stays within twice the messages waiting (fewer than
// MaxInFlight), not one slot per message ever queued (invariant 6). Caller
// holds c.mu.
func (ln *lane) push(m *ackwise.Message, age int32) {
	if ln.head > 0 && len(ln.queue) == cap(ln.queue) {
		n := copy(ln.queue, ln.queue[ln.head:])
		clear(ln.queue[n:])
		ln.queue, ln.head = ln.queue[:n], 0
	}
	ln.queue = append(ln.queue, queued{m, age})
}

// next takes the lane's next message (and its slot in Consumer.ages) as
// the one in flight finishes; when none waits, the lane goes idle and next
// returns nil. Caller holds c.mu.
func (ln *lane) next() (*ackwise.Message, int32) {
	if ln.head < len(ln.queue) {
		q := ln.queue[ln.head]
		ln.queue[ln.head] = queued{}
		ln.head++
		return q.msg, q.age
	}
	ln.busy = false
	ln.queue, ln.head = ln.queue[:0], 0
	if cap(ln.queue) > 16 {
		ln.queue = nil
	}
	return nil, 0
}

// ofLocked returns msg's lane, creating it, or nil when msg is not
// ordered. Caller holds c.mu.
func (l *lanes) ofLocked(msg *ackwise.Message) *lane {
	switch l.ordering {
	case OrderKey:
		if msg.Key == "" {
			return nil
		}
		if ln := l.byKey[msg.Key]; ln != nil {
			return ln
		}
		ln := l.newLocked()
		l.byKey[msg.Key] = ln
		return ln
	case OrderPartition:
		k := partKey{msg.Source, msg.Partition}
		if ln := l.byPart[k]; ln != nil {
			return ln
		}
		ln := l.newLocked()
		l.byPart[k] = ln
		return ln
	}
	return nil
}

// newLocked returns a lane for a key seen first, a free one if any. When
// limit lanes are kept, the idle ones are dropped first (and with them
// what their returnedAt said: see pool.dispatch). Caller holds c.mu.
func (l *lanes) newLocked() *lane {
	if len(l.byKey)+len(l.byPart) >= l.limit {
		// Drop the idle lanes. At most MaxInFlight are busy, so this runs
		// once per limit-MaxInFlight new lanes at most.
		for k, ln := range l.byKey {
			if !ln.busy {
				delete(l.byKey, k)
				l.free = append(l.free, ln)
			}
		}
		for k, ln := range l.byPart {
			if !ln.busy {
				delete(l.byPart, k)
				l.free = append(l.free, ln)
			}
		}
	}
	if n := len(l.free); n > 0 {
		ln := l.free[n-1]
		l.free[n-1] = nil
		l.free = l.free[:n-1]
		ln.returnedAt = 0 // another key's
		return ln
	}
	return &lane{}
}

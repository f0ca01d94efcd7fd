package consumer

import (
	"time"

	"github.com/ackwise/ackwise"
)

// ages keeps, for the lag gauge (ackwise.consumer.lag), when each message in
// flight was published: its broker timestamp (Message.PublishedAt), or when
// the engine received it where the broker gives none. It is on only with
// the Observer of NewMetrics (Consumer.New turns it on); off, it costs a
// branch per message.
//
// A message in flight holds one slot, taken as dispatch puts it in flight
// and given back by finishLocked, its index carried by its task (and by
// its lane's queue while it waits there): no allocation and no lock beyond
// the Consumer.mu that both already hold, and a collection reads the slots
// in use (at most MaxInFlight) under that lock. Its fields are guarded by
// Consumer.mu; methods named ...Locked require the caller to hold it.
type ages struct {
	on    bool
	slots []ageSlot
	free  []int32 // indexes of free slots
	// seen are the sources whose messages were ever in flight at a
	// collection (at most maxCachedSources): their lag reads 0 when
	// nothing of theirs is in flight, rather than vanishing.
	seen map[string]struct{}
}

// ageSlot is one message in flight: its source and its publish time in
// Unix nanoseconds; at is 0 for a free slot.
type ageSlot struct {
	at     int64
	source string
}

// startLocked takes a slot for m, received at now, and returns its index
// plus one; ages must be on. A publish time not after the Unix epoch
// (Kafka's -1 for "no timestamp") or later than now (a clock ahead of
// ours, or a producer's forged CreateTime) is replaced by now: a lag is
// never negative, and a timestamp from the future does not hide an old
// message. Caller holds c.mu.
func (a *ages) startLocked(m *ackwise.Message, now time.Time) int32 {
	at, recv := m.PublishedAt.UnixNano(), now.UnixNano()
	if m.PublishedAt.IsZero() || at <= 0 || at > recv {
		at = recv
	}
	at = max(at, 1) // 0 marks a free slot
	var i int32
	if n := len(a.free); n > 0 {
		i = a.free[n-1]
		a.free = a.free[:n-1]
	} else {
		i = int32(len(a.slots))
		a.slots = append(a.slots, ageSlot{})
	}
	a.slots[i] = ageSlot{at: at, source: m.Source}
	return i + 1
}

// endLocked gives back slot (startLocked's result; 0 is none). Caller holds
// c.mu.
func (a *ages) endLocked(slot int32) {
	if slot == 0 {
		return
	}
	a.slots[slot-1] = ageSlot{}
	a.free = append(a.free, slot-1)
}

// oldestLocked calls f with each source seen and the age of its oldest
// message in flight at now (0 when none is). Caller holds c.mu.
func (a *ages) oldestLocked(now time.Time, f func(source string, age time.Duration)) {
	oldest := make(map[string]int64)
	for _, s := range a.slots {
		if s.at == 0 {
			continue
		}
		if o, ok := oldest[s.source]; !ok || s.at < o {
			oldest[s.source] = s.at
		}
	}
	if a.seen == nil {
		a.seen = make(map[string]struct{})
	}
	for src := range oldest {
		if len(a.seen) < maxCachedSources {
			a.seen[src] = struct{}{}
		}
	}
	t := now.UnixNano()
	for src := range a.seen {
		var age time.Duration
		if at, ok := oldest[src]; ok {
			age = time.Duration(max(t-at, 0))
		}
		f(src, age)
	}
	for src, at := range oldest {
		if _, ok := a.seen[src]; !ok {
			f(src, time.Duration(max(t-at, 0))) // past the bound: reported while in flight
		}
	}
}

package kafka

import (
	"slices"
	"sort"
	"strconv"
	"sync/atomic"
)

// Entry states of a tracked record.
const (
	stInflight uint8 = iota // delivered (or held), not settled
	stSettled               // acked, moved or dead-lettered: committable
	stReleased              // handed back unsettled: not committable
)

// Partition ownership states.
const (
	ownOwned    int32 = iota // ours: deliver and settle
	ownRevoking              // being revoked: settle, never deliver
	ownSealed                // being revoked, its final commit taken: settle calls fail
	ownGone                  // revoked or lost: settle calls fail
)

type entry struct {
	off   int64
	epoch int32
	st    uint8
	gen   uint16 // deliveries of the record after the first (see redeliver)
}

// partition tracks the delivered records of one assigned partition, in
// offset order, and computes the offset that is safe to commit: that of the
// first record not settled, or the one after the last tracked record when
// all are. All fields but own are guarded by the source's mu.
type partition struct {
	topic string
	id    int32
	retry bool // a retry topic of the chain

	// The last broker ID built, "topic/partition@offset", of the record
	// at bidOff; the first bidPrefix bytes never change. See brokerID.
	// Only the goroutine calling Receive uses them.
	bid       []byte
	bidPrefix int
	bidOff    int64

	own atomic.Int32

	ents []entry // ents[head:] are tracked
	head int
	base int64 // sequence number of ents[0]: seq = base + index

	next      int64 // offset after the last tracked record; -1 before any
	commitOff int64 // safe commit offset; -1 before any record
	commitEp  int32
	committed int64 // last committed offset; -1 if none

	inflight   int    // tracked records delivered and neither settled nor released
	released   int    // tracked records released and not fetched again yet
	releases   uint64 // records released so far
	rewoundAt  uint64 // Source.polls when the last rewind was applied
	rewoundFor uint64 // releases when that rewind read its offset
	// Source.pollsIn when the last rewind read its offset: polls up to it
	// returned before the rewind; those after it and up to rewoundAt were
	// in flight during it, and may have fetched from before or after it.
	rewoundFrom uint64
	drained     chan struct{} // closed when inflight reaches 0 while revoking

	held   []heldRecord // retry-topic records not yet due, in offset order
	paused bool

	metaDirty bool               // settled records above the head changed since the last commit
	skip      map[int64]struct{} // offsets settled by an earlier owner (commit metadata)
}

func newPartition(topic string, id int32, retry bool) *partition {
	prefix := topic + "/" + strconv.FormatInt(int64(id), 10) + "@"
	bid := append(make([]byte, 0, len(prefix)+20), prefix...) // 20: the digits of any int64
	return &partition{topic: topic, id: id, retry: retry, next: -1, commitOff: -1, commitEp: -1, committed: -1,
		bid: bid, bidPrefix: len(prefix), bidOff: -2}
}

// brokerID returns the broker ID of p's record at off,
// "topic/partition@off", in a buffer of p's that the next call overwrites.
// A partition's records come in offset order, mostly consecutive: the
// digits of the last offset are incremented in place then, instead of
// formatted again, and the caller copies the ID in one piece. Called only
// by the goroutine calling Receive.
func (p *partition) brokerID(off int64) []byte {
	if off == p.bidOff+1 && len(p.bid) > p.bidPrefix {
		d := p.bid[p.bidPrefix:]
		i := len(d) - 1
		for i >= 0 && d[i] == '9' {
			d[i] = '0'
			i--
		}
		if i >= 0 {
			d[i]++
			p.bidOff = off
			return p.bid
		}
		// All nines: one digit more, formatted below.
	}
	p.bid = strconv.AppendInt(p.bid[:p.bidPrefix], off, 10)
	p.bidOff = off
	return p.bid
}

// track appends a record and returns its sequence number. A record held
// back (a retry record not yet due) is not in flight until delivered.
func (p *partition) track(off int64, epoch int32, delivered bool) int64 {
	if p.head > 0 && p.head >= len(p.ents)/2 && p.head >= 64 {
		n := copy(p.ents, p.ents[p.head:])
		p.ents = p.ents[:n]
		p.base += int64(p.head)
		p.head = 0
	}
	p.ents = append(p.ents, entry{off: off, epoch: epoch})
	p.next = off + 1
	if delivered {
		p.inflight++
	}
	if p.commitOff < 0 || p.head == len(p.ents)-1 {
		p.commitOff = off
		p.commitEp = epoch
	}
	return p.base + int64(len(p.ents)-1)
}

// index returns the index into ents of sequence number seq, or -1.
func (p *partition) index(seq int64) int {
	i := int(seq - p.base)
	if i < p.head || i >= len(p.ents) {
		return -1
	}
	return i
}

// settle moves the record with sequence seq, first delivery, to state st.
// It returns false if the record is not in flight (settled or released
// before).
func (p *partition) settle(seq int64, st uint8) bool { return p.settleGen(seq, 0, st) }

// inflightGen reports whether delivery gen of the record at seq is in
// flight: neither settled nor released since.
func (p *partition) inflightGen(seq int64, gen uint16) bool {
	i := p.index(seq)
	return i >= 0 && p.ents[i].st == stInflight && p.ents[i].gen == gen
}

// settleGen is settle for delivery gen of the record: a message released
// and delivered again cannot be settled through its earlier delivery.
func (p *partition) settleGen(seq int64, gen uint16, st uint8) bool {
	i := p.index(seq)
	if i < 0 || p.ents[i].st != stInflight || p.ents[i].gen != gen {
		return false // as inflightGen, with the index kept
	}
	p.ents[i].st = st
	p.inflight--
	if st == stReleased {
		p.released++
		p.releases++
	}
	if p.inflight == 0 && p.drained != nil {
		close(p.drained)
		p.drained = nil
	}
	if st == stSettled {
		if i == p.head {
			p.advance()
		}
		if p.head < len(p.ents) {
			p.metaDirty = true
		}
	}
	return true
}

// find returns the index in ents of the tracked record at offset off, or
// -1. ents[head:] are in offset order.
func (p *partition) find(off int64) int {
	lo, hi := p.head, len(p.ents)
	i := lo + sort.Search(hi-lo, func(i int) bool { return p.ents[lo+i].off >= off })
	if i < hi && p.ents[i].off == off {
		return i
	}
	return -1
}

// firstReleased returns the offset of the first released record, or -1.
func (p *partition) firstReleased() int64 {
	if p.released == 0 {
		return -1
	}
	for _, e := range p.ents[p.head:] {
		if e.st == stReleased {
			return e.off
		}
	}
	return -1
}

// holdBack decides about a new record of poll number poll while a released
// record of p waits to be fetched again. Fetched before the rewind to every
// released record (or with that rewind still to come), it is held back: it
// comes again after them. A poll in flight during the rewind may have
// fetched from before or after it; if after, no rewind to come fetches its
// records again, so again asks for one more rewind before the next poll.
// Fetched after that rewind yet past the released records, it shows they
// are no longer in the log (compacted away, deleted by retention): hold is
// false, and waiting for them would stall p.
func (p *partition) holdBack(poll uint64) (hold, again bool) {
	covered := p.rewoundFor == p.releases
	if poll > p.rewoundAt && covered {
		return false, false
	}
	return true, covered && poll > p.rewoundFrom
}

// dropReleased settles the released records, which are no longer in the
// log, and returns their offsets.
func (p *partition) dropReleased() []int64 {
	var offs []int64
	for i := p.head; i < len(p.ents); i++ {
		if e := &p.ents[i]; e.st == stReleased {
			e.st = stSettled
			offs = append(offs, e.off)
		}
	}
	p.released = 0
	p.advance()
	if p.head < len(p.ents) {
		p.metaDirty = true
	}
	return offs
}

// redeliver puts the released record at offset off back in flight (it was
// fetched again) and returns its sequence number and delivery generation;
// false if no record at off is released.
func (p *partition) redeliver(off int64) (seq int64, gen uint16, ok bool) {
	i := p.find(off)
	if i < 0 || p.ents[i].st != stReleased {
		return 0, 0, false
	}
	e := &p.ents[i]
	e.st = stInflight
	e.gen++
	p.inflight++
	p.released--
	return p.base + int64(i), e.gen, true
}

// trackSettled appends a record an earlier owner already settled.
func (p *partition) trackSettled(off int64, epoch int32) {
	p.track(off, epoch, false)
	i := len(p.ents) - 1
	p.ents[i].st = stSettled
	delete(p.skip, off)
	if len(p.skip) == 0 {
		p.skip = nil
	}
	if i == p.head {
		p.advance()
	}
}

// settledAbove returns the settled offsets above the commit offset.
func (p *partition) settledAbove() []int64 {
	var out []int64
	for _, e := range p.ents[p.head:] {
		if e.st == stSettled {
			out = append(out, e.off)
		}
	}
	for o := range p.skip { // skips not fetched again yet stay settled
		if o > p.commitOff {
			out = append(out, o)
		}
	}
	if len(p.skip) > 0 {
		slices.Sort(out)
	}
	return out
}

// advance pops settled records off the front and moves the commit offset.
func (p *partition) advance() {
	for p.head < len(p.ents) && p.ents[p.head].st == stSettled {
		p.commitEp = p.ents[p.head].epoch
		p.head++
	}
	off := p.next
	if p.head < len(p.ents) {
		off = p.ents[p.head].off
		p.commitEp = p.ents[p.head].epoch
	} else {
		// Records an earlier owner settled (commit metadata) that follow
		// need not be fetched to be committed past.
		for {
			if _, ok := p.skip[off]; !ok {
				break
			}
			off++
		}
	}
	if off > p.commitOff {
		p.commitOff = off
	}
}

// dirty reports whether the safe commit offset moved past the committed one.
func (p *partition) dirty() bool { return p.commitOff > p.committed || p.metaDirty }

package consumer

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/ackwise/ackwise"
)

// The hand-off from the receive loop to the handlers.
//
// The receive loop queues each received message behind the message in
// flight of its lane (its key or partition) or, when its lane is idle,
// passes it on as a task. How depends on the pace of the handlers, measured
// as the average run time of a message (handler, settle, finish):
//
//   - single (slow handlers, the start): every task goes alone to a worker
//     through the work queue, and is finished as soon as it settled: any
//     idle worker takes the next one.
//   - batch (fast handlers): the ready tasks go in chunks, one per worker;
//     a worker runs its chunk back to back, acks the successes and finishes
//     (frees in-flight slots and lanes, under one lock) every flushEvery
//     messages and at the end of the chunk. The channel hand-off, the
//     wake-up and the lock are then per chunk, not per message.
//   - inline (handlers cheaper than a hand-off): the receive loop runs the
//     ready tasks itself, as batch does, holding one of the Concurrency
//     handler slots: moving a message to another core costs more than
//     running it.
//
// A worker notices a slow message in a fast chunk at its next flush and
// hands the rest of the chunk to the other workers one by one.

const (
	// maxChunk caps the tasks handed to a worker at once.
	maxChunk = 64
	// flushEvery is the most messages run before the ones that ran are
	// acked and finished: a message that succeeded waits for at most
	// flushEvery-1 messages after it in its chunk before it is acked and
	// its lane and in-flight slot are freed.
	flushEvery = 8
)

// pool is the engine's workers and what they share: the work queue, the
// handler slots, each worker's state and the chunks that carry tasks to
// them. dispatch puts the ready messages on it, the workers (and the
// receive loop, inline) run them, ack the successes and finish them. Its
// chunk pool (freeChunks) is guarded by Consumer.mu, which it shares with
// the rest of the engine: a task is queued to the workers under the same
// lock as its lane and in-flight place are taken. Methods named ...Locked
// require the caller to hold c.mu.
type pool struct {
	c *Consumer
	// work carries chunks of tasks ready to run. Its capacity is
	// MaxInFlight and every chunk on it holds at least one in-flight message
	// that no other chunk holds, so sends never block.
	work chan *chunk
	// slots holds a token per handler running: Concurrency at most, between
	// the workers and the receive loop running messages inline.
	slots   chan struct{}
	workers []*workerState // set by Run before its goroutines start

	freeChunks  []*chunk
	dispatchCh  chunk    // dispatch's, by the receive loop, reset by recycleLocked
	dispatchBuf []*chunk // dispatch's scratch, owned by the receive loop

	// NewBatch's consumers: the ready tasks too few to fill a batch, which
	// wait for more up to Batch.Linger (gatherLocked), and whether the
	// linger timer is armed.
	pending   []task
	lingering bool

	// watchWake wakes the stall watch: a worker's watch timer sends on it
	// (capacity 1; set by Run).
	watchWake chan struct{}
	// watchWakes counts the stall watch's wake-ups (for tests).
	watchWakes atomic.Uint64
}

// task is an in-flight message on its way to a handler, with its lane (nil
// when the message is not ordered). sum is the content hash of a message
// without a broker ID as it was received (see msgID), taken by process
// before its first run, so that what a handler changes in the message does
// not change its identity; 0 until then.
//
// retried says the message's last outcome was an in-place Retried and its
// next attempt has not run yet: handed back to the broker before it runs
// (the drain, a lost receipt), it is not observed again, since the
// broker's redelivery is its retry.
type task struct {
	msg     *ackwise.Message
	ln      *lane
	sum     uint64
	retried bool
	// moves counts the failed tries of a move (Nack, DeadLetter) waiting
	// in place to be tried again (holds.moves holds it); 0: none.
	moves uint8
	// age is the message's slot in Consumer.ages, for the lag gauge; 0:
	// none (ages is off).
	age int32
}

// chunk is a batch of tasks for one worker. Its tasks are of different
// lanes, so any worker may run any of them. They are claimed one at a time,
// so that after the drain deadline the tasks a stuck worker has not started
// can be taken and released by another goroutine (releaseQueued). tasks does
// not change between the chunk's hand-off and its recycling.
type chunk struct {
	tasks []task
	next  atomic.Int32
}

func (ch *chunk) claim() (task, bool) {
	i := int(ch.next.Add(1)) - 1
	if i >= len(ch.tasks) {
		return task{}, false
	}
	return ch.tasks[i], true
}

// claimUpTo claims the next n tasks at most, in one step: the tasks of
// ch[i:j].
func (ch *chunk) claimUpTo(n int) (i, j int) {
	j = int(ch.next.Add(int32(n)))
	i = j - n
	return min(i, len(ch.tasks)), min(j, len(ch.tasks))
}

func (ch *chunk) exhausted() bool { return int(ch.next.Load()) >= len(ch.tasks) }

// workerState is what a worker (or the receive loop running inline) holds.
type workerState struct {
	active atomic.Pointer[chunk] // the chunk it runs; cleared under Consumer.mu
	// progress counts the handler calls started and ended (odd while a
	// handler runs); the stall watch reads it, and sets takenBit while it
	// takes ran from a worker stuck in a handler.
	progress atomic.Uint64
	ran      []ran // ran, not yet finished; see progress
	// The stall watch's view of the worker. watched: it runs a chunk of
	// several tasks, which a blocking handler could hold back; timer
	// wakes the watch stallAfter after its last look (lookAt, on the
	// monotime clock), when progress was seen.
	watched atomic.Bool
	lookAt  atomic.Int64
	seen    atomic.Uint64
	timer   *time.Timer
	done    []*ackwise.Message // finished, to recycle after Consumer.mu is released
	acks    []*ackwise.Message // of ran, to ack in one batch
	ackErrs []error            // AckBatch's errors for acks
	batch   batchState         // NewBatch's consumers: the batch being run
}

// ran is a task that ran and awaits its finish.
type ran struct {
	task
	elapsed time.Duration
	res     result // succeeded: ack before finishing; returned: release the lane behind it
}

// dispatch queues received messages behind their lane and runs the ready
// ones inline or hands them to the workers, in chunks sent after the lock
// is released. w is the receive loop's worker state, for inline runs.
//
// epoch is c.lanes.returns as the Receive that returned msgs began: a message
// whose lane had a message go back to the broker since then may have been
// received before that release, and would run ahead of the redelivery of
// the message it follows. Unless it is that redelivery, it is released too,
// unrun, and the broker redelivers it after that message (lanes dropped at
// lanes.limit forget this; see lanes.newLocked).
func (p *pool) dispatch(msgs []*ackwise.Message, w *workerState, epoch uint64) {
	c := p.c
	now := time.Time{}
	if c.leases.on || c.ages.on {
		now = c.clock.Now()
	}
	var late []*ackwise.Message
	c.mu.Lock()
	if c.stopping.Load() {
		// Received as Run was stopping: they were never in flight.
		c.mu.Unlock()
		for _, m := range msgs {
			c.release(m)
		}
		if c.recycler != nil {
			c.recycler.Recycle(msgs...)
		}
		return
	}
	c.inflight += len(msgs)
	// The ready tasks go straight into the dispatch chunk, kept for
	// dispatch alone (ReceiveBatch tasks long): run inline, it is the
	// chunk; handed off, it is cut into one chunk per worker.
	all := &p.dispatchCh
	for _, m := range msgs {
		if m.Attempt < 1 {
			m.Attempt = 1
		}
		ln := c.lanes.ofLocked(m)
		if ln != nil && ln.returnedAt > epoch {
			switch {
			case c.holds.idOf(task{msg: m}) == ln.returned:
				ln.returnedAt = 0 // the redelivery itself: it runs first
			case !ln.busy:
				c.inflight--
				late = append(late, m)
				continue
			}
			// Busy, the lane is still releasing the messages queued
			// behind the returned one (releaseLane): queued behind them
			// (below), it goes back after them, in key order. Released
			// here, it could reach the broker before them.
		}
		c.leases.startLocked(m, now)
		var age int32
		if c.ages.on { // not inlined: the branch spares the call
			age = c.ages.startLocked(m, now)
		}
		if ln != nil {
			if ln.busy {
				ln.push(m, age)
				continue
			}
			ln.busy = true
		}
		all.tasks = append(all.tasks, task{msg: m, ln: ln, age: age})
	}
	if len(late) > 0 {
		c.finishedLocked() // their in-flight slots are free
	}
	if c.bh != nil {
		p.gatherLocked(all)
	}
	if len(all.tasks) > 0 && c.pace.mode.Load() == modeInline {
		select {
		case p.slots <- struct{}{}:
			c.mu.Unlock()
			p.releaseLate(late)
			for ch := all; ch != nil; {
				ch = p.runChunk(c.handlerCtx, w, ch)
			}
			<-p.slots
			return
		default: // every slot is taken: hand off
		}
	}
	chunks := p.dispatchBuf[:0]
	p.splitLocked(all.tasks, func(ch *chunk) { chunks = append(chunks, ch) })
	p.recycleLocked(all)
	c.mu.Unlock()
	p.releaseLate(late)
	// The work queue has room for MaxInFlight chunks and every chunk holds
	// an in-flight message: these sends never block.
	for _, ch := range chunks {
		p.work <- ch
	}
	clear(chunks) // pooled chunks, but few: one per worker at most
	p.dispatchBuf = chunks
}

// releaseLate hands back the messages dispatch found late (see dispatch),
// never run, and recycles them.
func (p *pool) releaseLate(late []*ackwise.Message) {
	c := p.c
	if len(late) == 0 {
		return
	}
	for _, m := range late {
		c.release(m)
	}
	if c.recycler != nil {
		c.recycler.Recycle(late...)
	}
}

// chunkSize is the number of tasks per chunk when n are ready: one when
// handlers are slow; otherwise enough to give every worker a chunk.
func (p *pool) chunkSize(n int) int {
	c := p.c
	if c.bh != nil {
		return c.cfg.Batch.Size
	}
	if c.pace.mode.Load() == modeSingle {
		return 1
	}
	return max(1, min(maxChunk, (n+c.cfg.Concurrency-1)/c.cfg.Concurrency))
}

// queueLocked hands tasks to the workers. Called with c.mu held.
func (p *pool) queueLocked(ts ...task) {
	p.splitLocked(ts, func(ch *chunk) { p.work <- ch })
}

// splitLocked cuts ts into chunks of chunkSize tasks and passes each to
// emit. Called with c.mu held.
func (p *pool) splitLocked(ts []task, emit func(*chunk)) {
	size := p.chunkSize(len(ts))
	for len(ts) > 0 {
		k := min(size, len(ts))
		ch := p.newChunkLocked()
		ch.tasks = append(ch.tasks, ts[:k]...)
		emit(ch)
		ts = ts[k:]
	}
}

// newChunkLocked takes a chunk from the pool, or makes one. Called with
// c.mu held.
func (p *pool) newChunkLocked() *chunk {
	if n := len(p.freeChunks); n > 0 {
		ch := p.freeChunks[n-1]
		p.freeChunks[n-1] = nil
		p.freeChunks = p.freeChunks[:n-1]
		return ch
	}
	return &chunk{}
}

// recycleLocked empties ch and returns it to the pool (dispatch's own
// chunk is kept aside). Called with c.mu held.
func (p *pool) recycleLocked(ch *chunk) {
	c := p.c
	forget(c, ch.tasks)
	ch.tasks = ch.tasks[:0]
	if ch == &p.dispatchCh {
		ch.next.Store(0)
		return // dispatch's own: not pooled, its room kept
	}
	if cap(ch.tasks) > 2*maxChunk { // appends up to maxChunk tasks grow it to 2*maxChunk at most
		ch.tasks = nil
	}
	ch.next.Store(0)
	p.freeChunks = append(p.freeChunks, ch)
}

// forget clears s, which points at finished messages (and their lanes)
// that should not be kept alive, unless the source recycles messages: it
// keeps them anyway, and while the garbage collector marks, clearing costs
// a write barrier per pointer.
func forget[T any](c *Consumer, s []T) {
	if c.recycler == nil {
		clear(s)
	}
}

// run is a worker: it takes chunks off the work queue and runs them, one
// handler slot held while it does, until quit is closed.
func (p *pool) run(ctx context.Context, w *workerState, quit <-chan struct{}) {
	for {
		var ch *chunk
		select {
		case ch = <-p.work:
		case <-quit:
			return
		}
		// Visible to releaseQueued while it waits for a slot.
		w.active.Store(ch)
		select {
		case p.slots <- struct{}{}:
		case <-quit:
			// After the drain deadline. releaseQueued may have looked at
			// the workers before ch was taken off the work queue: release
			// what it has not claimed.
			p.releaseChunk(w, ch, false)
			return
		}
		for ch != nil {
			ch = p.runChunk(ctx, w, ch)
		}
		<-p.slots
	}
}

// runChunk runs the tasks of ch, acks and finishes them. It returns a chunk
// of the next messages of their lanes, for the caller to run next, or nil.
func (p *pool) runChunk(ctx context.Context, w *workerState, ch *chunk) *chunk {
	c := p.c
	if c.bh != nil {
		return p.runBatch(ctx, w, ch)
	}
	w.active.Store(ch)
	single := c.pace.mode.Load() == modeSingle
	start := monotime()
	// A chunk of one task cannot hold anything back, and a single mode
	// chunk is spread at its first claim: only the others are watched.
	watch := len(ch.tasks) > 1 && !single
	if watch {
		w.watch(start)
	}
	n := 0
	for {
		t, ok := ch.claim()
		if !ok {
			break
		}
		if single && !ch.exhausted() {
			p.spread(ch)
		}
		n++
		prog := w.progress.Add(1) // odd: in a handler; the stall watch may take w.ran
		res, elapsed := c.process(ctx, &t)
		for !w.progress.CompareAndSwap(prog, prog+1) {
			runtime.Gosched() // the stall watch is taking w.ran: a few instructions
		}
		if res != held {
			w.ran = append(w.ran, ran{t, elapsed, res})
		}
		if n == flushEvery && !ch.exhausted() {
			now := monotime()
			c.pace.sample(now-start, n)
			start, n = now, 0
			single = c.pace.mode.Load() == modeSingle
			if len(w.ran) > 0 {
				if next := p.finishRan(w, nil); next != nil {
					p.handOff(next)
				}
			}
		}
	}
	if watch {
		w.watched.Store(false)
		w.timer.Stop()
	}
	if n > 0 {
		c.pace.sample(monotime()-start, n)
	}
	return p.finishRan(w, ch)
}

// watch puts w under the stall watch from now on, as it begins a chunk:
// its timer wakes the watch once stallAfter passed.
func (w *workerState) watch(now time.Duration) {
	w.seen.Store(w.progress.Load())
	w.lookAt.Store(int64(now))
	w.watched.Store(true)
	w.timer.Reset(stallAfter)
}

// stallAfter is how long a worker may run one message of a batch before the
// stall watch hands the rest of its batch to other workers.
const stallAfter = 2 * time.Millisecond

// stallWatch guards the batched modes against a message that blocks: its
// worker (or the receive loop, inline) would hold back the messages of its
// batch not started yet, though other workers are idle, and the messages it
// ran before, which wait to be acked and finished together. It looks at a
// worker stallAfter after its last look, while the worker runs a chunk of
// several tasks (workerState.watched), and finds it stalled if it neither
// started nor ended a handler since. If its batch still has messages not
// started, it hands those to the workers one by one (spread) and falls
// back to single mode: handlers are not uniformly fast. If the worker is
// inside a handler and has finished messages waiting, it acks and finishes
// them itself.
//
// It does not tick: each worker arms its own timer as it begins a chunk
// (workerState.watch) and stops it as the chunk's last handler returns,
// which costs a timer reset and stop per chunk and no wake-up when the
// chunk ends within stallAfter. The watch wakes only for chunks that run
// longer, every stallAfter while they do; an idle consumer, or one whose
// batches are quick, never wakes it.
func (p *pool) stallWatch(quit <-chan struct{}) {
	c := p.c
	var taken [][]ran
	for {
		select {
		case <-p.watchWake:
		case <-quit:
			return
		}
		p.watchWakes.Add(1)
		now := monotime()
		// Under mu: a worker clears its active chunk under mu before the
		// chunk is recycled.
		c.mu.Lock()
		for _, w := range p.workers {
			if !w.watched.Load() || now-time.Duration(w.lookAt.Load()) < stallAfter {
				continue
			}
			prog := w.progress.Load()
			stalled := prog == w.seen.Load()
			w.seen.Store(prog)
			w.lookAt.Store(int64(now))
			if !stalled {
				continue
			}
			if ch := w.active.Load(); ch != nil && !ch.exhausted() && !c.stopping.Load() {
				c.pace.slow()
				p.spreadLocked(ch)
			}
			// Stuck in a handler with finished messages not acked yet:
			// ack and finish them here, so that they do not wait for it.
			if prog%2 == 1 && w.progress.CompareAndSwap(prog, prog|takenBit) {
				if len(w.ran) > 0 {
					taken = append(taken, w.ran)
					w.ran = nil
				}
				w.progress.Store(prog)
			}
		}
		c.mu.Unlock()
		for i, rs := range taken {
			tmp := workerState{ran: rs}
			if next := p.finishRan(&tmp, nil); next != nil {
				p.handOff(next)
			}
			taken[i] = nil
		}
		taken = taken[:0]
		// Look again at each worker still running its chunk stallAfter
		// after the last look. A worker that ended its chunk meanwhile may
		// wake the watch once more for nothing: it is no longer watched.
		now = monotime()
		for _, w := range p.workers {
			if w.watched.Load() {
				w.timer.Reset(max(time.Duration(w.lookAt.Load())+stallAfter-now, 0))
			}
		}
	}
}

// takenBit marks a worker's progress while the stall watch takes its ran.
const takenBit = 1 << 63

// spread hands the tasks of ch not yet claimed to the workers one by one:
// the handlers are slow, and other workers may be idle.
func (p *pool) spread(ch *chunk) {
	c := p.c
	c.mu.Lock()
	defer c.mu.Unlock()
	p.spreadLocked(ch)
}

// spreadLocked is spread with c.mu held.
func (p *pool) spreadLocked(ch *chunk) {
	c := p.c
	if c.stopping.Load() {
		// Draining: the owner releases them (workers may stop taking work).
		return
	}
	for {
		t, ok := ch.claim()
		if !ok {
			return
		}
		nc := p.newChunkLocked()
		nc.tasks = append(nc.tasks, t)
		p.work <- nc
	}
}

// handOff gives next, lane successors found in the middle of a chunk, to the
// workers; during the drain it releases them at once instead, since workers
// may have stopped taking work.
func (p *pool) handOff(next *chunk) {
	if !p.c.stopping.Load() {
		p.work <- next
		return
	}
	p.releaseChunk(nil, next, false)
}

// finishRan acks the successes among the messages w ran, then finishes them
// all under one lock. It returns the next messages of their lanes as a
// chunk, or nil. When done is not nil, w is done with that chunk, and it is
// recycled.
//
// The messages behind a returned message in its lane are released, not
// run: the broker redelivers them after it, so its key keeps its order.
func (p *pool) finishRan(w *workerState, done *chunk) *chunk {
	c := p.c
	p.ackRan(w)
	c.mu.Lock()
	var next, drop *chunk
	if len(w.ran) > 0 {
		for i := range w.ran {
			r := &w.ran[i]
			if c.recycler != nil && !c.leases.holdsLocked(r.msg) {
				w.done = append(w.done, r.msg)
			}
			if r.res == returned && r.ln != nil {
				r.ln.returnedAt, r.ln.returned = c.lanes.returns.Add(1), c.holds.idOf(r.task)
			}
			if nt, ok := c.finishLocked(&r.task); ok {
				if r.res == returned {
					if drop == nil {
						drop = p.newChunkLocked()
					}
					drop.tasks = append(drop.tasks, nt)
					continue
				}
				if next == nil {
					next = p.newChunkLocked()
				}
				next.tasks = append(next.tasks, nt)
			}
		}
		c.finishedLocked()
		forget(c, w.ran)
		w.ran = w.ran[:0]
	}
	if done != nil {
		w.active.Store(nil)
		p.recycleLocked(done)
	}
	c.mu.Unlock()
	if len(w.done) > 0 {
		c.recycler.Recycle(w.done...)
		// Not cleared: recycled messages are the source's to keep.
		w.done = w.done[:0]
	}
	if drop != nil {
		// Their lanes stay busy until the last message queued is released:
		// one received meanwhile is queued, and released too, and the lane
		// is marked again as it goes idle (see Consumer.finishOne).
		p.releaseChunk(nil, drop, true)
	}
	return next
}

// ackRan acks the messages of w.ran whose handlers succeeded: in one
// batch when the source acks batches.
func (p *pool) ackRan(w *workerState) {
	c := p.c
	if c.acker == nil {
		for i := range w.ran {
			if r := &w.ran[i]; r.res == succeeded {
				r.res = c.settle(r.task, Acked, r.elapsed, c.src.Ack(c.settleCtx, r.msg))
			}
		}
		return
	}
	for _, r := range w.ran {
		if r.res == succeeded {
			w.acks = append(w.acks, r.msg)
		}
	}
	if len(w.acks) == 0 {
		return
	}
	if cap(w.ackErrs) < len(w.acks) {
		w.ackErrs = make([]error, len(w.acks), cap(w.acks))
	}
	errs := w.ackErrs[:len(w.acks)]
	c.acker.AckBatch(c.settleCtx, w.acks, errs)
	i, acked, failed := 0, 0, false
	for j := range w.ran {
		r := &w.ran[j]
		if r.res != succeeded {
			continue
		}
		if errs[i] != nil {
			failed = true
			r.res = c.settle(r.task, Acked, r.elapsed, errs[i])
		} else {
			if c.holds.nFailed.Load() > 0 { // not inlined: spare the call and the copy
				c.holds.settledOK(r.task)
			}
			if c.cfg.Observer == nil {
				acked++ // counted at once below
			} else {
				c.observe(r.msg, Acked, r.elapsed)
			}
		}
		i++
	}
	if acked > 0 {
		c.stats.outcomes[Acked].Add(uint64(acked))
	}
	if failed {
		clear(errs)
	}
	forget(c, w.acks)
	w.acks = w.acks[:0]
}

// releaseChunk releases the tasks of ch that nobody claimed, with the
// messages behind them in their lanes, and recycles ch. w, when not nil, is
// the worker whose active chunk ch is; remark as for Consumer.finishOne.
func (p *pool) releaseChunk(w *workerState, ch *chunk, remark bool) {
	c := p.c
	for t, ok := ch.claim(); ok; t, ok = ch.claim() {
		c.releaseLane(t, remark)
	}
	c.mu.Lock()
	if w != nil {
		w.active.Store(nil)
	}
	p.recycleLocked(ch)
	c.mu.Unlock()
}

// releaseQueued releases, after the drain deadline, every message not
// started: those of the chunks on the work queue, those stuck workers (or
// the receive loop) have not claimed from their chunks, and every message
// behind them in their lanes.
func (p *pool) releaseQueued() {
	c := p.c
	var ts []task
	c.mu.Lock()
	for _, w := range p.workers {
		if ch := w.active.Load(); ch != nil {
			for t, ok := ch.claim(); ok; t, ok = ch.claim() {
				ts = append(ts, t)
			}
		}
	}
	c.mu.Unlock()
	for drained := false; !drained; {
		select {
		case ch := <-p.work:
			for t, ok := ch.claim(); ok; t, ok = ch.claim() {
				ts = append(ts, t)
			}
			c.mu.Lock()
			p.recycleLocked(ch)
			c.mu.Unlock()
		default:
			drained = true
		}
	}
	for _, t := range ts {
		c.releaseLane(t, false)
	}
}

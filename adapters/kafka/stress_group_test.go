package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

// groupStressSeeds is how many seeds TestStressGroup runs; each is a
// subtest named seed=N, replayed with -run 'TestStressGroup/seed=N$'.
const groupStressSeeds = 16

// Record classes of the group stress test, fixed per record: its outcome
// depends on the record and on how often it ran before, never on timing.
const (
	gclassGood     = iota // succeeds
	gclassFlaky           // fails transiently once or twice, then succeeds
	gclassPoison          // fails permanently: dead-lettered
	gclassHopeless        // always fails transiently: dead-lettered at max-attempts
)

var gclassNames = [...]string{"good", "flaky", "poison", "hopeless"}

// TestStressGroup runs the engine on the Kafka consumer-group source
// against kfake under seeded random conditions: 1-4 partitions, keys,
// Concurrency, retries in place or through 1-2 short retry tiers, handler
// outcomes of every class, 1-3 members joining and leaving midway
// (rebalances), and windows where kfake refuses produces to the dead-letter
// or retry topics (the moves fail and are tried again in place). It checks,
// mostly from the broker's side once every member drained:
//   - every good or flaky record was acked after a success and never
//     dead-lettered; every poison or hopeless record was dead-lettered
//     exactly once, with its reason, payload, key and headers intact, and
//     never handled successfully; retry topics hold only records that
//     failed transiently, payload intact;
//   - no delivery is both acked and dead-lettered, an ack follows a
//     success of that delivery and a dead letter a failure of it;
//   - the group's committed offsets are at the end of every partition of
//     the topic and of its retry topics;
//   - no handler acked a record after its member lost the partition;
//   - order: with retries in place and one member, each key's first
//     successful effects come in offset order. With rebalances a new owner
//     repeats what the old one handled and had not committed, and retry
//     topics give up per-key order for the records they carry, so what is
//     checked then is weaker: the first successful effects, on each member,
//     of each key's good records (never moved) come in offset order;
//   - every member drains and Close returns.
func TestStressGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("group stress test (-short)")
	}
	t.Parallel()
	for seed := uint64(1); seed <= groupStressSeeds; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			stressGroup(t, seed)
		})
	}
}

// groupRecord is what the test knows of a published record.
type groupRecord struct {
	id, key string
	part    int32
	off     int64
	class   int
	fails   int // gclassFlaky: failures before the first success
	payload []byte
}

// groupWorld is the handlers' and the observer's shared record of what ran.
type groupWorld struct {
	recs map[string]*groupRecord // by event ID; read-only once running
	work time.Duration           // each handler run's work

	mu      sync.Mutex
	calls   map[string]int             // handler calls per event ID
	last    map[*ackwise.Message]error // each delivery's last handler result
	done    map[*ackwise.Message]consumer.Outcome
	acked   map[string]bool
	dead    map[string]int // dead-lettered deliveries per event ID
	effects map[string][]string
	// memberEffects lists, per member and key, the event IDs of the good
	// records in the order of their first successful run on that member.
	memberEffects map[string][]string
	finished      int // records acked or dead-lettered (each counted once)
	byMember      map[string]int
	failedMoves   int
	bad           []string
	changed       chan struct{}
}

func (w *groupWorld) fail(format string, args ...any) {
	w.bad = append(w.bad, fmt.Sprintf(format, args...))
}

func (w *groupWorld) handler(who string) ackwise.Handler {
	return ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		time.Sleep(w.work) // the handler's work, not synchronization
		r := w.recs[m.ID]
		w.mu.Lock()
		defer w.mu.Unlock()
		w.byMember[who]++
		select {
		case w.changed <- struct{}{}:
		default:
		}
		if r == nil {
			w.fail("%s handled %q, which was never published", who, m.ID)
			return nil
		}
		if o, ok := w.done[m]; ok {
			w.fail("%s@%s/%d attempt %d handled again after its delivery was %v", m.ID, m.Source, m.Offset, m.Attempt, o)
		}
		w.calls[m.ID]++
		var err error
		switch r.class {
		case gclassFlaky:
			if w.calls[m.ID] <= r.fails {
				err = errors.New("flaky dependency")
			}
		case gclassPoison:
			err = ackwise.Permanent(errors.New("poison"))
		case gclassHopeless:
			err = errors.New("never works")
		}
		w.last[m] = err
		if err == nil {
			if !slices.Contains(w.effects[r.key], m.ID) {
				w.effects[r.key] = append(w.effects[r.key], m.ID)
			}
			lane := who + "/" + r.key
			if r.class == gclassGood && !slices.Contains(w.memberEffects[lane], m.ID) {
				w.memberEffects[lane] = append(w.memberEffects[lane], m.ID)
			}
		}
		return err
	})
}

func (w *groupWorld) Observe(m *ackwise.Message, o consumer.Outcome, _ time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if o == consumer.SettleFailed {
		w.failedMoves++
		return
	}
	if o != consumer.Acked && o != consumer.DeadLettered {
		return
	}
	err, ran := w.last[m]
	if prev, ok := w.done[m]; ok {
		w.fail("%s@%s/%d attempt %d %v after its delivery was %v", m.ID, m.Source, m.Offset, m.Attempt, o, prev)
	}
	w.done[m] = o
	switch {
	case o == consumer.Acked && (!ran || err != nil):
		w.fail("%s@%s/%d attempt %d acked, but its delivery's last run returned %v (ran: %t)", m.ID, m.Source, m.Offset, m.Attempt, err, ran)
	case o == consumer.DeadLettered && (!ran || err == nil):
		w.fail("%s@%s/%d attempt %d dead-lettered, but its delivery's last run returned %v (ran: %t)", m.ID, m.Source, m.Offset, m.Attempt, err, ran)
	}
	first := !w.acked[m.ID] && w.dead[m.ID] == 0
	if o == consumer.Acked {
		w.acked[m.ID] = true
	} else {
		w.dead[m.ID]++
	}
	if first {
		w.finished++
		select {
		case w.changed <- struct{}{}:
		default:
		}
	}
}

// await waits until cond holds of w, locked.
func (w *groupWorld) await(t *testing.T, what string, deadline <-chan time.Time, cond func() bool) {
	t.Helper()
	for {
		w.mu.Lock()
		ok, n := cond(), w.finished
		w.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-w.changed:
		case <-deadline:
			t.Fatalf("timed out waiting for %s (%d of %d records finished)", what, n, len(w.recs))
		}
	}
}

// awaitFinished waits until at least k records were acked or dead-lettered.
func (w *groupWorld) awaitFinished(t *testing.T, k int, deadline <-chan time.Time) {
	t.Helper()
	w.await(t, fmt.Sprintf("%d records finished", k), deadline, func() bool { return w.finished >= k })
}

// groupEvent is a step of a seed's schedule, taken once threshold records
// finished: a member joins or leaves, or an outage window opens.
type groupEvent struct {
	threshold int
	join      int // member to start, or -1
	leave     int // member to stop, or -1
	outage    time.Duration
}

func stressGroup(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x9a0c))
	var (
		parts       = 1 + rng.IntN(4)
		keys        = 3 + rng.IntN(10)
		n           = 60 + rng.IntN(60)
		members     = 1 + rng.IntN(3)
		concurrency = 1 + rng.IntN(8)
		work        = time.Duration(4+rng.IntN(7)) * time.Millisecond
		broker      = rng.IntN(2) == 0
		tiers       []time.Duration
	)
	if broker {
		tiers = []time.Duration{20 * time.Millisecond}
		if rng.IntN(2) == 0 {
			tiers = append(tiers, 50*time.Millisecond)
		}
	}
	// The schedule: members 1.. join at rising thresholds; member 0 may
	// leave after the last join; 0-3 outage windows.
	var events []groupEvent
	for i := 1; i < members; i++ {
		events = append(events, groupEvent{threshold: i * n / (members + 1), join: i, leave: -1})
	}
	leaves := members > 1 && rng.IntN(2) == 0
	if leaves {
		events = append(events, groupEvent{threshold: members * n / (members + 1), join: -1, leave: 0})
	}
	outages := rng.IntN(4)
	for range outages {
		events = append(events, groupEvent{threshold: rng.IntN(n * 3 / 4), join: -1, leave: -1, outage: time.Duration(50+rng.IntN(250)) * time.Millisecond})
	}
	slices.SortStableFunc(events, func(a, b groupEvent) int { return a.threshold - b.threshold })
	rebalances := members > 1
	mode := "in-place"
	if broker {
		mode = fmt.Sprintf("retry topics %v", tiers)
	}
	t.Logf("seed %d: %d partitions, %d keys, %d records, %d members (first leaves: %t), concurrency %d, work %v, %s, %d outage windows", seed, parts, keys, n, members, leaves, concurrency, work, mode, outages)
	t.Logf("replay: go test -race ./adapters/kafka -run 'TestStressGroup/seed=%d$' -v", seed)

	c := newKfake(t)
	brokers := c.ListenAddrs()
	cfg := testConfig(t, brokers, int32(parts), tiers...)
	cfg.Options = fastGroup
	cfg.RevokeTimeout = 2 * time.Second
	topics := cfg.Topics()
	moved := topics[1:] // the retry topics and the dead-letter topic

	w := &groupWorld{recs: map[string]*groupRecord{}, work: work, byMember: map[string]int{}, calls: map[string]int{}, last: map[*ackwise.Message]error{},
		done: map[*ackwise.Message]consumer.Outcome{}, acked: map[string]bool{}, dead: map[string]int{},
		effects: map[string][]string{}, memberEffects: map[string][]string{}, changed: make(chan struct{}, 1)}
	msgs := make([]*ackwise.Message, n)
	var counts [4]int
	for i := range msgs {
		r := &groupRecord{id: "ev-" + strconv.Itoa(i), key: "k" + strconv.Itoa(rng.IntN(keys)), payload: fmt.Appendf(nil, "payload-%d-%x", i, rng.Uint64())}
		switch p := rng.IntN(10); {
		case p < 6:
			r.class = gclassGood
		case p < 8:
			r.class, r.fails = gclassFlaky, 1+rng.IntN(2)
		case p < 9:
			r.class = gclassPoison
		default:
			r.class = gclassHopeless
		}
		counts[r.class]++
		w.recs[r.id] = r
		msgs[i] = &ackwise.Message{ID: r.id, Key: r.key, Payload: r.payload, Headers: ackwise.HeadersOf("x-seq", strconv.Itoa(i))}
	}
	t.Logf("classes: %d good, %d flaky, %d poison, %d hopeless", counts[0], counts[1], counts[2], counts[3])
	pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer pcancel()
	if err := openSink(t, cfg).Publish(pctx, msgs...); err != nil {
		t.Fatal(err)
	}
	for _, r := range readAll(pctx, t, brokers, cfg.Topic) { // where each record landed
		rec := w.recs[recordMessage(r).ID]
		rec.part, rec.off = r.Partition, r.Offset
	}

	var refusing atomic.Bool
	for _, topic := range moved {
		refuseProducesTo(t, c, topic, &refusing)
	}

	ccfg := consumer.Config{Concurrency: concurrency, DrainTimeout: 5 * time.Second, Observer: w,
		Retry: retry.Policy{MaxAttempts: 3, InitialInterval: 5 * time.Millisecond, Jitter: retry.NoJitter}}
	if broker {
		ccfg.RetryMode = consumer.RetryBroker
		ccfg.Retry = retry.Policy{MaxAttempts: 3} // the tiers are the schedule
	} else {
		ccfg.RetryMode = consumer.RetryInPlace
	}
	var late atomic.Int64
	running := make([]*member, members)
	start := func(i int) {
		running[i] = startMember(t, cfg, w.handler("m"+strconv.Itoa(i)), &late, ccfg)
	}
	// stop stops member i and fails if it does not drain and close in time.
	stop := func(i int) {
		done := make(chan struct{})
		go func() {
			running[i].stop()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Fatalf("member %d did not drain and close within 15s", i)
		}
	}

	deadline := time.After(30 * time.Second)
	start(0)
	var windows sync.WaitGroup
	for _, e := range events {
		w.awaitFinished(t, e.threshold, deadline)
		switch {
		case e.join >= 0:
			// A join counts once the member handled a record: the
			// group rebalanced with work left.
			start(e.join)
			who := "m" + strconv.Itoa(e.join)
			w.await(t, who+"'s first record", deadline, func() bool { return w.byMember[who] > 0 || w.finished == n })
		case e.leave >= 0:
			stop(e.leave)
		default:
			refusing.Store(true)
			windows.Add(1)
			time.AfterFunc(e.outage, func() { // the fault's length, not synchronization
				refusing.Store(false)
				windows.Done()
			})
		}
	}
	w.awaitFinished(t, n, deadline)
	windows.Wait()

	// Every record finished: the commits reach the ends of the topic and
	// of the retry topics (a retry topic's copy of a record already
	// finished may still be in flight).
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	adm, closeAdm := newAdmin(t, brokers)
	defer closeAdm()
	consumed := topics[:len(topics)-1]
	ends, err := adm.ListEndOffsets(ctx, consumed...)
	if err != nil {
		t.Fatal(err)
	}
	behind := func() []string {
		offs, err := adm.FetchOffsets(ctx, cfg.Group)
		if err != nil {
			t.Fatalf("fetch offsets: %v", err)
		}
		var out []string
		ends.Each(func(e kadm.ListedOffset) {
			o, ok := offs.Lookup(e.Topic, e.Partition)
			at := int64(-1)
			if ok {
				at = o.At
			}
			if e.Offset > 0 && at != e.Offset {
				out = append(out, fmt.Sprintf("%s/%d at %d of %d", e.Topic, e.Partition, at, e.Offset))
			}
		})
		return out
	}
	for b := behind(); len(b) > 0; b = behind() {
		select { // the broker offers no notification of commits
		case <-ctx.Done():
			t.Fatalf("commits behind the ends: %v", b)
		case <-time.After(20 * time.Millisecond):
		}
	}
	for i := range running {
		if running[i] != nil {
			stop(i)
		}
	}
	if b := behind(); len(b) > 0 {
		t.Fatalf("commits behind the ends after the members closed: %v", b)
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	for _, b := range w.bad {
		t.Error(b)
	}
	t.Logf("%d handler calls (per member %v), %d failed moves tried again, %d late acks", sumValues(w.calls), w.byMember, w.failedMoves, late.Load())
	if l := late.Load(); l != 0 {
		t.Errorf("%d records were acked after their member lost the partition", l)
	}

	// What the broker holds.
	dead := map[string]int{}
	for _, r := range readAll(ctx, t, brokers, topics[len(topics)-1]) {
		m := recordMessage(r)
		rec := w.recs[m.ID]
		if rec == nil {
			t.Errorf("dead letter %q was never published", m.ID)
			continue
		}
		dead[m.ID]++
		checkIntact(t, "dead letter", m, rec)
		env, err := dlq.Decode(m.Headers)
		if err != nil {
			t.Errorf("dead letter %s: %v", m.ID, err)
			continue
		}
		want := dlq.ReasonPermanent
		if rec.class == gclassHopeless {
			want = dlq.ReasonMaxAttempts
		}
		if env.Reason != want || env.Source != cfg.Topic {
			t.Errorf("dead letter %s (%s): reason %q source %q, want %q from %s", m.ID, gclassNames[rec.class], env.Reason, env.Source, want, cfg.Topic)
		}
	}
	for _, topic := range topics[1 : len(topics)-1] {
		for _, r := range readAll(ctx, t, brokers, topic) {
			m := recordMessage(r)
			rec := w.recs[m.ID]
			if rec == nil || rec.class == gclassGood || rec.class == gclassPoison {
				t.Errorf("retry topic %s holds %q, which never failed transiently", topic, m.ID)
				continue
			}
			checkIntact(t, "retry hop", m, rec)
		}
	}
	for id, rec := range w.recs {
		switch rec.class {
		case gclassGood, gclassFlaky:
			if !w.acked[id] || dead[id] != 0 || w.dead[id] != 0 {
				t.Errorf("%s (%s): acked %t, %d dead letters (%d observed)", id, gclassNames[rec.class], w.acked[id], dead[id], w.dead[id])
			}
		default:
			if w.acked[id] || dead[id] != 1 || slices.Contains(w.effects[rec.key], id) {
				t.Errorf("%s (%s): acked %t, %d dead letters (%d observed), want one", id, gclassNames[rec.class], w.acked[id], dead[id], w.dead[id])
			}
		}
	}

	// Order.
	inOrder := func(what string, ids []string) {
		for i := 1; i < len(ids); i++ {
			a, b := w.recs[ids[i-1]], w.recs[ids[i]]
			if a.part == b.part && a.off > b.off {
				t.Errorf("%s: %s (offset %d) before %s (offset %d): %v", what, a.id, a.off, b.id, b.off, ids)
				return
			}
		}
	}
	if !broker && !rebalances {
		for key, ids := range w.effects {
			inOrder("key "+key+" first effects", ids)
		}
	}
	for lane, ids := range w.memberEffects {
		inOrder(lane+" good records' first effects", ids)
	}
}

// checkIntact checks that m, a copy of rec moved by the engine, kept its
// payload, key and headers.
func checkIntact(t *testing.T, what string, m *ackwise.Message, rec *groupRecord) {
	t.Helper()
	if !bytes.Equal(m.Payload, rec.payload) || m.Key != rec.key || m.Headers.Get("x-seq") != rec.id[len("ev-"):] {
		t.Errorf("%s %s: payload %q key %q x-seq %q, want %q %q %q", what, rec.id, m.Payload, m.Key, m.Headers.Get("x-seq"), rec.payload, rec.key, rec.id[len("ev-"):])
	}
}

func sumValues(m map[string]int) int {
	s := 0
	for _, v := range m {
		s += v
	}
	return s
}

// newAdmin returns an admin client of the cluster and its close.
func newAdmin(t *testing.T, brokers []string) (*kadm.Client, func()) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	return kadm.NewClient(cl), cl.Close
}

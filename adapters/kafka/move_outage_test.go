package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
)

// The engine tries a failed move (Nack, DeadLetter) of a record still
// this member's again in place: the tests below check it on a consumer-
// group source, with the destination topic refusing produces for a while.

// refuseProducesTo makes c refuse, while refusing holds, every produce
// request that writes to topic (TOPIC_AUTHORIZATION_FAILED, which the
// client does not retry).
func refuseProducesTo(t *testing.T, c *kfake.Cluster, topic string, refusing *atomic.Bool) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	td, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil || td[topic].Err != nil {
		t.Fatalf("list %s: %v %v", topic, err, td[topic].Err)
	}
	id := td[topic].ID // Produce v13 names topics by ID
	c.ControlKey(kmsg.Produce.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.ProduceRequest)
		if !refusing.Load() || !slices.ContainsFunc(r.Topics, func(t kmsg.ProduceRequestTopic) bool { return t.Topic == topic || t.TopicID == id }) {
			return nil, nil, false
		}
		return refusedProduce(r), nil, true
	})
}

// refusedProduce answers r with TOPIC_AUTHORIZATION_FAILED for every
// partition it writes to: an error the client does not retry.
func refusedProduce(r *kmsg.ProduceRequest) *kmsg.ProduceResponse {
	resp := r.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range r.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = 29
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// badOutcomes is a consumer.Observer that sends the outcomes of the record
// with ID "bad", each with whether it was still valid then.
type badOutcomes struct {
	src *Source
	ch  chan badOutcome
}

type badOutcome struct {
	o     consumer.Outcome
	valid bool
}

func (b badOutcomes) Observe(m *ackwise.Message, o consumer.Outcome, _ time.Duration) {
	if m.ID == "bad" {
		b.ch <- badOutcome{o, b.src.Valid(m)}
	}
}

func (b badOutcomes) next(t *testing.T) badOutcome {
	t.Helper()
	select {
	case o := <-b.ch:
		return o
	case <-time.After(15 * time.Second):
		t.Fatal("no outcome of the bad record within 15s")
		return badOutcome{}
	}
}

// awaitFailedTries waits for n failed tries of the bad record's move, the
// record still valid at each.
func (b badOutcomes) awaitFailedTries(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		if o := b.next(t); o.o != consumer.SettleFailed || !o.valid {
			t.Fatalf("try %d: outcome %v (valid %v), want settle-failed with the record still this member's", i+1, o.o, o.valid)
		}
	}
}

// outage is a group source on two partitions holding ten records of other
// keys, the record "bad", and ten more; produces to one topic of its
// chain refused while refusing holds.
type outage struct {
	brokers  []string
	cfg      SourceConfig
	src      *Source
	log      badOutcomes
	refusing atomic.Bool

	mu      sync.Mutex
	handled map[string]int   // runs per record ID
	attempt map[string][]int // attempts seen per record ID
	ends    map[int32]int64  // per partition of Topic, the offset after the last record handled
	bad     [2]int64         // partition, offset of "bad"
	changed chan struct{}    // a record was handled
}

func newOutage(t *testing.T, refuse func(cfg SourceConfig) string, tiers ...time.Duration) *outage {
	t.Helper()
	return newOutageWith(t, nil, refuse, tiers...)
}

// newOutageWith is newOutage with opts as the source's client options,
// unchecked (SourceConfig.testOptions: they may wrap its callbacks).
func newOutageWith(t *testing.T, opts []kgo.Opt, refuse func(cfg SourceConfig) string, tiers ...time.Duration) *outage {
	t.Helper()
	c := newKfake(t)
	o := &outage{brokers: c.ListenAddrs(), handled: map[string]int{}, ends: map[int32]int64{}, changed: make(chan struct{}, 1), attempt: map[string][]int{}}
	o.cfg = testConfig(t, o.brokers, 2, tiers...)
	var msgs []*ackwise.Message
	for i := range 21 {
		id, key := fmt.Sprintf("g-%d", i), fmt.Sprintf("k%d", i)
		if i == 10 {
			id, key = "bad", "bad"
		}
		msgs = append(msgs, &ackwise.Message{ID: id, Key: key, Payload: []byte(id)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := openSink(t, o.cfg).Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	srcCfg := o.cfg
	srcCfg.testOptions = opts
	o.src = openSource(t, srcCfg)
	o.log = badOutcomes{o.src, make(chan badOutcome, 256)}
	o.refusing.Store(true)
	refuseProducesTo(t, c, refuse(o.cfg), &o.refusing)
	return o
}

// handle records m's run.
func (o *outage) handle(m *ackwise.Message) {
	o.mu.Lock()
	o.handled[m.ID]++
	o.attempt[m.ID] = append(o.attempt[m.ID], m.Attempt)
	if m.Source == o.cfg.Topic {
		o.ends[m.Partition] = max(o.ends[m.Partition], m.Offset+1)
		if m.ID == "bad" {
			o.bad = [2]int64{int64(m.Partition), m.Offset}
		}
	}
	o.mu.Unlock()
	select {
	case o.changed <- struct{}{}:
	default:
	}
}

// awaitOthers waits until the 20 records of other keys were handled, and
// returns the bad record's partition and offset and the partitions' ends.
func (o *outage) awaitOthers(t *testing.T) (p int32, off int64, ends map[int32]int64) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		o.mu.Lock()
		n := len(o.handled)
		if _, ok := o.handled["bad"]; ok {
			n--
		}
		if n == 20 {
			defer o.mu.Unlock()
			ends = map[int32]int64{}
			for k, v := range o.ends {
				ends[k] = v
			}
			return int32(o.bad[0]), o.bad[1], ends
		}
		o.mu.Unlock()
		select {
		case <-o.changed:
		case <-deadline:
			t.Fatalf("%d of the 20 other records handled while the bad record's move waits", n)
		}
	}
}

func (o *outage) runs(id string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.handled[id]
}

// runTimed runs the engine on o's source with h until stop, which returns
// Run's error and how long Run took to return once asked to stop.
func (o *outage) runTimed(t *testing.T, h ackwise.Handler, cfg consumer.Config) (stop func() (error, time.Duration)) {
	t.Helper()
	cfg.Observer = o.log
	cons, err := consumer.New(o.src, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	var once sync.Once
	var runErr error
	var took time.Duration
	stop = func() (error, time.Duration) {
		once.Do(func() {
			start := time.Now()
			cancel()
			runErr = <-done
			took = time.Since(start)
		})
		return runErr, took
	}
	t.Cleanup(func() { _, _ = stop() })
	return stop
}

// heldCommit checks, while the bad record's move waits, that the other
// records were handled and committed: their partition to its end, the bad
// record's partition up to the bad record and not past it. It returns the
// bad record's partition and offset and the partitions' ends.
func (o *outage) heldCommit(t *testing.T) (p int32, off int64, ends map[int32]int64) {
	t.Helper()
	p, off, ends = o.awaitOthers(t)
	if off == 0 || len(ends) != 2 {
		// The partitioning of the keys is fixed: this is the test's setup.
		t.Fatalf("bad record at %d/%d, partitions %v: want records before it on its partition and records on the other", p, off, ends)
	}
	waitCommitted(t, o.brokers, o.cfg.Group, o.cfg.Topic, p, off)
	waitCommitted(t, o.brokers, o.cfg.Group, o.cfg.Topic, 1-p, ends[1-p])
	// Still waiting, after commits had time to pass it.
	o.log.awaitFailedTries(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got := committed(ctx, t, o.brokers, o.cfg.Group, o.cfg.Topic, p); got != off {
		t.Fatalf("committed offset of partition %d is %d while the record at %d waits for its move", p, got, off)
	}
	return p, off, ends
}

// badFailsPermanently is a handler that records each run and fails the
// record "bad" permanently.
func (o *outage) badFailsPermanently() ackwise.Handler {
	return ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		o.handle(m)
		if m.ID == "bad" {
			return ackwise.Permanent(errors.New("bad payload"))
		}
		return nil
	})
}

// TestDeadLetterOutageHoldsOnlyItsRecord: the dead-letter topic refuses
// produces: the record waits in place (valid, handler run once), the
// records of other keys and of the other partition are handled and
// committed, its partition's commit stays at it; once produces pass, it is
// dead-lettered once and the commit passes it.
func TestDeadLetterOutageHoldsOnlyItsRecord(t *testing.T) {
	t.Parallel()
	o := newOutage(t, func(cfg SourceConfig) string { return cfg.Topics()[1] })
	h := o.badFailsPermanently()
	o.runTimed(t, h, consumer.Config{Concurrency: 4})
	o.log.awaitFailedTries(t, 2)
	p, _, ends := o.heldCommit(t)

	o.refusing.Store(false)
	for b := o.log.next(t); b.o != consumer.DeadLettered; b = o.log.next(t) {
		if b.o != consumer.SettleFailed || !b.valid {
			t.Fatalf("outcome %v (valid %v) before the dead letter was written", b.o, b.valid)
		}
	}
	waitCommitted(t, o.brokers, o.cfg.Group, o.cfg.Topic, p, ends[p])
	if n := o.runs("bad"); n != 1 {
		t.Errorf("bad record handled %d times, want once", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dls := readAll(ctx, t, o.brokers, o.cfg.Topics()[1])
	if len(dls) != 1 || recordMessage(dls[0]).ID != "bad" {
		t.Fatalf("dead letters %v, want the bad record once", dls)
	}
}

// TestRetryTopicOutageHoldsOnlyItsRecord: the same for a Nack to a retry
// topic refusing produces (RetryBroker): once the retry topic takes it, the
// record is committed past on its topic and comes back from the retry
// topic for its second run.
func TestRetryTopicOutageHoldsOnlyItsRecord(t *testing.T) {
	t.Parallel()
	o := newOutage(t, func(cfg SourceConfig) string { return cfg.Topics()[1] }, 50*time.Millisecond)
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		o.handle(m)
		if m.ID == "bad" && m.Attempt == 1 {
			return errors.New("dependency down")
		}
		return nil
	})
	o.runTimed(t, h, consumer.Config{Concurrency: 4, RetryMode: consumer.RetryBroker})
	o.log.awaitFailedTries(t, 2)
	p, _, ends := o.heldCommit(t)

	o.refusing.Store(false)
	for b := o.log.next(t); b.o != consumer.Retried; b = o.log.next(t) {
		if b.o != consumer.SettleFailed || !b.valid {
			t.Fatalf("outcome %v (valid %v) before the nack was made", b.o, b.valid)
		}
	}
	if b := o.log.next(t); b.o != consumer.Acked {
		t.Fatalf("outcome %v from the retry topic, want acked", b.o)
	}
	waitCommitted(t, o.brokers, o.cfg.Group, o.cfg.Topic, p, ends[p])
	o.mu.Lock()
	attempts := o.attempt["bad"]
	o.mu.Unlock()
	if !slices.Equal(attempts, []int{1, 2}) {
		t.Errorf("bad record ran at attempts %v, want [1 2]", attempts)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if rs := readAll(ctx, t, o.brokers, o.cfg.Topics()[1]); len(rs) != 1 || recordMessage(rs[0]).ID != "bad" {
		t.Fatalf("retry topic holds %v, want the bad record once", rs)
	}
}

// TestStopWhileMoveWaitsGroup: Run is stopped while the dead letter waits
// to be tried again: Run returns without waiting for it, nothing is
// committed past the record, nothing is dead-lettered, and the next member
// of the group gets it. The engine's clock is virtual and stands still: a
// Run waiting for the move's next try would not return at all (the test
// fails after a generous wait, then lets the clock move so that Run ends).
func TestStopWhileMoveWaitsGroup(t *testing.T) {
	t.Parallel()
	o := newOutage(t, func(cfg SourceConfig) string { return cfg.Topics()[1] })
	h := o.badFailsPermanently()
	clock := memory.NewVirtualClock(time.Time{})
	stop := o.runTimed(t, h, consumer.Config{Concurrency: 4, DrainTimeout: time.Minute, Clock: clock})
	o.log.awaitFailedTries(t, 1) // the next try waits on the virtual clock
	p, off, _ := o.awaitOthers(t)
	if n := o.runs("bad"); n != 1 {
		t.Fatalf("bad record handled %d times while its dead letter failed, want once", n)
	}
	stopped := make(chan error, 1)
	go func() {
		err, _ := stop()
		stopped <- err
	}()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		clock.Advance(time.Hour)
		<-stopped
		t.Fatal("Run did not return within 20s: it waited for the move's next try")
	}
	if err := o.src.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got := committed(ctx, t, o.brokers, o.cfg.Group, o.cfg.Topic, p); got > off {
		t.Fatalf("committed offset of partition %d is %d, past the unsettled record at %d", p, got, off)
	}
	if dls := readAll(ctx, t, o.brokers, o.cfg.Topics()[1]); len(dls) != 0 {
		t.Fatalf("dead letters %v after the stop", dls)
	}
	next := openSource(t, o.cfg)
	for {
		m := receiveN(t, next, 1)[0]
		if m.ID == "bad" {
			if m.Partition != p || m.Offset != off {
				t.Fatalf("bad record redelivered at %d/%d, want %d/%d", m.Partition, m.Offset, p, off)
			}
			break
		}
		if m.Partition != p || m.Offset < off {
			t.Fatalf("next member got %s at %d/%d: committed and should not come back", m.ID, m.Partition, m.Offset)
		}
	}
}

package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

// lateAcks counts acks refused because the record's partition was gone: a
// handler that ran on a record after its member lost the partition.
type lateAcks struct {
	adapters.Source
	late *atomic.Int64
}

func (s lateAcks) Ack(ctx context.Context, m *ackwise.Message) error {
	err := s.Source.Ack(ctx, m)
	if errors.Is(err, adapters.ErrReceiptInvalid) {
		s.late.Add(1)
	}
	return err
}

// Extensions drops BatchAcker, whose AckBatch would ack around
// lateAcks.Ack, and Recycler: the group tests' observers tell deliveries
// apart by their *Message, which a recycled message would reuse.
func (s lateAcks) Extensions() adapters.Extensions {
	ext := s.Source.Extensions()
	ext.BatchAcker, ext.Recycler = nil, nil
	return ext
}

// tally records handled IDs and wakes waiters.
type tally struct {
	mu      sync.Mutex
	seen    map[string]int
	changed chan struct{}
}

func newTally() *tally { return &tally{seen: map[string]int{}, changed: make(chan struct{}, 1)} }

func (c *tally) add(id string) {
	c.mu.Lock()
	c.seen[id]++
	c.mu.Unlock()
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

func (c *tally) wait(t *testing.T, what string, d time.Duration, cond func(seen map[string]int) bool) {
	t.Helper()
	deadline := time.After(d)
	for {
		c.mu.Lock()
		ok := cond(c.seen)
		c.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-c.changed:
		case <-deadline:
			c.mu.Lock()
			n := len(c.seen)
			c.mu.Unlock()
			t.Fatalf("timed out waiting for %s (%d distinct handled)", what, n)
		}
	}
}

// member runs one consumer-group member with the engine until stopped.
type member struct {
	stop func()
}

// memberConfig is the engine configuration of the members of the group
// tests: several workers, and a drain that waits for them.
var memberConfig = consumer.Config{Concurrency: 8, DrainTimeout: 5 * time.Second}

func startMember(t *testing.T, cfg SourceConfig, h ackwise.Handler, late *atomic.Int64, ccfg consumer.Config) *member {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	src, err := NewSource(ctx, cfg)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(lateAcks{src, late}, h, ccfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	var once sync.Once
	m := &member{stop: func() {
		once.Do(func() {
			rcancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			if err := src.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}}
	t.Cleanup(m.stop)
	return m
}

// TestMembersJoinAndLeaveUnderLoad runs members joining and leaving a group
// while records are produced: nothing is lost, and no handler runs on a
// record after its member lost the partition (its ack would be refused).
func TestMembersJoinAndLeaveUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("rebalance test (-short)")
	}
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 6)
	cfg.Options = fastGroup
	const n = 3000
	sink := openSink(t, cfg)
	prodDone := make(chan error, 1)
	go func() { // load: batches of 50 every 5ms
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for b := 0; b < n/50; b++ {
			batch := make([]*ackwise.Message, 50)
			for i := range batch {
				id := b*50 + i
				batch[i] = &ackwise.Message{ID: "e" + strconv.Itoa(id), Key: "k" + strconv.Itoa(id%97), Payload: []byte(strconv.Itoa(id))}
			}
			if err := sink.Publish(ctx, batch...); err != nil {
				prodDone <- err
				return
			}
			time.Sleep(5 * time.Millisecond) // pacing the load, not synchronization
		}
		prodDone <- nil
	}()
	var late atomic.Int64
	seen := newTally()
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		time.Sleep(500 * time.Microsecond)
		seen.add(m.ID)
		return nil
	})
	count := func(k int) func(map[string]int) bool {
		return func(s map[string]int) bool { return len(s) >= k }
	}
	a := startMember(t, cfg, h, &late, memberConfig)
	seen.wait(t, "A's first records", 20*time.Second, count(300))
	b := startMember(t, cfg, h, &late, memberConfig)
	seen.wait(t, "records with B", 20*time.Second, count(900))
	startMember(t, cfg, h, &late, memberConfig)
	seen.wait(t, "records with C", 20*time.Second, count(1500))
	a.stop()
	seen.wait(t, "records after A left", 20*time.Second, count(2000))
	startMember(t, cfg, h, &late, memberConfig)
	b.stop()
	if err := <-prodDone; err != nil {
		t.Fatal(err)
	}
	seen.wait(t, "every record", 30*time.Second, count(n))
	if l := late.Load(); l != 0 {
		t.Fatalf("%d records were handled after their member lost the partition", l)
	}
	seen.mu.Lock()
	dups := 0
	for _, c := range seen.seen {
		dups += c - 1
	}
	seen.mu.Unlock()
	t.Logf("%d records, %d handled twice (at-least-once across rebalances)", n, dups)
}

// runConsumer runs a consumer of src with h and cfg until the test ends,
// and returns it.
func runConsumer(t *testing.T, src adapters.Source, h ackwise.Handler, cfg consumer.Config) *consumer.Consumer {
	t.Helper()
	c, err := consumer.New(src, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return c
}

// TestPoisonRecordDoesNotStopPartition: a record that always fails is
// retried, then dead-lettered, and the records behind it in its partition
// are handled, in both retry modes.
func TestPoisonRecordDoesNotStopPartition(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"blocking", "retry-topics"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			brokers := newCluster(t)
			var tiers []time.Duration
			ccfg := consumer.Config{Concurrency: 8, Retry: retry.Policy{MaxAttempts: 3, InitialInterval: 20 * time.Millisecond, Jitter: retry.NoJitter}}
			if mode == "retry-topics" {
				tiers = []time.Duration{50 * time.Millisecond}
				ccfg.RetryMode = consumer.RetryBroker
			}
			cfg := testConfig(t, brokers, 1, tiers...)
			const n = 100
			publishN(t, openSink(t, cfg), n, func(i int) string { return "k" + strconv.Itoa(i%10) })
			seen := newTally()
			var attempts atomic.Int64
			h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
				if m.ID == "ev-10" {
					attempts.Add(1)
					return fmt.Errorf("cannot parse order %s", m.Payload)
				}
				seen.add(m.ID)
				return nil
			})
			runConsumer(t, openSource(t, cfg), h, ccfg)
			seen.wait(t, "every other record", 20*time.Second, func(s map[string]int) bool { return len(s) == n-1 })
			waitCommitted(t, brokers, cfg.Group, cfg.Topic, 0, n)
			rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer rcancel()
			var dls []*kgo.Record
			for len(dls) == 0 { // the dead letter is produced without a signal to await
				if dls = readAll(rctx, t, brokers, cfg.Topic+".dlq"); len(dls) == 0 {
					select {
					case <-rctx.Done():
						t.Fatal("no dead letter")
					case <-time.After(10 * time.Millisecond):
					}
				}
			}
			if len(dls) != 1 {
				t.Fatalf("%d dead letters, want 1", len(dls))
			}
			env, err := dlq.Decode(recordMessage(dls[0]).Headers)
			if err != nil {
				t.Fatal(err)
			}
			if env.Reason != dlq.ReasonMaxAttempts || env.Attempts != 3 || env.Offset != 10 || env.Source != cfg.Topic || attempts.Load() != 3 {
				t.Fatalf("envelope %+v after %d attempts", env, attempts.Load())
			}
		})
	}
}

// TestRetryChainWalksTiers: with retry tiers and the engine's default
// retry policy, a record that fails twice goes to the first tier's retry
// topic, then to the second's. Before, the policy's own exponential delays
// (1s, 2s) were rounded by the source to a tier, and with tiers shorter
// than them every hop went to the longest tier's topic (with longer tiers,
// every hop to the first): the chain was never walked. The default retry
// mode (RetryAuto) takes the retry topics too, as RetryBroker does: tiers
// named, retries go through the broker. Before, RetryAuto retried in place
// on the ordered source and left the retry topics unused.
func TestRetryChainWalksTiers(t *testing.T) {
	t.Parallel()
	for _, mode := range []consumer.RetryMode{consumer.RetryBroker, consumer.RetryAuto} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			brokers := newCluster(t)
			tiers := []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}
			cfg := testConfig(t, brokers, 1, tiers...)
			publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })
			seen := newTally()
			h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
				if m.Attempt < 3 {
					return errors.New("not yet")
				}
				seen.add(m.ID)
				return nil
			})
			runConsumer(t, openSource(t, cfg), h, consumer.Config{RetryMode: mode})
			seen.wait(t, "the record at its third attempt", 20*time.Second, func(s map[string]int) bool { return len(s) == 1 })
			rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer rcancel()
			var hops []string
			for _, tier := range tiers {
				topic := DefaultRetryTopic(cfg.Topic, tier)
				for _, r := range readAll(rctx, t, brokers, topic) {
					hops = append(hops, topic+" attempt "+recordMessage(r).Headers.Get(ackwise.HeaderAttempt))
				}
			}
			want := []string{DefaultRetryTopic(cfg.Topic, tiers[0]) + " attempt 2", DefaultRetryTopic(cfg.Topic, tiers[1]) + " attempt 3"}
			if !slices.Equal(hops, want) {
				t.Fatalf("retry hops %q, want %q", hops, want)
			}
		})
	}
}

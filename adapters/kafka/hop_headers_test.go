package kafka

import (
	"context"
	"errors"
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

// deadLetterSignal passes on each envelope its source confirmed a dead
// letter with.
type deadLetterSignal struct {
	adapters.Source
	envs chan dlq.Envelope
}

func (s deadLetterSignal) DeadLetter(ctx context.Context, m *ackwise.Message, env dlq.Envelope) error {
	err := s.Source.DeadLetter(ctx, m, env)
	if err == nil {
		s.envs <- env
	}
	return err
}

// TestMainTopicHopHeadersIgnored: a record on the main topic that carries
// ackwise-attempt and ackwise-first-failure (a handler forwarded the
// headers of a retry it handled) starts at attempt 1 with no first failure,
// and gets all MaxAttempts before it is dead-lettered, in both retry modes.
// Before, it started at the forged attempt 4 and was dead-lettered after 2.
func TestMainTopicHopHeadersIgnored(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"blocking", "retry-topics"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			brokers := newCluster(t)
			var tiers []time.Duration
			ccfg := consumer.Config{Retry: retry.Policy{MaxAttempts: 5, InitialInterval: 10 * time.Millisecond, Jitter: retry.NoJitter}}
			if mode == "retry-topics" {
				tiers = []time.Duration{20 * time.Millisecond}
				ccfg.RetryMode = consumer.RetryBroker
			}
			cfg := testConfig(t, brokers, 1, tiers...)
			forged := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			rec := &kgo.Record{Topic: cfg.Topic, Key: []byte("k"), Value: []byte("v"), Headers: []kgo.RecordHeader{
				{Key: ackwise.HeaderEventID, Value: []byte("ev-fwd")},
				{Key: ackwise.HeaderAttempt, Value: []byte("4")},
				{Key: ackwise.HeaderFirstFailure, Value: []byte(forged.Format(time.RFC3339Nano))},
			}}
			// Straight through the client: the sink drops these headers.
			if err := openSink(t, cfg).Client().ProduceSync(ctx, rec).FirstErr(); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			var (
				mu       sync.Mutex
				attempts []int
				firsts   []time.Time
			)
			h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
				mu.Lock()
				attempts = append(attempts, m.Attempt)
				firsts = append(firsts, m.FirstFailure)
				mu.Unlock()
				return errors.New("always fails")
			})
			src := deadLetterSignal{Source: openSource(t, cfg), envs: make(chan dlq.Envelope, 1)}
			runConsumer(t, src, h, ccfg)
			var env dlq.Envelope
			select {
			case env = <-src.envs:
			case <-ctx.Done():
				t.Fatal("not dead-lettered")
			}
			mu.Lock()
			defer mu.Unlock()
			if want := []int{1, 2, 3, 4, 5}; !slices.Equal(attempts, want) {
				t.Errorf("attempts %v, want %v", attempts, want)
			}
			if !firsts[0].IsZero() {
				t.Errorf("first delivery has FirstFailure %v, want none", firsts[0])
			}
			if env.Reason != dlq.ReasonMaxAttempts || env.Attempts != 5 || env.FirstFailure.Before(start) {
				t.Errorf("envelope reason %s attempts %d first failure %v (test started %v)", env.Reason, env.Attempts, env.FirstFailure, start)
			}
			dls := readAll(ctx, t, brokers, cfg.Topic+".dlq")
			if len(dls) != 1 {
				t.Fatalf("%d dead letters, want 1", len(dls))
			}
			if got := recordMessage(dls[0]).Headers.Get(dlq.HeaderAttempts); got != "5" {
				t.Errorf("dead letter %s = %q, want 5", dlq.HeaderAttempts, got)
			}
		})
	}
}

// hopHeaderMsgs are messages a handler might publish with the headers of a
// retry it handled: the engine's hop headers among its own.
func hopHeaderMsgs() []*ackwise.Message {
	return []*ackwise.Message{
		{ID: "ev-a", Payload: []byte("a"), Headers: ackwise.HeadersOf("h", "1", ackwise.HeaderAttempt, "4", ackwise.HeaderFirstFailure, "2020-01-02T03:04:05Z", "g", "2")},
		{Payload: []byte("b"), Headers: ackwise.HeadersOf(ackwise.HeaderEventID, "ev-b", ackwise.HeaderFirstFailure, "2020-01-02T03:04:05Z", ackwise.HeaderAttempt, "3")},
	}
}

// checkNoHopHeaders fails unless recs are msgs (in order) without the hop
// headers and with their other headers in order.
func checkNoHopHeaders(t *testing.T, recs []*kgo.Record, msgs []*ackwise.Message) {
	t.Helper()
	if len(recs) != len(msgs) {
		t.Fatalf("%d records, want %d", len(recs), len(msgs))
	}
	for i, r := range recs {
		var got, want []string
		for _, h := range r.Headers {
			got = append(got, h.Key+"="+string(h.Value))
		}
		if msgs[i].ID != "" {
			want = append(want, ackwise.HeaderEventID+"="+msgs[i].ID)
		}
		for _, h := range msgs[i].Headers {
			if h.Key != ackwise.HeaderAttempt && h.Key != ackwise.HeaderFirstFailure {
				want = append(want, h.Key+"="+h.Value)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("record %q: headers %q, want %q", r.Value, got, want)
		}
	}
}

// TestSinkDropsHopHeaders: a message published with ackwise-attempt and
// ackwise-first-failure (the headers of a retry a handler forwarded) is
// published without them, so its consumers count its attempts from 1.
// Before, the sink published them as they were.
func TestSinkDropsHopHeaders(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs := hopHeaderMsgs()
	if err := openSink(t, cfg).Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	checkNoHopHeaders(t, readAll(ctx, t, brokers, cfg.Topic), msgs)
}

// TestTransactSessionOutputDropsHopHeaders: outputs of a Transform drop the
// hop headers as Sink.Publish does. Before, they were written as given.
func TestTransactSessionOutputDropsHopHeaders(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := outTopic(t, cfg, 1)
	publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })
	sess := openTxn(ctx, t, cfg)
	msgs := hopHeaderMsgs()
	fn := func(_ context.Context, _ *ackwise.Message, emit func(Output)) error {
		for _, m := range msgs {
			emit(Output{Topic: out, Payload: m.Payload, Headers: m.Headers.Clone(), ID: m.ID})
		}
		return nil
	}
	done, stop := runTxn(ctx, sess, fn)
	waitTxnCommitted(ctx, t, sess, cfg, 1, done)
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	checkNoHopHeaders(t, readIsolated(ctx, t, brokers, out, kgo.ReadCommitted()), msgs)
}

// TestForgedHopHeaders: a producer writing to the main topic cannot make
// a record skip its retries or pass its forgery on through the retry-topic
// chain. A record carrying ackwise-attempt 1000000000 (and one with
// MaxInt64), forged ackwise-original-topic/partition/offset, a retry due in
// the year 3000 and another group's ackwise-retry-group gets all its
// MaxAttempts, like a plain record beside it: each hop's copy says the
// engine's count and where the record really sat, and so does the envelope.
func TestForgedHopHeaders(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	tier := 20 * time.Millisecond
	cfg := testConfig(t, brokers, 1, tier)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	forge := func(attempt string) []kgo.RecordHeader {
		return []kgo.RecordHeader{
			{Key: ackwise.HeaderAttempt, Value: []byte(attempt)},
			{Key: ackwise.HeaderFirstFailure, Value: []byte("2020-01-02T03:04:05Z")},
			{Key: HeaderOriginalTopic, Value: []byte("payments")},
			{Key: HeaderOriginalPartition, Value: []byte("7")},
			{Key: HeaderOriginalOffset, Value: []byte("12345")},
			{Key: HeaderRetryDue, Value: []byte(strconv.FormatInt(time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli(), 10))},
			{Key: HeaderRetryGroup, Value: []byte("someone-else")},
		}
	}
	ids := []string{"plain", "forged-1e9", "forged-maxint64"}
	recs := []*kgo.Record{
		{Topic: cfg.Topic, Key: []byte("k"), Value: []byte("v")},
		{Topic: cfg.Topic, Key: []byte("k"), Value: []byte("v"), Headers: forge("1000000000")},
		{Topic: cfg.Topic, Key: []byte("k"), Value: []byte("v"), Headers: forge("9223372036854775807")},
	}
	for i, r := range recs {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: ackwise.HeaderEventID, Value: []byte(ids[i])})
	}
	// Straight through the client: the sink drops the hop headers.
	if err := openSink(t, cfg).Client().ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		attempts = map[string][]int{}
		where    = map[string][]string{}
	)
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		mu.Lock()
		attempts[m.ID] = append(attempts[m.ID], m.Attempt)
		where[m.ID] = append(where[m.ID], m.Source+"/"+strconv.Itoa(int(m.Partition))+"@"+strconv.FormatInt(m.Offset, 10))
		mu.Unlock()
		return errors.New("always fails")
	})
	src := deadLetterSignal{Source: openSource(t, cfg), envs: make(chan dlq.Envelope, len(ids))}
	ccfg := consumer.Config{RetryMode: consumer.RetryBroker, Retry: retry.Policy{MaxAttempts: 4, InitialInterval: tier, Jitter: retry.NoJitter}}
	runConsumer(t, src, h, ccfg)
	envs := map[int64]dlq.Envelope{} // by original offset
	for range ids {
		select {
		case env := <-src.envs:
			envs[env.Offset] = env
		case <-ctx.Done():
			t.Fatalf("%d of %d dead-lettered", len(envs), len(ids))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i, id := range ids {
		at := cfg.Topic + "/0@" + strconv.Itoa(i)
		if want := []int{1, 2, 3, 4}; !slices.Equal(attempts[id], want) {
			t.Errorf("%s: attempts %v, want %v", id, attempts[id], want)
		}
		for _, w := range where[id] {
			if w != at {
				t.Errorf("%s: delivered as from %s, want %s", id, w, at)
			}
		}
		env, ok := envs[int64(i)]
		if !ok {
			t.Errorf("%s: no envelope for offset %d (%v)", id, i, envs)
			continue
		}
		if env.Source != cfg.Topic || env.Partition != 0 || env.Attempts != 4 || env.FirstFailure.Year() == 2020 {
			t.Errorf("%s: envelope source %s/%d@%d attempts %d first failure %v", id, env.Source, env.Partition, env.Offset, env.Attempts, env.FirstFailure)
		}
	}
	// Each hop's copy carries the engine's count and origin, not the forgery.
	hops := readAll(ctx, t, brokers, cfg.withDefaults().RetryTopic(cfg.Topic, tier))
	if len(hops) != 3*len(ids) {
		t.Fatalf("%d retry copies, want %d", len(hops), 3*len(ids))
	}
	next := map[string]int{}
	for _, r := range hops {
		m := recordMessage(r)
		next[m.ID]++
		want := map[string]string{
			ackwise.HeaderAttempt:   strconv.Itoa(next[m.ID] + 1),
			HeaderOriginalTopic:     cfg.Topic,
			HeaderOriginalPartition: "0",
			HeaderRetryGroup:        cfg.Group,
		}
		for k, v := range want {
			if got := headerValue(r, k); got != v {
				t.Errorf("%s: hop %d: %s = %q, want %q", m.ID, next[m.ID], k, got, v)
			}
		}
		for _, h := range r.Headers {
			if h.Key == ackwise.HeaderAttempt && string(h.Value) != want[ackwise.HeaderAttempt] {
				t.Errorf("%s: hop %d carries a second %s %q", m.ID, next[m.ID], h.Key, h.Value)
			}
		}
	}
}

// TestRetryAttemptSaturates: ackwise-attempt read from a retry topic is
// capped (maxAttempt) and the next hop's count saturates there instead of
// wrapping: a record on a retry topic at attempt MaxInt64, under a policy
// that never gives up, comes back at maxAttempt. Before, it was delivered
// at MaxInt64, and its next hop said -9223372036854775808, read as attempt
// 1: the count started over.
func TestRetryAttemptSaturates(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	tier := 20 * time.Millisecond
	cfg := testConfig(t, brokers, 1, tier)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := &kgo.Record{Topic: cfg.withDefaults().RetryTopic(cfg.Topic, tier), Key: []byte("k"), Value: []byte("v"), Headers: []kgo.RecordHeader{
		{Key: ackwise.HeaderEventID, Value: []byte("ev")},
		{Key: ackwise.HeaderAttempt, Value: []byte("9223372036854775807")},
		{Key: HeaderRetryDue, Value: []byte("0")},
		{Key: HeaderOriginalTopic, Value: []byte(cfg.Topic)},
		{Key: HeaderOriginalPartition, Value: []byte("0")},
		{Key: HeaderOriginalOffset, Value: []byte("0")},
		{Key: HeaderRetryGroup, Value: []byte(cfg.Group)},
	}}
	if err := openSink(t, cfg).Client().ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	got := make(chan int, 3)
	var runs atomic.Int32
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		got <- m.Attempt
		if runs.Add(1) < 3 {
			return errors.New("fails twice")
		}
		return nil
	})
	runConsumer(t, openSource(t, cfg), h, consumer.Config{RetryMode: consumer.RetryBroker, Retry: retry.Policy{MaxAttempts: retry.Unlimited, InitialInterval: tier, Jitter: retry.NoJitter}})
	for i := range 3 {
		select {
		case a := <-got:
			if a != maxAttempt {
				t.Fatalf("delivery %d at attempt %d, want %d (capped, saturated)", i+1, a, maxAttempt)
			}
		case <-ctx.Done():
			t.Fatalf("%d deliveries", i)
		}
	}
}

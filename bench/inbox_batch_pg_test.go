package bench

import (
	"context"
	"fmt"
	"maps"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/pginbox"
)

// runBatches handles n first deliveries in batches of size with
// inboxWorkers workers, each calling h with its next batch, and returns
// the elapsed time.
func (f *inboxFixture) runBatches(b *testing.B, h ackwise.BatchHandler, n, size int) time.Duration {
	prefix := fmt.Sprintf("r%d-%d-", runSeq.Add(1), time.Now().UnixNano())
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range inboxWorkers {
		wg.Go(func() {
			batch := make([]*ackwise.Message, 0, size)
			for {
				from := next.Add(int64(size)) - int64(size)
				if from >= int64(n) {
					return
				}
				batch = batch[:0]
				for i := from; i < min(from+int64(size), int64(n)); i++ {
					batch = append(batch, &ackwise.Message{ID: prefix + fmt.Sprint(i), Partition: -1, Offset: -1, Attempt: 1})
				}
				if err := h.HandleBatch(context.Background(), batch); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// BenchmarkInboxBatchPostgres compares, in paired rounds (one op is a
// round in which every variant, in a random order, handles the same
// perRound first deliveries with inboxWorkers workers):
//
//   - inbox: middleware.Inbox over pginbox, a handler inserting one effect
//     row (BEGIN; INSERT record; INSERT effect; COMMIT per message);
//   - batch-100, batch-500: middleware.BatchInbox over pginbox, a batch
//     handler inserting one effect row per message with one INSERT …
//     SELECT unnest($1) through pginbox.Tx (BEGIN; one INSERT of the
//     records; one INSERT of the effects; COMMIT per batch).
//
// It reports each variant's median msgs/s and the medians of the
// per-round ratios batch-N/inbox.
//
// Run: go test -run '^$' -bench 'InboxBatchPostgres' -benchtime 10x -count 3 .
func BenchmarkInboxBatchPostgres(b *testing.B) {
	const perRound = 4000
	f := newInboxFixture(b)
	var single ackwise.Handler
	for _, v := range f.variants {
		if v.name == "inbox" {
			single = v.h
		}
	}
	batchMW, err := middleware.BatchInbox(f.store, middleware.InboxConfig{Consumer: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	insertEffects := `INSERT INTO ` + f.schema + `.effects (event_id, amount) SELECT unnest($1::text[]), 10`
	batchHandler := batchMW(ackwise.BatchHandlerFunc(func(ctx context.Context, msgs []*ackwise.Message) error {
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.ID
		}
		_, err := pginbox.Tx(ctx).Exec(ctx, insertEffects, ids)
		return err
	}))
	type variant struct {
		name string
		run  func() time.Duration
	}
	variants := []variant{
		{"inbox", func() time.Duration { return f.run(b, single, perRound) }},
		{"batch-100", func() time.Duration { return f.runBatches(b, batchHandler, perRound, 100) }},
		{"batch-500", func() time.Duration { return f.runBatches(b, batchHandler, perRound, 500) }},
		{"engine-inbox", func() time.Duration {
			return runOnEngine(b, perRound, func(src adapters.Source) (*consumer.Consumer, error) {
				return consumer.New(src, single, consumer.Config{Concurrency: inboxWorkers})
			})
		}},
		{"engine-batch-500", func() time.Duration {
			return runOnEngine(b, perRound, func(src adapters.Source) (*consumer.Consumer, error) {
				return consumer.NewBatch(src, batchHandler, consumer.Config{Concurrency: inboxWorkers, Batch: consumer.BatchConfig{Size: 500}})
			})
		}},
	}
	rates := map[string][]float64{}
	ratios := map[string][]float64{}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		f.truncate(b)
		b.StartTimer()
		mrand.Shuffle(len(variants), func(i, j int) { variants[i], variants[j] = variants[j], variants[i] })
		round := map[string]float64{}
		for _, v := range variants {
			round[v.name] = perRound / v.run().Seconds()
			rates[v.name] = append(rates[v.name], round[v.name])
		}
		for _, v := range []string{"batch-100", "batch-500"} {
			ratios[v+"/inbox"] = append(ratios[v+"/inbox"], round[v]/round["inbox"])
		}
		ratios["engine-batch-500/engine-inbox"] = append(ratios["engine-batch-500/engine-inbox"], round["engine-batch-500"]/round["engine-inbox"])
	}
	var effects int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+f.schema+`.effects`).Scan(&effects); err != nil {
		b.Fatal(err)
	}
	if want := perRound * len(variants); b.N > 0 && effects != want {
		b.Fatalf("%d effect rows after the last round, want %d (one per message)", effects, want)
	}
	for _, name := range slices.Sorted(maps.Keys(rates)) {
		b.ReportMetric(median(rates[name]), name+"-msgs/s")
	}
	for _, name := range slices.Sorted(maps.Keys(ratios)) {
		b.ReportMetric(median(ratios[name]), name)
	}
}

// runOnEngine publishes n first deliveries (unique event IDs, no keys) to a
// queue of an in-memory broker, then runs the consumer mk makes on it until
// every message is acked, and returns the time that took.
func runOnEngine(b *testing.B, n int, mk func(adapters.Source) (*consumer.Consumer, error)) time.Duration {
	ctx := context.Background()
	broker, err := memory.New(memory.Config{})
	if err != nil {
		b.Fatal(err)
	}
	prefix := fmt.Sprintf("e%d-%d-", runSeq.Add(1), time.Now().UnixNano())
	msgs := make([]*ackwise.Message, n)
	for i := range msgs {
		msgs[i] = &ackwise.Message{ID: prefix + fmt.Sprint(i)}
	}
	if err := broker.Publish(ctx, "inbox-bench", msgs...); err != nil {
		b.Fatal(err)
	}
	src, err := broker.QueueSource("inbox-bench")
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	c, err := mk(src)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	err = broker.WaitHistory(ctx, "inbox-bench", func(events []memory.Event) bool {
		acked := 0
		for _, e := range events {
			if e.Kind == memory.EventAcked {
				acked++
			}
		}
		return acked == n
	})
	elapsed := time.Since(start)
	stop()
	if rerr := <-done; err != nil || rerr != nil {
		b.Fatalf("engine run: wait %v, Run %v", err, rerr)
	}
	if st := c.Stats(); st.Acked != uint64(n) {
		b.Fatalf("engine run: stats %+v, want %d acked", st, n)
	}
	return elapsed
}

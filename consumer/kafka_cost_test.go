package consumer_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/kafka"
	"github.com/ackwise/ackwise/consumer"
)

// TestMain runs the tests, or, with ACKWISE_BENCH_COST=engine, one step of
// bench/callgrind.sh (see bench/kafka_cost_test.go): it runs the engine on
// a Kafka source over an existing topic of ACKWISE_BENCH_COST_N records
// (ACKWISE_BENCH_COST_BROKER, ACKWISE_BENCH_COST_TOPIC) with a no-op
// handler and the default Config, and exits. With ACKWISE_BENCH_COST_BATCH
// set to a size, it runs a no-op batch handler on batches of up to that
// many records instead (consumer.NewBatch).
//
// It lives here, not in bench/, for PinPace: the hand-off pace follows the
// measured run time of a message, and under valgrind, ~50 times slower,
// the engine would run in single mode (a channel hand-off and a select per
// message) where natively it runs inline. ACKWISE_BENCH_COST_PACE pins it
// (inline, batch, single; "auto" leaves it adaptive); the pace in force at
// the end is printed. The source's CommitInterval is scaled as valgrind
// slows the run (10s instead of 200ms), so that it commits about as often
// per record as natively.
func TestMain(m *testing.M) {
	if os.Getenv("ACKWISE_BENCH_COST") == "engine" {
		os.Exit(engineCost())
	}
	os.Exit(m.Run())
}

func engineCost() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "engine cost:", err)
		return 1
	}
	broker, topic := os.Getenv("ACKWISE_BENCH_COST_BROKER"), os.Getenv("ACKWISE_BENCH_COST_TOPIC")
	n, err := strconv.Atoi(os.Getenv("ACKWISE_BENCH_COST_N"))
	if err != nil || n < 1 || broker == "" || topic == "" {
		return fail(fmt.Errorf("set ACKWISE_BENCH_COST_BROKER, ACKWISE_BENCH_COST_TOPIC and ACKWISE_BENCH_COST_N (>= 1)"))
	}
	ctx := context.Background()
	src, err := kafka.NewSource(ctx, kafka.SourceConfig{ClientConfig: kafka.ClientConfig{Brokers: []string{broker}}, Topic: topic, Group: topic + "-g", CommitInterval: 10 * time.Second})
	if err != nil {
		return fail(err)
	}
	var handled atomic.Int64
	all := make(chan struct{})
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		if handled.Add(1) == int64(n) {
			close(all)
		}
		return nil
	})
	var c *consumer.Consumer
	if size, _ := strconv.Atoi(os.Getenv("ACKWISE_BENCH_COST_BATCH")); size > 0 {
		// A no-op batch handler on batches of up to size records.
		bh := ackwise.BatchHandlerFunc(func(_ context.Context, msgs []*ackwise.Message) error {
			if handled.Add(int64(len(msgs))) == int64(n) {
				close(all)
			}
			return nil
		})
		c, err = consumer.NewBatch(src, bh, consumer.Config{Batch: consumer.BatchConfig{Size: size}})
	} else {
		c, err = consumer.New(src, h, consumer.Config{})
	}
	if err != nil {
		return fail(err)
	}
	paces := map[string]int{} // with "auto", the pace seen every millisecond
	sampled := make(chan struct{})
	if pace := os.Getenv("ACKWISE_BENCH_COST_PACE"); pace != "" && pace != "auto" {
		consumer.PinPace(c, pace)
		close(sampled)
	} else {
		go func() {
			defer close(sampled)
			for {
				select {
				case <-all:
					return
				case <-time.After(time.Millisecond):
					paces[consumer.PaceOf(c)]++
				}
			}
		}()
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	select {
	case <-all:
	case err := <-done:
		cancel()
		return fail(fmt.Errorf("Run returned early: %v", err))
	}
	pace := consumer.PaceOf(c)
	cancel()
	if err := <-done; err != nil {
		return fail(err)
	}
	if err := src.Close(); err != nil {
		return fail(err)
	}
	<-sampled
	fmt.Fprintln(os.Stderr, "pace at the end:", pace, paces)
	return 0
}

package consumer_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
)

// doneObserver closes done when n messages were acked.
type doneObserver struct {
	n     int64
	acked atomic.Int64
	done  chan struct{}
}

func (o *doneObserver) Observe(_ *ackwise.Message, out consumer.Outcome, _ time.Duration) {
	if out == consumer.Acked && o.acked.Add(1) == o.n {
		close(o.done)
	}
}

// BenchmarkEngineMemory measures the engine on the in-memory broker: a
// no-op handler, per-key ordering over 1,000 keys, 4 workers. The b.N
// messages are published before the timer starts; the timed part is
// receive → dispatch → handle → ack of all of them. It reports msgs/s and
// allocations per message (-benchmem's allocs/op is per message).
func BenchmarkEngineMemory(b *testing.B) {
	for _, mode := range []string{"queue", "log"} {
		b.Run(mode, func(b *testing.B) {
			br, err := memory.New(memory.Config{DisableHistory: true})
			if err != nil {
				b.Fatal(err)
			}
			var src adapters.Source
			if mode == "queue" {
				src, err = br.QueueSource("orders")
			} else {
				if err = br.CreateTopic("orders", memory.TopicConfig{Partitions: 4}); err == nil {
					src, err = br.JoinGroup("orders", "bench")
				}
			}
			if err != nil {
				b.Fatal(err)
			}
			defer src.Close()
			publishBacklog(b, br)
			obs := &doneObserver{n: int64(b.N), done: make(chan struct{})}
			noop := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil })
			c, err := consumer.New(src, noop, consumer.Config{Concurrency: 4, Observer: obs})
			if err != nil {
				b.Fatal(err)
			}
			runCtx, cancel := context.WithCancel(context.Background())
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			runErr := make(chan error, 1)
			go func() { runErr <- c.Run(runCtx) }()
			<-obs.done
			elapsed := time.Since(start)
			b.StopTimer()
			cancel()
			if err := <-runErr; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
		})
	}
}

// BenchmarkEngineMemoryMetrics is BenchmarkEngineMemory's queue case with
// NewMetrics' Observer on the OpenTelemetry SDK (a manual reader, never
// collected). "counters": the Observer wrapped in one of the test's, so the
// engine keeps no gauges (the outcome counters and handler histogram
// alone); "gauges": the Observer itself, so the engine also keeps the lag's
// table of messages in flight. Side by side they are the table's cost.
// Besides msgs/s it reports the process's CPU time per message
// (getrusage), steadier than throughput on a loaded machine.
func BenchmarkEngineMemoryMetrics(b *testing.B) {
	for _, mode := range []string{"counters", "gauges"} {
		b.Run(mode, func(b *testing.B) { benchEngineMetrics(b, mode == "gauges") })
	}
}

// wrapped hides NewMetrics' Observer from the engine, which then keeps no
// gauges.
type wrapped struct{ consumer.Observer }

func benchEngineMetrics(b *testing.B, gauges bool) {
	br, err := memory.New(memory.Config{DisableHistory: true})
	if err != nil {
		b.Fatal(err)
	}
	src, err := br.QueueSource("orders")
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	publishBacklog(b, br)
	obs, err := consumer.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())), "bench")
	if err != nil {
		b.Fatal(err)
	}
	if !gauges {
		obs = wrapped{obs}
	}
	var handled atomic.Int64
	done := make(chan struct{})
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		if handled.Add(1) == int64(b.N) {
			close(done)
		}
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{Concurrency: 4, Observer: obs})
	if err != nil {
		b.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	start := time.Now()
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(runCtx) }()
	<-done
	for c.Stats().Acked < uint64(b.N) {
		time.Sleep(50 * time.Microsecond) // the last acks follow the last handler calls
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cpu := cpuTime() - cpu0
	cancel()
	if err := <-runErr; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/msg")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// publishBacklog publishes b.N messages of 64 bytes on 1,000 keys to the
// broker's "orders", in batches of 1,024, before the timed part.
func publishBacklog(b *testing.B, br *memory.Broker) {
	b.Helper()
	payload := make([]byte, 64)
	msgs := make([]*ackwise.Message, 0, 1024)
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		msgs = append(msgs, &ackwise.Message{ID: "e" + strconv.Itoa(i), Key: "k" + strconv.Itoa(i%1000), Payload: payload})
		if len(msgs) == cap(msgs) || i == b.N-1 {
			if err := br.Publish(ctx, "orders", msgs...); err != nil {
				b.Fatal(err)
			}
			msgs = msgs[:0]
		}
	}
}

package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/rabbitmq"
	"github.com/ackwise/ackwise/consumer"
)

// RabbitMQ benchmarks run against the local server (ACKWISE_RABBITMQ_URL,
// default amqp://guest:guest@127.0.0.1:5672/), on durable classic queues
// with persistent 100-byte messages, at the same prefetch for every client.
// Each op is one message. Queues are filled outside the timer; connecting
// and subscribing are inside it for every client.
//
//	go test -run '^$' -bench 'RabbitMQConsume|RabbitMQPublish' -benchtime 20000x -count 5 .
//	go test -run '^$' -bench 'RabbitMQHandler1ms' -benchtime 5000x -count 3 .

const (
	rabbitPrefetch    = 128
	rabbitPayloadSize = 100
	rabbitWorkers     = 32
)

func rabbitURL() string {
	if u := os.Getenv("ACKWISE_RABBITMQ_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

func rabbitName(prefix string) string {
	var r [5]byte
	_, _ = rand.Read(r[:])
	return "ackwise-bench-" + prefix + "-" + hex.EncodeToString(r[:])
}

func rabbitDial(b *testing.B) *amqp.Connection {
	b.Helper()
	c, err := amqp.Dial(rabbitURL())
	if err != nil {
		b.Fatalf("RabbitMQ unreachable (start it with rabbitmq-server -detached): %v", err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// rabbitPlainQueue declares a durable classic queue without arguments, as
// Watermill's durable-queue config declares it, and deletes it at the end.
func rabbitPlainQueue(b *testing.B, prefix string) string {
	b.Helper()
	name := rabbitName(prefix)
	c := rabbitDial(b)
	ch, err := c.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rabbitDelete(b, name) })
	return name
}

// rabbitAckwiseQueue declares an ackwise topology (work queue, one wait
// queue, dead-letter queue) and deletes it at the end.
func rabbitAckwiseQueue(b *testing.B, prefix string) rabbitmq.Config {
	b.Helper()
	cfg := rabbitmq.Config{URL: rabbitURL(), Queue: rabbitName(prefix), Prefetch: rabbitPrefetch, DelayTiers: []time.Duration{time.Second}}
	if err := rabbitmq.Declare(context.Background(), cfg); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		rabbitDelete(b, cfg.Queue, cfg.Queue+".dlq", rabbitmq.WaitQueueName(cfg.Queue, time.Second))
	})
	return cfg
}

func rabbitDelete(b *testing.B, queues ...string) {
	c, err := amqp.Dial(rabbitURL())
	if err != nil {
		b.Errorf("delete queues: %v", err)
		return
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		b.Errorf("delete queues: %v", err)
		return
	}
	for _, q := range queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			b.Errorf("delete %s: %v", q, err)
		}
	}
}

// rabbitPublishing is the message every benchmark sends: a 100-byte
// persistent body and the headers both ackwise and Watermill read.
func rabbitPublishing(i int, body []byte) amqp.Publishing {
	id := "ev-" + strconv.Itoa(i)
	return amqp.Publishing{
		Headers:      amqp.Table{ackwise.HeaderEventID: id, "_watermill_message_uuid": id},
		DeliveryMode: amqp.Persistent,
		MessageId:    id,
		Body:         body,
	}
}

// rabbitFill publishes n messages to queue with confirms, outside the timer.
func rabbitFill(b *testing.B, queue string, n int) {
	b.Helper()
	c := rabbitDial(b)
	ch, err := c.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, rabbitPayloadSize)
	const window = 1000
	dcs := make([]*amqp.DeferredConfirmation, 0, window)
	for i := 0; i < n; i++ {
		dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, rabbitPublishing(i, body))
		if err != nil {
			b.Fatal(err)
		}
		dcs = append(dcs, dc)
		if len(dcs) == window || i == n-1 {
			for _, dc := range dcs {
				if !dc.Wait() {
					b.Fatal("fill: broker nacked a message")
				}
			}
			dcs = dcs[:0]
		}
	}
}

// rabbitRawConsume consumes n messages from queue with the plain client:
// manual acks, basic.qos prefetch, workers goroutines on one channel, each
// running handle then acking.
func rabbitRawConsume(b *testing.B, queue string, n, workers int, handle func()) {
	b.Helper()
	c, err := amqp.Dial(rabbitURL())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Qos(rabbitPrefetch, 0, false); err != nil {
		b.Fatal(err)
	}
	ds, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	var left atomic.Int64
	left.Store(int64(n))
	all := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case d := <-ds:
					handle()
					if err := d.Ack(false); err != nil {
						b.Error(err)
						return
					}
					if left.Add(-1) == 0 {
						close(all)
					}
				case <-all:
					return
				}
			}
		}()
	}
	<-all
	wg.Wait()
}

// rabbitEngine runs the ackwise engine on a new source of cfg until n
// messages were handled, then stops it and closes the source.
func rabbitEngine(b *testing.B, cfg rabbitmq.Config, n int, ccfg consumer.Config, handle func()) {
	b.Helper()
	src, err := rabbitmq.NewSource(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	var done atomic.Int64
	all := make(chan struct{})
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		handle()
		if done.Add(1) == int64(n) {
			close(all)
		}
		return nil
	})
	runEngine(b, src, h, ccfg, all)
}

// rabbitSourceWorkers drives the ackwise source without the engine: one
// goroutine receives, workers goroutines handle and ack.
func rabbitSourceWorkers(b *testing.B, cfg rabbitmq.Config, n, workers int, handle func()) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src, err := rabbitmq.NewSource(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	work := make(chan *ackwise.Message, rabbitPrefetch)
	var left atomic.Int64
	left.Store(int64(n))
	all := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range work {
				handle()
				if err := src.Ack(ctx, m); err != nil {
					b.Error(err)
				}
				if left.Add(-1) == 0 {
					close(all)
				}
			}
		}()
	}
	buf := make([]*ackwise.Message, rabbitPrefetch)
	go func() {
		defer close(work)
		for {
			k, err := src.Receive(ctx, buf)
			if err != nil {
				return
			}
			for _, m := range buf[:k] {
				work <- m
			}
		}
	}()
	<-all
	cancel()
	wg.Wait()
	if err := src.Close(); err != nil {
		b.Fatal(err)
	}
}

// rabbitWatermill consumes n messages with Watermill's AMQP subscriber at
// the same prefetch. Watermill hands a subscriber one message at a time and
// waits for its ack before the next.
func rabbitWatermill(b *testing.B, queue string, n int, handle func()) {
	b.Helper()
	cfg := wamqp.NewDurableQueueConfig(rabbitURL())
	cfg.Consume.Qos.PrefetchCount = rabbitPrefetch
	sub, err := wamqp.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, queue)
	if err != nil {
		b.Fatal(err)
	}
	for range n {
		m := <-msgs
		handle()
		m.Ack()
	}
	cancel()
	if err := sub.Close(); err != nil {
		b.Fatal(err)
	}
}

// rabbitMark is when the timed part of a benchmark started, in wall-clock
// and in CPU time of this process.
type rabbitMark struct {
	wall time.Time
	cpu  time.Duration
}

func rabbitCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func rabbitStart() rabbitMark { return rabbitMark{wall: time.Now(), cpu: rabbitCPU()} }

// rabbitReport reports msgs/s and the client's CPU time per message: the
// broker shares the machine's two cores, so msgs/s moves with whatever else
// runs, while CPU per message is the client's own cost.
func rabbitReport(b *testing.B, m rabbitMark) {
	b.ReportMetric(float64(b.N)/time.Since(m.wall).Seconds(), "msgs/s")
	b.ReportMetric(float64(rabbitCPU()-m.cpu)/float64(b.N)/1000, "cpu-µs/msg")
}

func noWork() {}

func work1ms() { time.Sleep(time.Millisecond) }

// BenchmarkRabbitMQConsume consumes b.N messages with a no-op handler and
// manual acks at prefetch 128: the raw amqp091-go loop (the ceiling), the
// ackwise source driven directly (Receive/Ack), the ackwise engine on it
// (what users run) and Watermill's AMQP subscriber.
func BenchmarkRabbitMQConsume(b *testing.B) {
	b.Run("raw-amqp091", func(b *testing.B) {
		q := rabbitPlainQueue(b, "raw")
		rabbitFill(b, q, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		start := rabbitStart()
		rabbitRawConsume(b, q, b.N, 1, noWork)
		rabbitReport(b, start)
	})

	b.Run("ackwise-source", func(b *testing.B) {
		cfg := rabbitAckwiseQueue(b, "src")
		rabbitFill(b, cfg.Queue, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		start := rabbitStart()
		ctx := context.Background()
		src, err := rabbitmq.NewSource(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		buf := make([]*ackwise.Message, rabbitPrefetch)
		var sink int
		for n := 0; n < b.N; {
			k, err := src.Receive(ctx, buf)
			if err != nil {
				b.Fatal(err)
			}
			for _, m := range buf[:k] {
				sink += len(m.Payload)
				if err := src.Ack(ctx, m); err != nil {
					b.Fatal(err)
				}
			}
			n += k
		}
		if err := src.Close(); err != nil {
			b.Fatal(err)
		}
		rabbitReport(b, start)
		_ = sink
	})

	b.Run("ackwise-engine", func(b *testing.B) {
		cfg := rabbitAckwiseQueue(b, "eng")
		rabbitFill(b, cfg.Queue, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		start := rabbitStart()
		rabbitEngine(b, cfg, b.N, consumer.Config{MaxInFlight: rabbitPrefetch}, noWork)
		rabbitReport(b, start)
	})

	b.Run("watermill-amqp", func(b *testing.B) {
		q := rabbitPlainQueue(b, "wm")
		rabbitFill(b, q, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		start := rabbitStart()
		rabbitWatermill(b, q, b.N, noWork)
		rabbitReport(b, start)
	})
}

// BenchmarkRabbitMQPublishConfirmed publishes b.N persistent messages with
// publisher confirms, mandatory, from 4 goroutines in batches of 64 on one
// channel: the raw asynchronous-confirm publisher (deferred confirmations,
// the ceiling) and the ackwise sink (Publish of 64 messages).
func BenchmarkRabbitMQPublishConfirmed(b *testing.B) {
	const goroutines, batch = 4, 64
	split := func(n int, f func(from, to int)) {
		var wg sync.WaitGroup
		per := (n + goroutines - 1) / goroutines
		for g := range goroutines {
			from, to := g*per, min((g+1)*per, n)
			if from >= to {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				f(from, to)
			}()
		}
		wg.Wait()
	}

	b.Run("raw-async-confirms", func(b *testing.B) {
		q := rabbitPlainQueue(b, "rawpub")
		body := make([]byte, rabbitPayloadSize)
		b.ReportAllocs()
		b.ResetTimer()
		start := rabbitStart()
		c, err := amqp.Dial(rabbitURL())
		if err != nil {
			b.Fatal(err)
		}
		ch, err := c.Channel()
		if err != nil {
			b.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			b.Fatal(err)
		}
		returns := ch.NotifyReturn(make(chan amqp.Return, 1))
		split(b.N, func(from, to int) {
			dcs := make([]*amqp.DeferredConfirmation, 0, batch)
			for i := from; i < to; i += batch {
				dcs = dcs[:0]
				for j := i; j < min(i+batch, to); j++ {
					dc, err := ch.PublishWithDeferredConfirm("", q, true, false, rabbitPublishing(j, body))
					if err != nil {
						b.Error(err)
						return
					}
					dcs = append(dcs, dc)
				}
				for _, dc := range dcs {
					if !dc.Wait() {
						b.Error("nacked")
						return
					}
				}
			}
		})
		select {
		case r := <-returns:
			b.Fatalf("returned: %s", r.ReplyText)
		default:
		}
		c.Close()
		rabbitReport(b, start)
	})

	b.Run("ackwise-sink", func(b *testing.B) {
		q := rabbitPlainQueue(b, "sinkpub")
		body := make([]byte, rabbitPayloadSize)
		msgs := make([]*ackwise.Message, b.N)
		for i := range msgs {
			msgs[i] = &ackwise.Message{ID: "ev-" + strconv.Itoa(i), Payload: body}
		}
		b.ReportAllocs()
		b.ResetTimer()
		start := rabbitStart()
		ctx := context.Background()
		sink, err := rabbitmq.NewSink(ctx, rabbitmq.SinkConfig{URL: rabbitURL(), RoutingKey: q})
		if err != nil {
			b.Fatal(err)
		}
		split(b.N, func(from, to int) {
			for i := from; i < to; i += batch {
				if err := sink.Publish(ctx, msgs[i:min(i+batch, to)]...); err != nil {
					b.Error(err)
					return
				}
			}
		})
		if err := sink.Close(); err != nil {
			b.Fatal(err)
		}
		rabbitReport(b, start)
	})
}

// BenchmarkRabbitMQHandler1ms consumes b.N messages whose handler waits 1 ms
// (as a database call would), at prefetch 128: raw amqp091-go with 32
// goroutines on one channel, the ackwise engine with 32 workers, and
// Watermill's AMQP subscriber, which handles one message at a time.
func BenchmarkRabbitMQHandler1ms(b *testing.B) {
	b.Run("raw-amqp091-32", func(b *testing.B) {
		q := rabbitPlainQueue(b, "raw1ms")
		rabbitFill(b, q, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		start := rabbitStart()
		rabbitRawConsume(b, q, b.N, rabbitWorkers, work1ms)
		rabbitReport(b, start)
	})

	b.Run("ackwise-source-32", func(b *testing.B) {
		cfg := rabbitAckwiseQueue(b, "src1ms")
		rabbitFill(b, cfg.Queue, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		start := rabbitStart()
		rabbitSourceWorkers(b, cfg, b.N, rabbitWorkers, work1ms)
		rabbitReport(b, start)
	})

	b.Run("ackwise-engine-32", func(b *testing.B) {
		cfg := rabbitAckwiseQueue(b, "eng1ms")
		rabbitFill(b, cfg.Queue, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		start := rabbitStart()
		rabbitEngine(b, cfg, b.N, consumer.Config{Concurrency: rabbitWorkers, MaxInFlight: rabbitPrefetch}, work1ms)
		rabbitReport(b, start)
	})

	b.Run("watermill-amqp", func(b *testing.B) {
		q := rabbitPlainQueue(b, "wm1ms")
		rabbitFill(b, q, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		start := rabbitStart()
		rabbitWatermill(b, q, b.N, work1ms)
		rabbitReport(b, start)
	})
}

package bench

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/kafka"
	"github.com/ackwise/ackwise/consumer"
)

// Kafka benchmarks run against a kfake broker, one per variant: they compare
// clients on the same broker, they do not measure Kafka. The broker runs in
// the benchmark's process, or with ACKWISE_BENCH_KFAKE=process in a process
// of its own (see kfakeProcess), where neither its CPU nor its garbage counts
// against the client.
//
//	go test -run '^$' -bench 'KafkaConsumeCommit' -benchtime 1000000x -count 1 .
//	go test -run '^$' -bench 'KafkaKeyParallel' -benchtime 1x -count 2 -timeout 20m .

const (
	kafkaPartitions = 4
	kafkaKeys       = 1000
	kafkaValueSize  = 100
)

func kafkaCluster(b *testing.B) []string {
	b.Helper()
	if os.Getenv("ACKWISE_BENCH_KFAKE") == "process" {
		return kfakeProcess(b)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	return c.ListenAddrs()
}

func kafkaName(prefix string) string {
	var r [5]byte
	_, _ = rand.Read(r[:])
	return prefix + "-" + hex.EncodeToString(r[:])
}

// fataler is what the Kafka helpers need of a *testing.B: the cost harness
// (kafka_cost_test.go) runs them outside a benchmark.
type fataler interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// kafkaPayload is what the record values of a benchmark topic hold. How
// well they compress decides how many records a fetch carries: the producer
// compresses its batches (franz-go's default, snappy) and the broker caps a
// fetch by compressed bytes (FetchMaxPartitionBytes, 1 MiB by default).
type kafkaPayload struct {
	name  string
	value func(i int) []byte // record i's value, kafkaValueSize bytes
}

// kafkaPayloads are the payloads BenchmarkKafkaConsumeCommit runs with:
//   - zeros: one zero-filled value for every record. Batches compress about
//     6:1 and a fetch carries ~140,000 records, ~20 MB decoded, more than
//     the CPU caches hold.
//   - json: a small JSON order event with random IDs and amounts, as an
//     application would publish; batches compress about 3:1.
//   - random: random bytes, as encrypted or already compressed payloads;
//     batches compress about 1.2:1 (the keys and headers).
//
// json and random cycle through kafkaDistinctValues values, more than a
// producer batch holds, so a batch never repeats a value.
var kafkaPayloads = []kafkaPayload{
	{"zeros", func() func(int) []byte {
		v := make([]byte, kafkaValueSize)
		return func(int) []byte { return v }
	}()},
	{"json", cycle(func(v []byte) {
		var r [12]byte
		_, _ = rand.Read(r[:])
		e := fmt.Appendf(v[:0], `{"order":"%x","customer":"c-%05d","amount_cents":%d,"currency":"EUR","sku":"sku-%04d"`,
			r[:5], binary.LittleEndian.Uint32(r[5:])%100000, binary.LittleEndian.Uint16(r[9:])%50000+99, r[11])
		for len(e) < kafkaValueSize-1 {
			e = append(e, ' ')
		}
		_ = append(e[:kafkaValueSize-1], '}')
	})},
	{"random", cycle(func(v []byte) { _, _ = rand.Read(v) })},
}

// kafkaDistinctValues is how many values json and random cycle through.
const kafkaDistinctValues = 1 << 16

// cycle returns a value function over kafkaDistinctValues values filled by
// fill, made on first use.
func cycle(fill func(v []byte)) func(int) []byte {
	var once sync.Once
	var all []byte
	return func(i int) []byte {
		once.Do(func() {
			all = make([]byte, kafkaDistinctValues*kafkaValueSize)
			for j := 0; j < kafkaDistinctValues; j++ {
				fill(all[j*kafkaValueSize : (j+1)*kafkaValueSize])
			}
		})
		j := i % kafkaDistinctValues * kafkaValueSize
		return all[j : j+kafkaValueSize : j+kafkaValueSize]
	}
}

// kafkaProduce creates topic and fills it with n records over keys keys,
// each with an ackwise-event-id header and a value of payload p, outside
// the timer.
func kafkaProduce(b fataler, brokers []string, topic string, partitions int32, n, keys int, p kafkaPayload) {
	b.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, 1, nil, topic); err != nil {
		b.Fatal(err)
	}
	var failed atomic.Value
	for i := 0; i < n; i++ {
		cl.Produce(ctx, &kgo.Record{
			Topic:   topic,
			Key:     []byte("key-" + strconv.Itoa(i%keys)),
			Value:   p.value(i),
			Headers: []kgo.RecordHeader{{Key: ackwise.HeaderEventID, Value: []byte("ev-" + strconv.Itoa(i))}, {Key: "seq", Value: []byte(strconv.Itoa(i))}},
		}, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.Store(err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	// Every variant starts from a collected heap: none inherits a larger
	// heap goal (fewer collections) from the variant that ran before it.
	runtime.GC()
}

// kafkaFilledTopic starts a cluster with a topic of b.N records of payload
// p over kafkaPartitions partitions and kafkaKeys keys, then starts the
// timer.
func kafkaFilledTopic(b *testing.B, prefix string, p kafkaPayload) (brokers []string, topic string) {
	b.Helper()
	brokers = kafkaCluster(b)
	topic = kafkaName(prefix)
	kafkaProduce(b, brokers, topic, kafkaPartitions, b.N, kafkaKeys, p)
	b.ReportAllocs()
	b.ResetTimer()
	return brokers, topic
}

// cpuNow is the CPU time (user and system) this process used so far. When
// the broker runs in the process (the default), it is the CPU one record
// costs the client and the broker together.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// gcCycles is the number of garbage collections so far.
func gcCycles() uint32 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.NumGC
}

// machineBusy is the CPU time all processes on the machine used so far
// (every core's user, system, interrupt and steal time in /proc/stat), or
// 0 where there is no /proc/stat.
func machineBusy() time.Duration {
	f, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(f), "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0
	}
	var ticks int64
	for i, f := range fields[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseInt(f, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / clockTicks)
}

// clockTicks is the unit of /proc/stat and /proc/<pid>/stat (USER_HZ),
// 100 on Linux.
const clockTicks = 100

// brokerCPU is the CPU time the broker's process used so far when it runs
// in a process of its own (kfakeProcess), or 0.
func brokerCPU() time.Duration {
	pid := kfakePID.Load()
	if pid == 0 {
		return 0
	}
	return procCPU(int(pid))
}

// procCPU is the CPU time (user and system) process pid used so far, from
// /proc/<pid>/stat, or 0 where that cannot be read.
func procCPU(pid int) time.Duration {
	f, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's closing parenthesis; utime and
	// stime are the 12th and 13th of them.
	_, rest, _ := strings.Cut(string(f), ") ")
	fields := strings.Fields(rest)
	if len(fields) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(fields[11], 10, 64)
	st, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(u+st) * (time.Second / clockTicks)
}

// meter is where a consume run started: the wall clock, the process's CPU
// time, the garbage collections, the machine's busy time and the broker
// process's CPU time.
type meter struct {
	start  time.Time
	cpu    time.Duration
	gcs    uint32
	busy   time.Duration
	broker time.Duration // -1: the broker runs in this process
}

func startMeter() meter {
	broker := time.Duration(-1)
	if kfakePID.Load() != 0 {
		broker = brokerCPU()
	}
	return meter{time.Now(), cpuNow(), gcCycles(), machineBusy(), broker}
}

// report reports msgs/s, the process's CPU per record and the garbage
// collections since m.
func (m meter) report(b *testing.B) {
	wall := time.Since(m.start)
	b.ReportMetric(float64(b.N)/wall.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpuNow()-m.cpu)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(gcCycles()-m.gcs), "gcs")
	if m.busy > 0 {
		b.ReportMetric(float64(machineBusy()-m.busy)/float64(wall), "busy-cores")
	}
	if m.broker >= 0 {
		b.ReportMetric(float64(brokerCPU()-m.broker)/float64(b.N), "broker-cpu-ns/op")
	}
}

// BenchmarkKafkaConsumeCommit consumes b.N records with a no-op handler and
// commits them, side by side in one invocation: the raw franz-go
// poll/handle/commit loop (the ceiling), the ackwise source driven directly,
// the ackwise engine on the source (what users run), and Watermill's Kafka
// subscriber. Each op is one record; joining the group and the final commit
// are inside the timer for all.
//
// The first three run in ABBA order (raw, source, engine, engine, source,
// raw; the second runs are named with #01): a variant is faster when it runs
// later in a process (its memory is already mapped, the heap already grown),
// and the mirrored order gives each the same share of early and late
// positions. Compare the mean of a variant's two runs.
//
// All of it runs once per payload (see kafkaPayloads), the outer level of
// the names: payload=zeros/raw-franz-go, and so on.
func BenchmarkKafkaConsumeCommit(b *testing.B) {
	order := []string{"raw-franz-go", "ackwise-source", "ackwise-engine", "ackwise-engine", "ackwise-source", "raw-franz-go", "watermill-kafka"}
	run := map[string]func(*testing.B, kafkaPayload){
		"raw-franz-go":    consumeRaw,
		"ackwise-source":  consumeSource,
		"ackwise-engine":  consumeEngine,
		"watermill-kafka": consumeWatermill,
	}
	runPayloads(b, order, run)
}

// runPayloads runs the variants in order, as named in run, once per
// payload: payload=zeros/raw-franz-go, and so on.
func runPayloads(b *testing.B, order []string, run map[string]func(*testing.B, kafkaPayload)) {
	for _, p := range kafkaPayloads {
		b.Run("payload="+p.name, func(b *testing.B) {
			for _, name := range order {
				b.Run(name, func(b *testing.B) { run[name](b, p) })
			}
		})
	}
}

// consumeRaw is the raw franz-go poll/handle/commit loop: the ceiling.
func consumeRaw(b *testing.B, p kafkaPayload) {
	brokers, topic := kafkaFilledTopic(b, "raw", p)
	mt := startMeter()
	var sink int
	rawLoop(b, b.N, brokers, topic, func(r *kgo.Record) { sink += len(r.Value) })
	mt.report(b)
	_ = sink
}

// rawLoop consumes n records of topic in group topic+"-g": poll, call
// each on every record, commit what was polled (synchronously).
func rawLoop(b fataler, n int, brokers []string, topic string, each func(*kgo.Record)) {
	// The same isolation level as the ackwise source (read_committed):
	// kfake serves it more slowly than read_uncommitted, and the ratio
	// is about the client side.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(topic+"-g"), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for got := 0; got < n; {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			b.Fatal(err)
		}
		fs.EachRecord(each)
		got += fs.NumRecords()
		if err := cl.CommitUncommittedOffsets(ctx); err != nil {
			b.Fatal(err)
		}
	}
	cl.Close()
}

// kafkaTimedSource fills a topic with b.N records of payload p, then starts
// the timer and the meter and opens an ackwise source on the topic: opening
// it (joining the group) is timed, as for every variant.
func kafkaTimedSource(b *testing.B, prefix string, p kafkaPayload) (*kafka.Source, meter) {
	b.Helper()
	brokers, topic := kafkaFilledTopic(b, prefix, p)
	mt := startMeter()
	src, err := kafka.NewSource(context.Background(), kafka.SourceConfig{ClientConfig: kafka.ClientConfig{Brokers: brokers}, Topic: topic, Group: topic + "-g"})
	if err != nil {
		b.Fatal(err)
	}
	return src, mt
}

// consumeSource drives the ackwise source directly: Receive, Ack, Recycle.
func consumeSource(b *testing.B, p kafkaPayload) {
	src, mt := kafkaTimedSource(b, "src", p)
	sourceLoop(b, src, b.N)
	mt.report(b)
}

// sourceLoop receives n messages from src, acks and recycles each, and
// closes src.
func sourceLoop(b fataler, src *kafka.Source, n int) {
	ctx := context.Background()
	buf := make([]*ackwise.Message, 64)
	var sink int
	for got := 0; got < n; {
		k, err := src.Receive(ctx, buf)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range buf[:k] {
			sink += len(m.Payload)
			if err := src.Ack(ctx, m); err != nil {
				b.Fatal(err)
			}
			src.Recycle(m)
		}
		got += k
	}
	if err := src.Close(); err != nil {
		b.Fatal(err)
	}
	_ = sink
}

// consumeEngine runs the ackwise engine on the source: what users run.
func consumeEngine(b *testing.B, p kafkaPayload) {
	src, mt := kafkaTimedSource(b, "eng", p)
	h, all := countTo(b.N)
	runEngine(b, src, h, consumer.Config{}, all)
	mt.report(b)
}

// consumeWatermill is Watermill's Kafka subscriber (Sarama).
func consumeWatermill(b *testing.B, p kafkaPayload) {
	brokers, topic := kafkaFilledTopic(b, "wm", p)
	mt := startMeter()
	scfg := wkafka.DefaultSaramaSubscriberConfig()
	scfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           wkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: scfg,
		ConsumerGroup:         topic + "-g",
	}, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		b.Fatal(err)
	}
	var sink int
	for n := 0; n < b.N; n++ {
		m := <-ch
		sink += len(m.Payload)
		m.Ack()
	}
	cancel()
	if err := sub.Close(); err != nil {
		b.Fatal(err)
	}
	mt.report(b)
	_ = sink
}

// countTo returns a no-op handler and a channel it closes when it has
// handled n messages.
func countTo(n int) (ackwise.Handler, chan struct{}) {
	var handled atomic.Int64
	all := make(chan struct{})
	return ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		if handled.Add(1) == int64(n) {
			close(all)
		}
		return nil
	}), all
}

// runEngine runs the ackwise engine on src until all is closed, then stops
// it and closes src (the final commit).
func runEngine(b fataler, src adapters.Source, h ackwise.Handler, cfg consumer.Config, all chan struct{}) {
	b.Helper()
	c, err := consumer.New(src, h, cfg)
	if err != nil {
		b.Fatal(err)
	}
	runConsumer(b, c, src, all)
}

// runConsumer runs c on src until all is closed, then stops it and closes
// src (the final commit).
func runConsumer(b fataler, c *consumer.Consumer, src adapters.Source, all chan struct{}) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-all:
	case err := <-done:
		b.Fatalf("Run returned early: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	if err := src.Close(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkKafkaKeyParallel handles one partition of 10,000 records over
// 1,000 keys with a 2 ms handler, with one worker (sequential) and with 64
// workers (key-parallel within the partition), and checks per-key order.
// Each op is the whole batch.
func BenchmarkKafkaKeyParallel(b *testing.B) {
	const records, keys = 10000, 1000
	for _, workers := range []int{1, 64} {
		b.Run(fmt.Sprintf("workers-%d", workers), func(b *testing.B) {
			brokers := kafkaCluster(b)
			var elapsed time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				topic := kafkaName("kp")
				kafkaProduce(b, brokers, topic, 1, records, keys, kafkaPayloads[0])
				b.StartTimer()
				start := time.Now()
				src, err := kafka.NewSource(context.Background(), kafka.SourceConfig{ClientConfig: kafka.ClientConfig{Brokers: brokers}, Topic: topic, Group: topic + "-g"})
				if err != nil {
					b.Fatal(err)
				}
				var mu sync.Mutex
				last := make(map[string]int, keys)
				var outOfOrder, n atomic.Int64
				all := make(chan struct{})
				h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
					time.Sleep(2 * time.Millisecond)
					seq, _ := strconv.Atoi(m.Headers.Get("seq"))
					mu.Lock()
					if prev, ok := last[m.Key]; ok && seq < prev {
						outOfOrder.Add(1)
					}
					last[m.Key] = seq
					mu.Unlock()
					if n.Add(1) == records {
						close(all)
					}
					return nil
				})
				runEngine(b, src, h, consumer.Config{Concurrency: workers}, all)
				elapsed += time.Since(start)
				if o := outOfOrder.Load(); o != 0 {
					b.Fatalf("%d records handled out of per-key order", o)
				}
			}
			b.ReportMetric(float64(records*b.N)/elapsed.Seconds(), "msgs/s")
		})
	}
}

package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/gcppubsub"
	"github.com/ackwise/ackwise/consumer"
)

// Pub/Sub benchmarks run against pstest, Google's fake, served by this
// binary re-executed as a child process, so that the client's CPU time
// (getrusage of this process) and allocations are the client's alone.
// pstest hands each streaming-pull stream one message per 10 ms tick, which
// bounds throughput (about 100 msgs/s a stream): they measure cost, not
// speed.
//
//	go test -run '^$' -bench 'PubSubConsume' -benchtime 2000x -count 3 -timeout 30m .
const (
	pstestChildEnv = "ACKWISE_BENCH_PSTEST_CHILD"
	psProject      = "bench"
	psBodySize     = 100
	// psStreams is the number of streaming-pull streams each variant opens
	// (ReceiveSettings.NumGoroutines; gcppubsub.Config.Streams).
	psStreams = 4
	// psOutstanding is the flow control of each variant: the source's
	// default.
	psOutstanding = gcppubsub.DefaultMaxOutstandingMessages
)

// pstestPID is the process ID of the running pstest process, 0 when there
// is none.
var pstestPID atomic.Int64

// servePstest serves pstest until SIGTERM, printing "READY <addr>" once it
// listens.
func servePstest() int {
	srv := pstest.NewServer()
	fmt.Println("READY", srv.Addr)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	srv.Close()
	return 0
}

// psClient opens a client on the pstest at addr.
func psClient(b *testing.B, addr string) *pubsub.Client {
	b.Helper()
	c, err := pubsub.NewClient(context.Background(), psProject, option.WithEndpoint(addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())), option.WithTelemetryDisabled())
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// psFilled creates a topic and its subscription named for name on the
// pstest at addr and publishes n messages to it (100 bytes, an event ID
// each), and returns the subscription's ID.
func psFilled(b *testing.B, addr, name string, n int) string {
	b.Helper()
	ctx := context.Background()
	c := psClient(b, addr)
	defer c.Close()
	id := fmt.Sprintf("%s-%d", name, time.Now().UnixNano())
	topic := "projects/" + psProject + "/topics/" + id
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		b.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: "projects/" + psProject + "/subscriptions/" + id, Topic: topic, AckDeadlineSeconds: 60}); err != nil {
		b.Fatal(err)
	}
	pub := c.Publisher(topic)
	defer pub.Stop()
	body := make([]byte, psBodySize)
	results := make([]*pubsub.PublishResult, n)
	for i := range results {
		results[i] = pub.Publish(ctx, &pubsub.Message{Data: body, Attributes: map[string]string{ackwise.HeaderEventID: fmt.Sprint("e", i)}})
	}
	for _, r := range results {
		if _, err := r.Get(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return id
}

// psMeter is where a consume run started: the wall clock, this process's
// CPU time and allocations, the garbage collections and pstest's CPU time.
type psMeter struct {
	start  time.Time
	cpu    time.Duration
	allocs uint64
	gcs    uint32
	pstest time.Duration
}

func startPsMeter() psMeter {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return psMeter{time.Now(), cpuNow(), ms.Mallocs, ms.NumGC, procCPU(int(pstestPID.Load()))}
}

// report reports msgs/s, the client's CPU and allocations per message, the
// garbage collections, and pstest's CPU per message.
func (m psMeter) report(b *testing.B) {
	wall := time.Since(m.start)
	cpu := cpuNow() - m.cpu
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	n := float64(b.N)
	b.ReportMetric(n/wall.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpu)/n, "cpu-ns/msg")
	b.ReportMetric(float64(ms.Mallocs-m.allocs)/n, "allocs/msg")
	b.ReportMetric(float64(ms.NumGC-m.gcs), "gcs")
	b.ReportMetric(float64(procCPU(int(pstestPID.Load()))-m.pstest)/n, "pstest-cpu-ns/msg")
}

// BenchmarkPubSubConsume consumes b.N messages from a backlog of b.N with a
// no-op handler, over psStreams streaming-pull streams and a flow control
// of psOutstanding, side by side in one invocation: the raw v2 client's
// Receive callback that acks each message (the floor), the ackwise source
// driven directly (Receive, then Ack each), and the ackwise engine on the
// source (consumer.Config{} defaults), in ABBA order (see
// BenchmarkKafkaConsumeCommit; the second runs are named #01). Each op is
// one message; the client's start and stop are inside the timer for all.
func BenchmarkPubSubConsume(b *testing.B) {
	addr := childProcess(b, pstestChildEnv, &pstestPID)
	order := []string{"raw-receive", "ackwise-source", "ackwise-engine", "ackwise-engine", "ackwise-source", "raw-receive"}
	run := map[string]func(*testing.B, string){
		"raw-receive":    psRaw,
		"ackwise-source": psSource,
		"ackwise-engine": psEngine,
	}
	for _, name := range order {
		b.Run(name, func(b *testing.B) { run[name](b, addr) })
	}
}

// psRaw is the raw v2 Receive callback loop: ack each message, stop at b.N.
func psRaw(b *testing.B, addr string) {
	sub := psFilled(b, addr, "raw", b.N)
	mt := startPsMeter()
	c := psClient(b, addr)
	s := c.Subscriber(sub)
	s.ReceiveSettings.NumGoroutines = psStreams
	s.ReceiveSettings.MaxOutstandingMessages = psOutstanding
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	err := s.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		if n.Add(1) == int64(b.N) {
			cancel()
		}
	})
	cancel()
	if cerr := c.Close(); err == nil {
		err = cerr
	}
	mt.report(b)
	if err != nil {
		b.Fatal(err)
	}
}

// psOpen opens the ackwise source on sub, with psStreams streams and the
// source's defaults otherwise (no dead-letter topic: nothing fails).
func psOpen(b *testing.B, addr, sub string) *gcppubsub.Source {
	b.Helper()
	src, err := gcppubsub.NewSource(context.Background(), gcppubsub.Config{
		Project: psProject, Subscription: sub, Emulator: addr, Streams: psStreams,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	return src
}

// psSource drives the ackwise source directly: Receive up to 64, Ack each.
func psSource(b *testing.B, addr string) {
	sub := psFilled(b, addr, "src", b.N)
	mt := startPsMeter()
	src := psOpen(b, addr, sub)
	ctx := context.Background()
	buf := make([]*ackwise.Message, consumer.DefaultReceiveBatch)
	for n := 0; n < b.N; {
		k, err := src.Receive(ctx, buf)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range buf[:k] {
			if err := src.Ack(ctx, m); err != nil {
				b.Fatal(err)
			}
		}
		n += k
	}
	err := src.Close()
	mt.report(b)
	if err != nil {
		b.Fatal(err)
	}
}

// psEngine runs the ackwise engine on the source until it has handled b.N
// messages, then stops it and closes the source.
func psEngine(b *testing.B, addr string) {
	sub := psFilled(b, addr, "eng", b.N)
	mt := startPsMeter()
	src := psOpen(b, addr, sub)
	h, all := countTo(b.N)
	runEngine(b, src, h, consumer.Config{}, all)
	mt.report(b)
}

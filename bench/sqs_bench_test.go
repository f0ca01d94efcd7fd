package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/sqs"
	"github.com/ackwise/ackwise/adapters/sqs/sqstest"
	"github.com/ackwise/ackwise/consumer"
)

// SQS benchmarks run against local-aws-sqs, a Node process (started once
// per benchmark binary from adapters/sqs/testdata/emulator, or the emulator
// at ACKWISE_SQS_ENDPOINT). The emulator bounds throughput, so they measure
// cost instead: API calls per message and the client's CPU per message (the
// emulator's CPU is its own process's, reported apart).
//
//	go test -run '^$' -bench 'SQSConsume' -benchtime 10000x -count 5 -timeout 30m .
const (
	sqsBodySize = 100
	// sqsSpare is the messages the engine's queue holds beyond the b.N it
	// handles. local-aws-sqs answers a long poll only once it has
	// MaxNumberOfMessages or the wait (20 s) ended, where AWS answers as
	// soon as there are some: the engine's concurrent polls, which ask for
	// what its window has room for, would otherwise end the backlog with a
	// poll holding its last few messages for 20 s. The spare messages
	// left at the stop are handed back (visibility 0) with the source's
	// Close: a call or two, in calls/msg.
	sqsSpare = 100
)

var (
	sqsOnce     sync.Once
	sqsEndpoint string
	sqsNodePID  int // the emulator's process, 0 when it is not ours
	sqsStop     = func() {}
	sqsErr      error
)

// sqsEmulator returns the endpoint of the SQS emulator, starting it on
// first use (stopped by TestMain). It points the AWS SDK's default chain at
// dummy credentials and no shared files: the benchmarks never reach AWS.
func sqsEmulator(b *testing.B) string {
	b.Helper()
	sqsOnce.Do(func() {
		sqstest.Isolate()
		if sqsEndpoint = os.Getenv(sqstest.EnvEndpoint); sqsEndpoint == "" {
			sqsEndpoint, sqsNodePID, sqsStop, sqsErr = sqstest.StartProcess()
		}
	})
	if sqsErr != nil {
		b.Fatal(sqsErr)
	}
	return sqsEndpoint
}

// sqsCalls counts the consuming API calls a client sends (every HTTP
// request, retries included), by the operation in its X-Amz-Target header.
type sqsCalls struct {
	next                        http.RoundTripper
	receive, delete, visibility atomic.Int64
}

func (c *sqsCalls) RoundTrip(r *http.Request) (*http.Response, error) {
	switch r.Header.Get("X-Amz-Target") {
	case "AmazonSQS.ReceiveMessage":
		c.receive.Add(1)
	case "AmazonSQS.DeleteMessage", "AmazonSQS.DeleteMessageBatch":
		c.delete.Add(1)
	case "AmazonSQS.ChangeMessageVisibility", "AmazonSQS.ChangeMessageVisibilityBatch":
		c.visibility.Add(1)
	}
	return c.next.RoundTrip(r)
}

// sqsQueue is one benchmark's queue, filled, and the AWS configuration
// whose HTTP client counts the calls.
type sqsQueue struct {
	endpoint string
	url      string
	aws      aws.Config
	client   *awssqs.Client
	calls    *sqsCalls
}

// sqsFilledQueue creates a queue (visibility timeout 30 s), sends it n
// messages of sqsBodySize bytes with two message attributes
// (ackwise-event-id, seq), collects the heap and resets the timer: the
// consumer then starts on a backlog of n. The queue is deleted when b
// ends.
func sqsFilledQueue(b *testing.B, prefix string, n int) *sqsQueue {
	b.Helper()
	endpoint := sqsEmulator(b)
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		b.Fatal(err)
	}
	// The SDK's own transport (its connection pool sizes, and any CA
	// bundle the environment names), counted.
	bc, ok := cfg.HTTPClient.(*awshttp.BuildableClient)
	if !ok {
		b.Fatalf("the AWS configuration's HTTP client is a %T", cfg.HTTPClient)
	}
	calls := &sqsCalls{next: bc.GetTransport()}
	cfg.HTTPClient = &http.Client{Transport: calls}
	client := awssqs.NewFromConfig(cfg, func(o *awssqs.Options) { o.BaseEndpoint = aws.String(endpoint) })
	name := fmt.Sprintf("bench-%s-%d", prefix, time.Now().UnixNano())
	out, err := client.CreateQueue(ctx, &awssqs.CreateQueueInput{
		QueueName:  aws.String(name),
		Attributes: map[string]string{string(types.QueueAttributeNameVisibilityTimeout): "30"},
	})
	if err != nil {
		b.Fatal(err)
	}
	q := &sqsQueue{endpoint: endpoint, url: *out.QueueUrl, aws: cfg, client: client, calls: calls}
	b.Cleanup(func() {
		_, _ = client.DeleteQueue(context.Background(), &awssqs.DeleteQueueInput{QueueUrl: out.QueueUrl})
	})
	body := strings.Repeat("x", sqsBodySize)
	var (
		wg   sync.WaitGroup
		next atomic.Int64
		fail atomic.Value
	)
	for range 4 {
		wg.Go(func() {
			for {
				first := int(next.Add(10)) - 10
				if first >= n {
					return
				}
				var entries []types.SendMessageBatchRequestEntry
				for i := first; i < min(first+10, n); i++ {
					seq := strconv.Itoa(i)
					entries = append(entries, types.SendMessageBatchRequestEntry{
						Id:          aws.String(seq),
						MessageBody: aws.String(body),
						MessageAttributes: map[string]types.MessageAttributeValue{
							ackwise.HeaderEventID: {DataType: aws.String("String"), StringValue: aws.String(name + "-" + seq)},
							"seq":                 {DataType: aws.String("String"), StringValue: aws.String(seq)},
						},
					})
				}
				res, err := client.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: out.QueueUrl, Entries: entries})
				if err == nil && len(res.Failed) > 0 {
					err = fmt.Errorf("send: %d entries failed: %s", len(res.Failed), aws.ToString(res.Failed[0].Code))
				}
				if err != nil {
					fail.CompareAndSwap(nil, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := fail.Load().(error); err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	return q
}

// sqsMeter is where a consume run started: the wall clock, the process's
// CPU time, the garbage collections, the emulator's CPU time and the calls
// so far.
type sqsMeter struct {
	q                           *sqsQueue
	start                       time.Time
	cpu, node                   time.Duration
	gcs                         uint32
	receive, delete, visibility int64
}

func (q *sqsQueue) startMeter() sqsMeter {
	return sqsMeter{q, time.Now(), cpuNow(), emulatorCPU(), gcCycles(),
		q.calls.receive.Load(), q.calls.delete.Load(), q.calls.visibility.Load()}
}

// emulatorCPU is the CPU time the emulator's process used so far, or 0
// when it is not this binary's.
func emulatorCPU() time.Duration {
	if sqsNodePID == 0 {
		return 0
	}
	return procCPU(sqsNodePID)
}

// report reports msgs/s, the client's CPU per message (the whole process:
// the emulator is another), the emulator's, the garbage collections, and
// the consuming API calls per message, in all and by kind.
func (m sqsMeter) report(b *testing.B) {
	wall := time.Since(m.start)
	n := float64(b.N)
	r := m.q.calls.receive.Load() - m.receive
	d := m.q.calls.delete.Load() - m.delete
	v := m.q.calls.visibility.Load() - m.visibility
	b.ReportMetric(n/wall.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpuNow()-m.cpu)/n, "cpu-ns/msg")
	if m.node > 0 {
		b.ReportMetric(float64(emulatorCPU()-m.node)/n, "emulator-cpu-ns/msg")
	}
	b.ReportMetric(float64(gcCycles()-m.gcs), "gcs")
	b.ReportMetric(float64(r+d+v)/n, "calls/msg")
	b.ReportMetric(float64(r)/n, "receives/msg")
	b.ReportMetric(float64(d)/n, "deletes/msg")
	b.ReportMetric(float64(v)/n, "visibility-changes/msg")
}

// sqsReceiveInput is the receive every variant sends: up to max messages,
// a 20 s long poll, every message attribute and system attribute (what the
// ackwise source asks for, so that the responses weigh the same).
func sqsReceiveInput(url string, max int32) *awssqs.ReceiveMessageInput {
	return &awssqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(url),
		MaxNumberOfMessages:         max,
		WaitTimeSeconds:             20,
		AttributeNames:              []types.QueueAttributeName{types.QueueAttributeNameAll},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		MessageAttributeNames:       []string{"All"},
	}
}

// BenchmarkSQSConsume consumes b.N messages from a backlog of b.N with a
// no-op handler, side by side in one invocation: a raw aws-sdk-go-v2 loop
// that receives 10 and deletes them with one DeleteMessageBatch (the
// floor), the ackwise engine on the SQS source (consumer.Config{}
// defaults; the source's defaults: 20 s long poll, deletes batched with a
// 5 ms linger), the ackwise source driven as the raw loop is (Receive of
// 10, AckBatch of them), and a loop that receives one message per call
// and deletes it alone (Watermill's SQS subscriber's behaviour, whose
// module is not available here). Each op is one message; calls/msg counts
// receives, deletes and visibility changes (HTTP requests, retries
// included). Raw, source and engine run in ABBA order (see
// BenchmarkKafkaConsumeCommit; the second runs are named #01), the
// one-per-call loop last.
func BenchmarkSQSConsume(b *testing.B) {
	order := []string{"raw-batch", "ackwise-source", "ackwise-engine", "ackwise-engine", "ackwise-source", "raw-batch", "one-per-call"}
	run := map[string]func(*testing.B){
		"raw-batch":      sqsRawBatch,
		"ackwise-source": sqsSource,
		"ackwise-engine": sqsEngine,
		"one-per-call":   sqsOnePerCall,
	}
	for _, name := range order {
		b.Run(name, run[name])
	}
}

// sqsRawBatch receives up to 10 messages per call and deletes each
// receive's messages with one DeleteMessageBatch.
func sqsRawBatch(b *testing.B) {
	q := sqsFilledQueue(b, "raw", b.N)
	mt := q.startMeter()
	ctx := context.Background()
	in := sqsReceiveInput(q.url, 10)
	var (
		entries []types.DeleteMessageBatchRequestEntry
		sink    int
	)
	for n := 0; n < b.N; {
		out, err := q.client.ReceiveMessage(ctx, in)
		if err != nil {
			b.Fatal(err)
		}
		if len(out.Messages) == 0 {
			continue
		}
		entries = entries[:0]
		for i, m := range out.Messages {
			sink += len(aws.ToString(m.Body))
			entries = append(entries, types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle})
		}
		res, err := q.client.DeleteMessageBatch(ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: in.QueueUrl, Entries: entries})
		if err == nil && len(res.Failed) > 0 {
			err = fmt.Errorf("delete: %d entries failed: %s", len(res.Failed), aws.ToString(res.Failed[0].Code))
		}
		if err != nil {
			b.Fatal(err)
		}
		n += len(out.Messages)
	}
	mt.report(b)
	_ = sink
}

// sqsOnePerCall receives one message per call and deletes it with its own
// DeleteMessage call.
func sqsOnePerCall(b *testing.B) {
	q := sqsFilledQueue(b, "one", b.N)
	mt := q.startMeter()
	ctx := context.Background()
	in := sqsReceiveInput(q.url, 1)
	var sink int
	for n := 0; n < b.N; {
		out, err := q.client.ReceiveMessage(ctx, in)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range out.Messages {
			sink += len(aws.ToString(m.Body))
			if _, err := q.client.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: in.QueueUrl, ReceiptHandle: m.ReceiptHandle}); err != nil {
				b.Fatal(err)
			}
			n++
		}
	}
	mt.report(b)
	_ = sink
}

// sqsOpenSource opens the ackwise SQS source on q, with the source's
// defaults.
func sqsOpenSource(b *testing.B, q *sqsQueue) *sqs.Source {
	return sqsOpenSourcePollers(b, q, 0)
}

// sqsOpenSourcePollers opens the ackwise SQS source on q with pollers
// concurrent receives (0: the default), its other settings the defaults.
func sqsOpenSourcePollers(b *testing.B, q *sqsQueue, pollers int) *sqs.Source {
	b.Helper()
	src, err := sqs.NewSource(context.Background(), sqs.Config{
		QueueURL:   q.url,
		Connection: sqs.Connection{Endpoint: q.endpoint, AWS: &q.aws},
		Pollers:    pollers,
	})
	if err != nil {
		b.Fatal(err)
	}
	return src
}

// sqsSource drives the ackwise source directly, as the raw batch loop does:
// Receive up to 10, then AckBatch them (one DeleteMessageBatch).
func sqsSource(b *testing.B) {
	q := sqsFilledQueue(b, "src", b.N)
	mt := q.startMeter()
	src := sqsOpenSource(b, q)
	ctx := context.Background()
	buf := make([]*ackwise.Message, 10)
	errs := make([]error, 10)
	for n := 0; n < b.N; {
		k, err := src.Receive(ctx, buf)
		if err == nil {
			src.AckBatch(ctx, buf[:k], errs[:k])
			err = errors.Join(errs[:k]...)
		}
		if err != nil {
			b.Fatal(err)
		}
		n += k
	}
	err := src.Close() // sends the deletes still lingering
	mt.report(b)
	if err != nil {
		b.Fatal(err)
	}
}

// sqsEngine runs the ackwise engine on the SQS source until it has handled
// b.N messages, then stops it and closes the source (its pending deletes
// sent).
func sqsEngine(b *testing.B) {
	q := sqsFilledQueue(b, "eng", b.N+sqsSpare)
	mt := q.startMeter()
	src := sqsOpenSource(b, q)
	h, all := countTo(b.N)
	runEngine(b, src, h, consumer.Config{}, all)
	mt.report(b)
}

// BenchmarkSQSPollers runs the ackwise engine (defaults) on the SQS source
// with 1, 2 and 4 concurrent receives (sqs.Config.Pollers) on a backlog of
// b.N, as BenchmarkSQSConsume's ackwise-engine: what more pollers buy in
// msgs/s against the emulator, and cost in client CPU per message.
//
//	go test -run '^$' -bench 'SQSPollers' -benchtime 2000x -count 3 .
func BenchmarkSQSPollers(b *testing.B) {
	for _, n := range []int{1, 2, 4} {
		b.Run("pollers="+strconv.Itoa(n), func(b *testing.B) {
			q := sqsFilledQueue(b, "pollers", b.N+sqsSpare)
			mt := q.startMeter()
			src := sqsOpenSourcePollers(b, q, n)
			h, all := countTo(b.N)
			runEngine(b, src, h, consumer.Config{}, all)
			mt.report(b)
		})
	}
}

// BenchmarkSQSIdle runs each consumer on an empty queue, waiting in long
// polls, and reports the client's CPU per second of that wait (cpu-µs/s)
// and its API calls per second: a raw aws-sdk-go-v2 loop of 20 s long
// polls, and the ackwise engine on the SQS source (defaults). Each op is
// one second.
//
//	go test -run '^$' -bench 'SQSIdle' -benchtime 5x -count 5 .
func BenchmarkSQSIdle(b *testing.B) {
	b.Run("raw-long-poll", func(b *testing.B) {
		q := sqsFilledQueue(b, "idle-raw", 0)
		mt := q.startMeter()
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(b.N)*time.Second)
		defer cancel()
		in := sqsReceiveInput(q.url, 10)
		for ctx.Err() == nil {
			out, err := q.client.ReceiveMessage(ctx, in)
			if err == nil && len(out.Messages) > 0 {
				b.Fatal("a message in the empty queue")
			}
		}
		mt.reportIdle(b)
	})
	b.Run("ackwise-engine", func(b *testing.B) {
		q := sqsFilledQueue(b, "idle-eng", 0)
		mt := q.startMeter()
		src := sqsOpenSource(b, q)
		h, _ := countTo(1)
		stop := make(chan struct{})
		time.AfterFunc(time.Duration(b.N)*time.Second, func() { close(stop) })
		runEngine(b, src, h, consumer.Config{}, stop)
		mt.reportIdle(b)
	})
}

// reportIdle reports the client's and the emulator's CPU per second of
// wall time, and the consuming API calls per second, since m.
func (m sqsMeter) reportIdle(b *testing.B) {
	secs := time.Since(m.start).Seconds()
	calls := m.q.calls.receive.Load() - m.receive + m.q.calls.delete.Load() - m.delete + m.q.calls.visibility.Load() - m.visibility
	b.ReportMetric(float64(cpuNow()-m.cpu)/1e3/secs, "cpu-µs/s")
	if m.node > 0 {
		b.ReportMetric(float64(emulatorCPU()-m.node)/1e3/secs, "emulator-cpu-µs/s")
	}
	b.ReportMetric(float64(calls)/secs, "calls/s")
}
